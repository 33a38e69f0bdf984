//! The HTTP layer, one module per resource: extract, validate, call the store, map errors.
//!
//! Each resource module exposes `router() -> OpenApiRouter<AppState>`; `crate::router` puts
//! them together.

pub mod extract;
pub mod health;

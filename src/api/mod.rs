//! The HTTP layer, one module per resource: extract, validate, call the store, map errors.
//!
//! Each resource module exposes `router() -> OpenApiRouter<AppState>`; `crate::router` puts
//! them together. The shared conventions of every resource live beside them:
//! [`extract`] (bodies, paths and queries; a parameter a route does not take is 400),
//! [`query_values`] (what a query value must be, and the wording of one that is not),
//! [`list_query`] (the query of every listing, checked before the handler runs),
//! [`blocking`] (`?index=&wait=` and `X-Index`), [`reads`] (the mirror or the store, and
//! `?consistent=true`), [`paging`] (`limit`, `continue`) and [`preconditions`] (`ETag`,
//! `If-Match`); [`crate::answers`] keeps answers built from the mirror until what they read
//! changes.

pub mod blocking;
pub mod daemonsets;
pub mod events;
pub mod extract;
pub mod health;
pub mod labels;
pub mod leader;
pub mod list_query;
pub mod nodes;
pub mod observability;
pub mod p2_labels;
pub mod paging;
pub mod pod_health;
pub mod pods;
pub mod preconditions;
pub mod query_values;
pub mod rcs;
pub mod reads;
pub mod reality;
pub mod responses;
pub mod rolls;
pub mod watch;

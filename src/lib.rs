//! p2-apiserver: an HTTP/JSON control plane for P2-style deployments.
//!
//! # Layout
//! - [`model`]: stored document types (manifests, RCs, rolls, daemon sets, health, audit)
//!   and the pure domain rules around them.
//! - [`store`]: the Consul-shaped KV trait and its SQLite and Consul backends.

pub mod model;
pub mod store;

//! p2-apiserver: an HTTP/JSON control plane for P2-style deployments.
//!
//! # Layout
//! - [`store`]: the Consul-shaped KV trait and its SQLite and Consul backends.

pub mod store;

//! p2-apiserver: an HTTP/JSON control plane for P2-style deployments.
//!
//! # Layout
//! - [`labels`]: label types, label validity rules and Kubernetes-style selectors.
//! - [`store`]: the Consul-shaped KV trait and its SQLite and Consul backends.

pub mod labels;
pub mod store;

//! The key-value engine: the conformance suite on every backend, and each backend's own tests.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod consul_http;
mod sqlite_store;

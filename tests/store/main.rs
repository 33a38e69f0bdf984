//! The key-value engine: the conformance suite on every backend, and each backend's own tests.

mod conformance;
mod consul_budget;
mod consul_http;
mod fake_agent;
mod mirror;
mod sqlite_store;
#[path = "../support/mod.rs"]
mod support;

//! End to end: the real binary, the simulator and the API together.

mod metrics;
mod scenarios;
#[path = "../support/mod.rs"]
mod support;
mod tls;

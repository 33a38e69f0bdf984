//! End to end: the real binary, the simulator and the API together.

#[path = "../support/mod.rs"]
mod support;

mod scenarios;

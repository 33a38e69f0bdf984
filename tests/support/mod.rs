//! What the test binaries share; each uses its own part.
#![allow(dead_code)]

pub mod api;
pub mod counting;
pub mod e2e;
pub mod fake_consul;
pub mod farms;
pub mod scrape;
pub mod severable;
pub mod switchable;
pub mod tls;

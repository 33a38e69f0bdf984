//! The REST API, driven in-process through the router (and over TCP where the listener matters).

mod auth;
mod blocking_spans;
mod compat_p2;
mod conditions;
mod contract;
mod daemonsets;
mod events;
mod http_basics;
mod labels;
mod metrics;
mod mirror_reads;
mod openapi;
mod p2_labels;
mod pods;
mod queries;
mod rcs;
mod reality;
mod rolls;
#[path = "../support/mod.rs"]
mod support;
mod tls;
mod validation;
mod watch;

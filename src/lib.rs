//! p2-apiserver: an HTTP/JSON control plane for P2-style deployments.
//!
//! # Layout
//! - [`config`]: the command line (clap), every flag also an environment variable.
//! - [`app`]: the shared state handlers reach ([`app::AppState`]); [`answers`]: the
//!   answers built from the mirror that it keeps until what they read changes.
//! - [`error`]: the one error type ([`error::ApiError`]) and the JSON error body.
//! - [`api`]: HTTP handlers, one module per resource, and the extractors they use.
//! - [`auth`]: bearer tokens, the role each operation needs, and the CORS origins.
//! - [`router`]: wires routes, the OpenAPI document, fallbacks and middleware.
//! - [`server`]: serves the router on a listener until shutdown.
//! - [`labels`]: label types, label validity rules and Kubernetes-style selectors.
//! - [`model`]: stored document types (manifests, RCs, rolls, daemon sets, health, audit)
//!   and the pure domain rules around them.
//! - [`kv`]: the key-value engine: the Consul-shaped trait, its SQLite and Consul backends,
//!   with no knowledge of P2.
//! - [`layout`]: P2's key layout, and the keys this server keeps beside P2's trees.
//! - [`store`]: P2's repositories over [`kv`] (RCs, rolls, daemon sets, labels, pods,
//!   health), in P2's key layout.
//! - [`state`]: the in-memory mirror of every P2 tree the server reads, fed by one watch
//!   per tree, with secondary indexes and the change stream behind `GET /api/v1/watch`.
//! - [`backoff`]: exponential backoff with jitter for anything that retries; [`interner`]:
//!   values shared by content, so that what a large fleet repeats is kept once.
//! - [`leader`]: leader election over a store session and lock; the leader runs the farms.
//! - [`farms`]: the RC, roll and daemon-set reconcilers, driven by the mirror.
//! - [`metrics`]: the Prometheus metrics, their names and the recorder `/metrics` renders;
//!   [`version`]: what the binary was built from; [`allocator`]: how soon the binaries give
//!   freed memory back to the OS.
//! - [`simulator`]: simulated nodes that act as node agents through the REST API, for the
//!   demo, the end-to-end tests and the benchmark.

pub mod allocator;
pub mod answers;
pub mod api;
pub mod app;
pub mod auth;
pub mod backoff;
pub mod config;
pub mod error;
pub mod farms;
pub mod interner;
pub mod kv;
pub mod labels;
pub mod layout;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod panics;
pub mod router;
pub mod server;
pub mod simulator;
pub mod state;
pub mod store;
pub mod version;

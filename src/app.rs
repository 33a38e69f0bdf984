//! What every request handler can reach, built once at start.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::kv::KvStore;

/// The server's long-lived dependencies. Each field says why handlers need it; anything added
/// here must be cheap to share, because every request holds a reference.
pub struct App {
    /// Where all state lives: Consul in production, the embedded SQLite store on one machine.
    /// A trait object so the same handlers run on either backend.
    pub store: Arc<dyn KvStore>,
    /// Cancelled when the server starts shutting down, so that blocking queries (which may
    /// wait up to 10 minutes) answer at once and graceful shutdown is not held up by them.
    pub shutdown: CancellationToken,
}

/// The state handed to the router: cloning it is one reference-count increment per request.
pub type AppState = Arc<App>;

impl App {
    /// The state for a server over `store` that is never told to shut down (tests).
    pub fn new(store: Arc<dyn KvStore>) -> AppState {
        Self::draining_on(store, CancellationToken::new())
    }

    /// The state for a server over `store` whose blocking queries end when `shutdown` is
    /// cancelled.
    pub fn draining_on(store: Arc<dyn KvStore>, shutdown: CancellationToken) -> AppState {
        Arc::new(App { store, shutdown })
    }
}

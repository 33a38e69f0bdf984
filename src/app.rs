//! What every request handler can reach, built once at start.

use std::sync::Arc;

use crate::store::KvStore;

/// The server's long-lived dependencies. Each field says why handlers need it; anything added
/// here must be cheap to share, because every request holds a reference.
pub struct App {
    /// Where all state lives: Consul in production, the embedded SQLite store on one machine.
    /// A trait object so the same handlers run on either backend.
    pub store: Arc<dyn KvStore>,
}

/// The state handed to the router: cloning it is one reference-count increment per request.
pub type AppState = Arc<App>;

impl App {
    /// The state for a server over `store`.
    pub fn new(store: Arc<dyn KvStore>) -> AppState {
        Arc::new(App { store })
    }
}

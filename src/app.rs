//! What every request handler can reach, built once at start.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::answers::Answers;
use crate::auth::Access;
use crate::kv::shared_listings::SharedListings;
use crate::kv::KvStore;
use crate::model::Limits;
use crate::state::{Mirror, MirrorConfig};
use crate::store::daemon_sets::DaemonSetStore;
use crate::store::health::HealthStore;
use crate::store::labels::LabelStore;
use crate::store::own_writes::OwnWrites;
use crate::store::pods::PodStore;
use crate::store::rcs::RcStore;
use crate::store::roll_creation::RollCreator;
use crate::store::rolls::RollStore;

/// The server's long-lived dependencies, and the P2 repositories over its store. Each field says why handlers need it; anything added
/// here must be cheap to share, because every request holds a reference.
pub struct App {
    /// Where all state lives: Consul in production, the embedded SQLite store on one machine.
    /// A trait object so the same handlers run on either backend. Built with
    /// [`App::serving`], it applies its successful writes to `mirror` at once
    /// ([`OwnWrites`]), so reads of the mirror see this server's own writes.
    pub store: Arc<dyn KvStore>,
    /// `store` for the reads that go through to it rather than to `mirror`
    /// (`?consistent=true`, or while the mirror cannot be trusted; [`crate::api::reads`]):
    /// concurrent listings of one prefix are shared, so that a crowd of such reads asks the
    /// store for each tree once at a time. Only those reads: the mirror, the farms and the
    /// election each need their own listings.
    pub store_reads: Arc<SharedListings>,
    /// Cancelled when the server starts shutting down, so that blocking queries (which may
    /// wait up to 10 minutes) answer at once and graceful shutdown is not held up by them.
    pub shutdown: CancellationToken,
    /// How long requests, probes and connections may take, so that a hung store or a silent
    /// client never holds the server's resources for good.
    pub limits: HttpLimits,
    /// The in-memory mirror of the store's P2 trees, so reads need not re-read whole trees;
    /// it is filled once started (`serve` starts it).
    pub mirror: Mirror,
    /// The bounds validation applies to what clients ask for (`--max-replicas`).
    pub validation: Limits,
    /// Who may call the API (`--auth-tokens`, `--cors-origin`); shared with the SIGHUP
    /// handler, which re-reads the tokens. The default lets every request through.
    pub access: Arc<Access>,
    /// Answers built from the mirror, served again while the trees they read are unchanged.
    pub answers: Answers,
}

/// The time and connection limits of the HTTP server (`--request-timeout` and its group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// The longest a request may be handled once its body is in; a blocking query gets its
    /// wait on top. Past it the client gets a 503.
    pub request_timeout: Duration,
    /// The longest `/readyz` waits for the store's answer before reporting not-ready.
    pub readiness_timeout: Duration,
    /// The longest a connection may go without a complete request head: a new connection
    /// until its first request's headers are in, a kept-alive one between two requests;
    /// and the longest an answer may wait on a client that takes none of it.
    pub header_read_timeout: Duration,
    /// The longest a request body may take to arrive in full.
    pub body_read_timeout: Duration,
    /// The most connections open at once; more are answered 503 at once and closed.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    /// The command line's defaults.
    fn default() -> Self {
        HttpLimits {
            request_timeout: Duration::from_secs(10),
            readiness_timeout: Duration::from_secs(2),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// The state handed to the router: cloning it is one reference-count increment per request.
pub type AppState = Arc<App>;

impl App {
    /// The state for a server over `store` with the default limits that is never told to
    /// shut down (tests).
    pub fn new(store: Arc<dyn KvStore>) -> AppState {
        Self::draining_on(store, CancellationToken::new())
    }

    /// The state for a server over `store` with the default limits, whose blocking queries
    /// end when `shutdown` is cancelled.
    pub fn draining_on(store: Arc<dyn KvStore>, shutdown: CancellationToken) -> AppState {
        let mirror = Mirror::new(store.clone(), MirrorConfig::default());
        Self::serving(
            store,
            mirror,
            shutdown,
            HttpLimits::default(),
            Limits::default(),
            Arc::default(),
        )
    }

    /// The state for a server over `store` that reads from `mirror` (a mirror of `store`,
    /// to be started by the caller) and applies its own writes to it.
    pub fn serving(
        store: Arc<dyn KvStore>,
        mirror: Mirror,
        shutdown: CancellationToken,
        limits: HttpLimits,
        validation: Limits,
        access: Arc<Access>,
    ) -> AppState {
        let store = OwnWrites::wrap(store, mirror.clone());
        Arc::new(App {
            store_reads: SharedListings::wrap(store.clone()),
            store,
            mirror,
            shutdown,
            limits,
            validation,
            access,
            answers: Answers::default(),
        })
    }

    /// Replication controllers.
    pub fn rcs(&self) -> RcStore {
        RcStore::new(self.store.clone())
    }

    /// Rolling updates.
    pub fn rolls(&self) -> RollStore {
        RollStore::new(self.store.clone())
    }

    /// Creates rolling updates, with their RCs, in one transaction.
    pub fn roll_creator(&self) -> RollCreator {
        RollCreator::new(self.store.clone())
    }

    /// Daemon sets and their status records.
    pub fn daemon_sets(&self) -> DaemonSetStore {
        DaemonSetStore::new(self.store.clone())
    }

    /// Label sets of every type.
    pub fn labels(&self) -> LabelStore {
        LabelStore::new(self.store.clone())
    }

    /// The intent and reality trees.
    pub fn pods(&self) -> PodStore {
        PodStore::new(self.store.clone())
    }

    /// Pods' health records.
    pub fn health(&self) -> HealthStore {
        HealthStore::new(self.store.clone())
    }
}

//! Whether a write a caller gave up on can still be applied: a store that queues writes (the
//! embedded store's writer, until its transaction began; Consul's connection budget, until
//! the write has a connection and is sent) hands each a [`Claim`], which the store takes when
//! it begins applying (or sending) the write and the caller withdraws when it stops waiting
//! first; a withdrawn write is never applied.
//!
//! The request's deadline ([`crate::router`]) runs each request under [`scope`], which lists
//! the claims of the writes it sends: when every write a request cut by its deadline sent was
//! withdrawn, nothing was written and the request may be retried as is, rather than re-read
//! first as a write of unknown outcome must be.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const PENDING: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// Where one queued write stands: pending, taken by the store, or withdrawn by its caller.
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

impl Claim {
    /// A claim of a write about to be sent, listed with the current request's writes, if any.
    pub fn sent() -> Arc<Self> {
        let claim = Arc::new(Claim::default());
        let _ = SENT.try_with(|sent| sent.lock().push(claim.clone()));
        claim
    }

    /// The store begins applying the write: `false` if its caller withdrew it first, and the
    /// store must then leave it be.
    pub fn take(&self) -> bool {
        self.0
            .compare_exchange(PENDING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .map_or_else(|now| now == TAKEN, |_| true)
    }

    /// The caller stops waiting: whether the write is withdrawn (now or before), so that it
    /// is never applied; `false` once the store took it.
    pub fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(PENDING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .map_or_else(|now| now == WITHDRAWN, |_| true)
    }
}

/// Withdraws its claim when dropped: held by the caller while it waits, so that a caller
/// giving up (its future dropped) withdraws a write the store has not taken.
#[derive(Debug)]
pub struct Withdraw(pub Arc<Claim>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.withdraw();
    }
}

/// The claims of the writes a request sent.
#[derive(Debug, Default)]
pub struct Sent(Mutex<Vec<Arc<Claim>>>);

impl Sent {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Claim>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the request sent writes and withdrew every one of them (withdrawing those still
    /// pending): then it wrote nothing.
    pub fn all_withdrawn(&self) -> bool {
        let claims = self.lock();
        !claims.is_empty() && claims.iter().all(|claim| claim.withdraw())
    }
}

tokio::task_local! {
    static SENT: Arc<Sent>;
}

/// Runs `request` listing in `sent` the claims of the writes it sends from its own task.
pub async fn scope<F: Future>(sent: Arc<Sent>, request: F) -> F::Output {
    SENT.scope(sent, request).await
}

/// Whether the current task runs inside a request's [`scope`]: work done for an API client
/// (the router's deadline sets it), rather than the server's own (farms, mirror, election).
/// A store that keeps shares for each (Consul's connection budget) tells them apart by it.
pub fn in_request() -> bool {
    SENT.try_with(|_| ()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_either_taken_or_withdrawn() {
        let taken = Claim::default();
        assert!(taken.take());
        assert!(!taken.withdraw());
        assert!(taken.take());
        let withdrawn = Claim::default();
        assert!(withdrawn.withdraw());
        assert!(!withdrawn.take());
        assert!(withdrawn.withdraw());
    }

    #[tokio::test]
    async fn a_request_wrote_nothing_only_if_it_withdrew_every_write_it_sent() {
        let sent = Arc::new(Sent::default());
        assert!(!sent.all_withdrawn(), "a request that sent no write");
        let claims = scope(sent.clone(), async { (Claim::sent(), Claim::sent()) }).await;
        assert!(sent.all_withdrawn());
        let sent = Arc::new(Sent::default());
        let (first, _) = scope(sent.clone(), async { (Claim::sent(), Claim::sent()) }).await;
        assert!(first.take());
        assert!(!sent.all_withdrawn());
        drop(claims);
    }

    #[tokio::test]
    async fn only_work_inside_a_scope_is_for_a_request() {
        assert!(!in_request());
        assert!(scope(Arc::new(Sent::default()), async { in_request() }).await);
    }
}

//! What keeps one tree of the mirror current: a blocking watch, paced so that a storm of
//! writes costs a few re-reads per second rather than one per write.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::futures::Notified;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::kv::{PrefixUpdate, StoreError, StoreResult};
use crate::layout;
use crate::panics;

use super::trees::Tree;
use super::Mirror;

/// How long past its wait (and the sixteenth of it Consul may add) a read of a tree may go
/// unanswered before the tree is out of touch as if the read had failed: a store that takes
/// the request and never answers fails no read, so its watch would never count as lost.
const WATCH_SLACK: Duration = Duration::from_secs(5);

/// Follows `tree` until `cancel`: reads it whole, then watches it, taking in only what
/// changed where the store can say (see [`crate::kv::KvStore::watch_changes`]), and reads it
/// whole again when its index goes backwards (below the tree's last listing, or below the
/// server's own writes it holds) or another tree saw the store's do so (`epoch` moved). An
/// index of the tree's below that while the store's own index, read from
/// [`layout::INDEX_PROBE`], is not below what the mirror holds is the tree's alone: Consul
/// lists a prefix at its newest change, a delete's only while the delete's tombstone lasts,
/// and once it reaps the tombstone (after its `tombstone_ttl`) the prefix's index is back at
/// its newest key's. What that tree's watch brought is then taken in as any listing, at the
/// index the tree held (the store had made every change up to it when the listing was
/// taken; the server's own writes past it stay), and the tree watched from there. Every
/// tree is read whole again when the store went backwards, or when it cannot tell, or when
/// the listing holds a key at a version older than the tree held (a store restored and
/// written to since answers its index past the mirror's).
///
/// A panic while reading the tree or taking in what was read (a bug: a document whose
/// decoding panics) fails the watch as a failed read does, and the tree is read whole
/// again: had the task ended, the tree would have stayed as it was for good, the server
/// ready.
pub(super) async fn follow(mirror: Mirror, tree: Tree, cancel: CancellationToken) {
    let prefix = tree.prefix();
    let config = mirror.config().clone();
    let mut epoch = mirror.epoch();
    let mut seen_epoch = *epoch.borrow_and_update();
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    // The index of the last listing; 0 until the tree has been read (again).
    let mut index = 0;
    let mut last_read: Option<Instant> = None;
    let mut last_success = Instant::now();
    loop {
        // At most one read per interval, unless someone waits for the tree: the changes
        // of the interval come in one listing.
        if let Some(last) = last_read {
            let until = last + config.min_reread_interval;
            let wanted = mirror.wanted(tree).notified();
            if !pause_until(until, &cancel, &mut epoch, Some(wanted)).await {
                return;
            }
        }
        let current_epoch = *epoch.borrow_and_update();
        if current_epoch != seen_epoch {
            seen_epoch = current_epoch;
            index = 0;
        }
        let fresh = index == 0;
        // Committed before the read begins, so in the tree as the read finds it.
        let known = mirror.committed_index();
        // So are the server's own writes the tree holds: a listing below them is of another
        // store (restarted or restored), though it may be past the tree's last listing.
        let floor = index.max(mirror.tree_index(tree));
        // A whole read has no wait to be overdue past, and may take long on a large tree.
        let overdue = (!fresh).then(|| {
            let wait = config.watch_wait;
            (Instant::now() + wait + wait / 16 + WATCH_SLACK).into_std()
        });
        mirror.watch_started(tree, overdue, last_success.into_std());
        // Made before the read is sent, so that a reader's signal from then on asks this
        // read again, and no signal sent before it does (see below).
        let asked_again = mirror.refresh(tree).notified();
        let read = AssertUnwindSafe(async {
            if fresh {
                mirror.store().list(&prefix).await.map(PrefixUpdate::Whole)
            } else {
                mirror
                    .store()
                    .watch_changes(&prefix, index, config.watch_wait, &|| {
                        mirror.held(tree, index)
                    })
                    .await
            }
        })
        .catch_unwind();
        // A reader waiting for a tree that holds nothing to catch up (the farms' world, an
        // answer made of it and of trees written since, a catch-up after a write of unknown
        // outcome) has the store asked again rather than wait out a blocking read: Consul
        // answers such a prefix at its KV table's index, which every write anywhere moves,
        // but need not wake the read for a write elsewhere (it watches the node of its
        // radix tree nearest the prefix), so the reader, told that index by the store,
        // would wait for the read's whole wait. Asked again, the store answers at once when
        // the index moved. A read is given the pacing interval to answer first, so that
        // waits in turn cannot keep the tree from ever being read. Only a read under way
        // when the reader asks is asked again: one sent after it finds the index moved
        // and answers at once, so asking it again too would only read the tree once more.
        let sent = Instant::now();
        let refresh = async {
            if fresh {
                std::future::pending::<()>().await;
            }
            asked_again.await;
            tokio::time::sleep_until(sent + config.min_reread_interval).await;
        };
        let result = tokio::select! {
            result = read => result,
            () = cancel.cancelled() => return,
            _ = epoch.changed() => continue,
            () = refresh => continue,
        };
        last_read = Some(Instant::now());
        let failure = match result {
            Ok(Ok(mut update)) => {
                let succeeded_before = last_success;
                last_success = Instant::now();
                mirror.watch_succeeded(tree);
                let mut went_back_alone = false;
                if !fresh && update.index() < floor {
                    backoff.reset();
                    let within = config.heartbeat_interval;
                    let gone_back = mirror.lists_lost_versions(tree, &update, floor)
                        || tokio::select! {
                            gone_back = store_went_backwards(&mirror, known, within) => gone_back,
                            () = cancel.cancelled() => return,
                        };
                    if gone_back {
                        // Unless another tree or the heartbeat saw it first.
                        if mirror.resync(seen_epoch) {
                            tracing::warn!(
                                prefix,
                                was = floor,
                                now = update.index(),
                                "the store's index went backwards; re-reading every tree"
                            );
                        }
                        continue;
                    }
                    tracing::debug!(
                        prefix,
                        was = floor,
                        now = update.index(),
                        "the tree's index went back while the store's did not (a delete's \
                         tombstone reaped)"
                    );
                    // Taken in as any listing (one read whole afresh would take out the
                    // server's own writes made since it was answered), at `floor`: the
                    // listing is of the store as it was once every change up to it was
                    // made, so what it lacks of them was deleted, and the tree is watched
                    // from there.
                    update = match update {
                        PrefixUpdate::Whole(mut listing) => {
                            listing.index = floor;
                            PrefixUpdate::Whole(listing)
                        }
                        since @ PrefixUpdate::Since(_) => since,
                    };
                    went_back_alone = true;
                }
                // Not taken in once the store went backwards since the read was sent
                // (a large listing is decoded meanwhile): it is of the old store, and the
                // tree is read whole again.
                let applied = if fresh || went_back_alone || update.index() != index {
                    let listed = update.index();
                    let apply =
                        AssertUnwindSafe(|| mirror.apply_update(tree, update, fresh, seen_epoch));
                    std::panic::catch_unwind(apply).map(|taken| {
                        if taken {
                            index = listed;
                        }
                    })
                } else {
                    Ok(())
                };
                match applied {
                    Ok(()) => {
                        backoff.reset();
                        // Unless the store went backwards meanwhile: `known` was the old
                        // store's.
                        if !fresh {
                            mirror.read_through(tree, known, seen_epoch);
                        }
                        continue;
                    }
                    Err(panic) => {
                        // No success: the tree is out of touch since the last one, and may
                        // hold part of what it failed to take in.
                        last_success = succeeded_before;
                        index = 0;
                        panicked(&*panic)
                    }
                }
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => {
                index = 0;
                panicked(&*panic)
            }
        };
        tracing::warn!(prefix, error = %failure, "watching a tree failed; retrying");
        mirror.watch_failed(tree, last_success.into_std());
        let retry = Instant::now() + backoff.next_delay();
        if !pause_until(retry, &cancel, &mut epoch, None).await {
            return;
        }
    }
}

/// A panic while following a tree, as its watch's failure.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    format!("panicked: {}", panics::message(panic))
}

/// Reads the store's index every [`super::MirrorConfig::heartbeat_interval`] until `cancel`,
/// so that [`Mirror::health`] learns within its bound of a store that takes requests and
/// never answers them: each watch alone would notice only once its own wait had run out.
/// For the same reason an index below what the mirror holds has every tree read again: a
/// Consul restored from a snapshot holds the watches, which wait for an index past the
/// restored one, until their wait runs out, and the mirror would serve what the store no
/// longer holds until then. Sent whether or not the watches answer, since those of trees
/// the restored store holds past their index answer as usual. A heartbeat unanswered
/// within the interval is given up, so that one lost on a dead connection does not hold
/// the next back.
pub(super) async fn heartbeat(mirror: Mirror, cancel: CancellationToken) {
    let interval = mirror.config().heartbeat_interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = cancel.cancelled() => return,
        }
        let seen_epoch = mirror.current_epoch();
        // Committed before the read is sent, so within the index it answers.
        let known = mirror.committed_index();
        let index = tokio::select! {
            read = store_index(&mirror, interval) => match read {
                Ok(index) => index,
                Err(_) => continue,
            },
            () = cancel.cancelled() => return,
        };
        mirror.store_answered();
        // Unless a tree saw it first.
        if index.is_some_and(|index| index < known) && mirror.resync(seen_epoch) {
            tracing::warn!(
                was = known,
                now = index,
                "the store's index went backwards; re-reading every tree"
            );
        }
    }
}

/// Whether the store went backwards: its index, read from the key nobody writes within
/// `within`, is below `known` (an index the mirror held before its last read was sent).
/// `true` too when the store cannot tell (its read fails or does not come in time, or
/// someone wrote the probe), so that every tree is read again, as it was before the store
/// could be asked.
async fn store_went_backwards(mirror: &Mirror, known: u64, within: Duration) -> bool {
    match store_index(mirror, within).await {
        Ok(Some(now)) => now < known,
        _ => true,
    }
}

/// The store's index, read from the key nobody writes ([`layout::INDEX_PROBE`]); `None` when
/// someone wrote it, so that it tells nothing. A read not answered `within` fails as the
/// store being unavailable.
async fn store_index(mirror: &Mirror, within: Duration) -> StoreResult<Option<u64>> {
    let read = mirror.store().current_index(layout::INDEX_PROBE);
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("no answer in time".into())))
}

/// Sleeps until `until`, or less if the epoch moves or `wanted` is notified; `false` once
/// cancelled.
async fn pause_until(
    until: Instant,
    cancel: &CancellationToken,
    epoch: &mut watch::Receiver<u64>,
    wanted: Option<Notified<'_>>,
) -> bool {
    let wanted = async {
        match wanted {
            Some(wanted) => wanted.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = tokio::time::sleep_until(until) => true,
        _ = epoch.changed() => true,
        () = wanted => true,
        () = cancel.cancelled() => false,
    }
}

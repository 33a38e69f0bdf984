//! P2's repositories: typed access to the trees P2 keeps in the key-value engine
//! ([`crate::kv`]), in P2's own key layout and JSON, so P2's tools can read and rewrite them.
//! Each reads documents as [`Versioned`] values and changes them through
//! [`update::update_with_retry`].

pub mod conditions;
pub mod daemon_sets;
pub mod events;
pub mod health;
pub mod labels;
pub mod own_writes;
pub mod pods;
pub mod rcs;
pub mod reports;
pub mod roll_creation;
pub mod rolls;
pub mod update;
mod versioned;

pub use versioned::Versioned;

use crate::kv::{txn_bytes_on, KvStore, TxnOp, MAX_TXN_BYTES};
use crate::model::FieldError;

/// The cause refusing the write of `what` (an RC, a daemon set or a roll creating an RC,
/// with what is written with it) whose `ops`, its one transaction, would pass the store's
/// [`MAX_TXN_BYTES`]: told as the manifest's size, the one field that large; `None` when
/// they fit. The store's values go in base64, so each byte of the manifest counts 4/3 bytes
/// or more (more for a character escaped in the stored JSON) each of the `copies` times the
/// write holds it: the manifest must lose at least the excess over that, so the size it may
/// have is at most the one given. Measured as `kv` will send the ops ([`txn_bytes_on`]), its keys' prefix
/// included, so a store keeping its keys in a namespace ([`crate::kv::prefixed`]) refuses
/// nothing this lets through.
pub fn manifest_too_large(
    kv: &dyn KvStore,
    what: &str,
    manifest: &str,
    copies: usize,
    ops: &[TxnOp],
) -> Option<FieldError> {
    let excess = txn_bytes_on(kv, ops)
        .checked_sub(MAX_TXN_BYTES)
        .filter(|&b| b > 0)?;
    let largest = manifest
        .len()
        .saturating_sub((excess * 3).div_ceil(4 * copies.max(1)));
    Some(FieldError::new(
        "manifest",
        format!(
            "is {} bytes, too large: the store takes {what} in one write of at most \
             {MAX_TXN_BYTES} bytes (512 KiB) in base64, so here the manifest may be at most \
             {largest} bytes (less if it has many lines or quotes, each escaped in the stored \
             JSON)",
            manifest.len()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::rcs::RcStore;
    use crate::kv::prefixed::Prefixed;
    use crate::kv::sqlite::SqliteStore;
    use crate::kv::KvStore;
    use crate::labels::Labels;
    use crate::model::event::Actor;
    use crate::model::{AllocationStrategy, Manifest, RcId, StoredRc};

    fn rc(manifest_bytes: usize) -> StoredRc {
        let head = "id: hello\n";
        let text = format!("{head}# {}\n", "x".repeat(manifest_bytes - head.len() - 3));
        StoredRc {
            id: RcId::generate().to_string(),
            manifest: Manifest::parse(&text).unwrap(),
            node_selector: String::new(),
            pod_labels: None,
            replicas_desired: 0,
            disabled: false,
            allocation_strategy: AllocationStrategy::Static,
        }
    }

    /// In a store keeping its keys under a namespace, as the shared-Consul tests do, the size
    /// a too-large manifest is told it may have counts the namespace of each key: a manifest
    /// of a little under it is written, not refused by the store.
    #[tokio::test]
    async fn the_size_a_manifest_may_have_counts_the_stores_key_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db").display().to_string();
        let inner: Arc<dyn KvStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let namespace = format!("p2-apiserver-test/{}/", uuid::Uuid::new_v4());
        let rcs = RcStore::new(Arc::new(Prefixed::new(inner, namespace).unwrap()));
        let actor = Actor::farm("test", "the size a manifest may have");
        let labels = Labels::default();
        let refused = rcs.create(rc(400_000), &labels, &actor).await.unwrap();
        let cause = refused.expect_err("a 400 KB manifest is too large");
        assert_eq!(cause.field, "manifest");
        let largest: usize = cause
            .message
            .split("may be at most ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}", cause.message));
        let written = rcs.create(rc(largest - 16), &labels, &actor).await;
        assert!(matches!(written, Ok(Ok(_))), "{written:?}");
    }
}

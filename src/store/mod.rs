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

use crate::kv::{txn_bytes, TxnOp, MAX_TXN_BYTES};
use crate::model::FieldError;

/// The cause refusing the write of `what` (an RC, a daemon set or a roll creating an RC,
/// with what is written with it) whose `ops`, its one transaction, would pass the store's [`MAX_TXN_BYTES`]: told
/// as the manifest's size, the one field that large; `None` when they fit. The store's
/// values go in base64, so each byte of the manifest counts 4/3 bytes or more (more for a
/// character escaped in the stored JSON) each of the `copies` times the write holds it: the
/// manifest must lose at least the excess over that, so the size it may have is at most the
/// one given. Measured on the keys as this server names them: a store that adds a prefix
/// to each ([`crate::kv::prefixed`]) may still refuse a write within some hundreds of bytes
/// of the limit, with its own message.
pub fn manifest_too_large(
    what: &str,
    manifest: &str,
    copies: usize,
    ops: &[TxnOp],
) -> Option<FieldError> {
    let excess = txn_bytes(ops)
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

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

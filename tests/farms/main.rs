//! The farms and leader election, driven directly against a store.

mod conditions;
mod ds;
mod events;
mod leader;
mod locks;
mod mirror_lag;
mod rc;
mod roll;
mod roll_interop;
#[path = "../support/mod.rs"]
mod support;

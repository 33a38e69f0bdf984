//! The farms and leader election, driven directly against a store.

#[path = "../support/mod.rs"]
mod support;

mod ds;
mod leader;
mod locks;
mod rc;
mod roll;

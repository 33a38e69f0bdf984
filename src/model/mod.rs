//! Stored document types and the pure domain rules around them; no I/O happens here.
//!
//! Every type that P2 also reads or writes keeps P2's JSON shape exactly (key names, key order
//! on write, Go's case-insensitive field matching on read), so this server and P2's daemons
//! can share one Consul.
//!
//! # Layout
//! - [`manifest`]: pod manifests (raw YAML kept verbatim, validation, canonical SHA).
//! - [`rc`], [`roll`], [`ds`]: replication controllers, rolling updates (with the roll
//!   algorithm) and daemon sets as stored.
//! - [`health`], [`audit`]: health records and audit log records.
//! - [`duration`], [`timestamp`]: Go-style durations and RFC 3339 times.

pub mod audit;
pub mod ds;
pub mod duration;
mod gojson;
pub mod health;
pub mod manifest;
pub mod rc;
pub mod roll;
pub mod timestamp;

use std::fmt;

pub use audit::{AuditRecord, DaemonSetEvent};
pub use ds::StoredDaemonSet;
pub use duration::{format_duration, parse_duration};
pub use health::{HealthCounts, HealthRecord, HealthState, PodHealth};
pub use manifest::{HealthCheck, Manifest};
pub use rc::{AllocationStrategy, StoredRc};
pub use roll::{roll_step, validate_counts, StoredRoll};

/// One invalid input field; validation returns all of them so a client can fix every problem
/// in one round trip (the API turns each into a `causes` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the offending field, e.g. `launchables.app.location`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// Builds a field error; a shorthand used by every validator.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A stored document that cannot be decoded. It is its own type so that callers listing a
/// tree can skip and report one bad entry instead of failing the whole listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {kind}: {message}")]
pub struct DecodeError {
    /// Which kind of document, e.g. `replication controller`.
    pub kind: &'static str,
    /// Why decoding failed.
    pub message: String,
}

impl DecodeError {
    fn new(kind: &'static str, message: impl fmt::Display) -> Self {
        DecodeError {
            kind,
            message: message.to_string(),
        }
    }
}

/// Joins field errors into one line, for places that can only carry a message.
fn join_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

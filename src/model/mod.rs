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
//! - [`conditions`]: the status conditions the farms compute for RCs, rolls and daemon sets.
//! - [`event`]: this server's own records beside P2's: events, created and modified times,
//!   finished rolls.
//! - [`ids`]: the id types and their rules.
//! - [`ds_spec`]: what clients send to create or change a daemon set, and its validation.
//! - [`rc_spec`]: what clients send to create or change an RC, and its validation.
//! - [`roll_request`]: what clients send to create a roll, and its validation.
//! - [`Limits`]: the configurable bounds validation applies.
//! - [`duration`], [`timestamp`]: Go-style durations and RFC 3339 times.

pub mod audit;
pub mod conditions;
pub mod ds;
pub mod ds_spec;
pub mod duration;
pub mod event;
mod gojson;
pub mod health;
pub mod ids;
pub mod manifest;
pub mod rc;
pub mod rc_spec;
pub mod roll;
pub mod roll_request;
pub mod timestamp;

use std::fmt;

pub use audit::{AuditRecord, DaemonSetEvent};
pub use ds::StoredDaemonSet;
pub use ds_spec::{CreateDaemonSet, DaemonSetChanges, DaemonSetPatch};
pub use duration::{format_duration, parse_duration};
pub use health::{HealthCounts, HealthRecord, HealthState, PodHealth};
pub use ids::{DaemonSetId, IdError, NodeName, PodId, RcId, RollId};
pub use manifest::{HealthCheck, Manifest};
pub use rc::{AllocationStrategy, StoredRc};
pub use rc_spec::{foreign_pod_id, NewRc, RcPatch, RcPatchDocument, RcSpec};
pub use roll::{roll_step, validate_counts, StoredRoll};
pub use roll_request::{CreateRoll, RollPlan, RollRcs};

/// JSON as Go's `json.Marshal` writes it, for documents P2 also writes that have no type
/// here (label sets).
pub(crate) use gojson::to_vec as to_go_json;

/// Whether stored JSON may hold an id, told without decoding it.
pub(crate) use gojson::may_hold as json_may_hold;

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

/// Collects every problem found in one input, so that validation reports them all at once.
#[derive(Debug, Default)]
pub struct Problems(Vec<FieldError>);

impl Problems {
    /// No problems yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `field` is wrong and why.
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    /// Records problems found by another validator.
    pub fn extend(&mut self, errors: impl IntoIterator<Item = FieldError>) {
        self.0.extend(errors);
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok` when nothing was recorded, otherwise every problem.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// The default of [`Limits::max_replicas`] (`--max-replicas`).
pub const DEFAULT_MAX_REPLICAS: i64 = 10_000;

/// Bounds that validation applies and the operator may set (`--max-replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most replicas an RC may want (`replicas_desired`) or a roll may aim for
    /// (`desired_replicas`); a typo of a few zeros must not schedule a pod on every node.
    pub max_replicas: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_replicas: DEFAULT_MAX_REPLICAS,
        }
    }
}

impl Limits {
    /// A replica count must be between 0 and [`Limits::max_replicas`].
    pub fn check_replicas(&self, replicas: i64) -> Result<(), String> {
        if replicas < 0 {
            Err("must be at least 0".to_owned())
        } else if replicas > self.max_replicas {
            Err(format!(
                "must be at most {}, the server's maximum (--max-replicas)",
                self.max_replicas
            ))
        } else {
            Ok(())
        }
    }

    /// Gives the replica counts of `openapi`'s request bodies ([`REPLICA_COUNTS`]) this
    /// server's maximum, so that its served document says what it accepts whatever
    /// `--max-replicas` is: a client validating against it, or generated from it, neither
    /// refuses a count the server takes nor sends one it refuses. The document in the
    /// repository is the default's.
    pub fn document(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{schema::Schema, RefOr};
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        for (schema, property) in REPLICA_COUNTS {
            let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(schema) else {
                continue;
            };
            if let Some(RefOr::T(Schema::Object(count))) = object.properties.get_mut(property) {
                count.maximum = Some(self.max_replicas.into());
            }
        }
    }
}

/// The request bodies' replica counts, as `(schema, property)`: those [`Limits::check_replicas`]
/// bounds (a roll's `minimum_replicas` through its `desired_replicas`), documented with
/// [`DEFAULT_MAX_REPLICAS`] as their maximum, and with the server's own in the served document
/// ([`Limits::document`]).
pub const REPLICA_COUNTS: [(&str, &str); 4] = [
    ("RcSpec", "replicas_desired"),
    ("RcPatch", "replicas_desired"),
    ("CreateRoll", "desired_replicas"),
    ("CreateRoll", "minimum_replicas"),
];

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

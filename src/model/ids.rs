//! Identifier types: every kind of id is parsed once, where it enters (a path segment or a
//! body field), by one rule with one error message, so a handler only ever holds valid ids.
//!
//! The rules, one per kind:
//! - [`RcId`], [`RollId`], [`DaemonSetId`]: a UUID in canonical text, lower-case and
//!   hyphenated (36 bytes), as P2 writes them. Any other spelling of a UUID (upper case,
//!   braces, `urn:uuid:`, no hyphens) is malformed rather than normalised: P2's keys are
//!   lower-case, and one spelling per object keeps ids, keys, ETags and links comparable as
//!   text.
//! - [`NodeName`]: one key segment (the engine's rule, [`crate::kv::keys::segment_problem`])
//!   without whitespace, at most [`MAX_ID_BYTES`] bytes, as a DNS name.
//! - [`PodId`]: a manifest's `id`; a non-empty label value (it becomes the `pod_id` label),
//!   so at most 63 characters of letters, digits, `-`, `_` and `.`, and not shaped like a
//!   UUID (a UUID as the last segment of an intent key marks a UUID pod, not a legacy pod).

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use uuid::Uuid;

use crate::kv::keys::segment_problem;
use crate::labels::validate_label_value;
use crate::labels::validation::MAX_NAME_LEN;

pub use crate::labels::MAX_ID_BYTES;

/// Why text is not an id of some kind; its message says what the id must be and fits after
/// the field's name (`id: must be ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdError(String);

/// An example UUID for messages and the OpenAPI document.
const EXAMPLE_UUID: &str = "5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11";

/// The one UUID rule: canonical lower-case hyphenated text.
fn parse_uuid(text: &str) -> Result<Uuid, IdError> {
    match Uuid::try_parse(text) {
        Ok(uuid) if uuid.hyphenated().to_string() == text => Ok(uuid),
        Ok(uuid) => Err(IdError(format!(
            "must be a lower-case hyphenated UUID, such as {}",
            uuid.hyphenated()
        ))),
        Err(_) => Err(IdError(format!(
            "must be a lower-case hyphenated UUID, such as {EXAMPLE_UUID}"
        ))),
    }
}

fn uuid_schema(description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::Custom("uuid".to_owned())))
        .pattern(Some(
            "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        ))
        .min_length(Some(36))
        .max_length(Some(36))
        .description(Some(description))
        .examples([serde_json::json!(EXAMPLE_UUID)])
        .into()
}

/// Parses a string with `FromStr` inside the visitor, so that a deserializer can tell where
/// the refused value was (axum's path extractor then names the parameter).
struct ParseVisitor<T>(std::marker::PhantomData<T>);

impl<T> de::Visitor<'_> for ParseVisitor<T>
where
    T: FromStr<Err = IdError>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an id string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        text.parse().map_err(E::custom)
    }
}

/// Serde and OpenAPI for an id type that parses with `FromStr` and prints with `Display`.
macro_rules! text_id {
    ($name:ident, $schema:expr) => {
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(ParseVisitor(std::marker::PhantomData))
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// A UUID id type.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh id: a time-ordered UUID (v7), so that objects made one after another
            /// sit side by side in the store's key order, and so do their locks, times and
            /// conditions. A farm's pass over them then reads and writes neighbouring
            /// pages of SQLite's indexes rather than one page per object. P2 makes v4 ids
            /// and reads any UUID.
            pub fn generate() -> Self {
                $name(Uuid::now_v7())
            }

            /// The UUID itself.
            pub fn uuid(self) -> Uuid {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(text: &str) -> Result<Self, IdError> {
                parse_uuid(text).map($name)
            }
        }

        impl From<Uuid> for $name {
            fn from(uuid: Uuid) -> Self {
                $name(uuid)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        text_id!(
            $name,
            uuid_schema(concat!(
                "The ",
                $what,
                "'s id: a UUID in lower-case hyphenated form"
            ))
        );
    };
}

uuid_id!(
    /// A replication controller's id.
    RcId,
    "replication controller"
);
uuid_id!(
    /// A rolling update's id, which is its new RC's id.
    RollId,
    "rolling update"
);
uuid_id!(
    /// A daemon set's id.
    DaemonSetId,
    "daemon set"
);

impl From<RcId> for RollId {
    /// A roll is named by its new RC.
    fn from(rc: RcId) -> Self {
        RollId(rc.0)
    }
}

/// A string id type with its own rule.
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $check:ident, $schema:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Checks `text` against the rule without keeping it.
            pub fn check(text: &str) -> Result<(), IdError> {
                $check(text)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(text: &str) -> Result<Self, IdError> {
                $check(text).map(|()| $name(text.to_owned()))
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        text_id!($name, $schema);
    };
}

string_id!(
    /// A node's name, as in `intent/<node>/...` and the `node` label type.
    NodeName,
    check_node_name,
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_ID_BYTES))
        // `/`, control characters (Unicode's Cc) and whitespace (Unicode's White_Space),
        // spelt out: a regex engine's `\s` differs from Rust's `char::is_whitespace`. A name
        // starts with a character other than `.`, with `.` and one, or with `..` and one, so
        // that `.` and `..` alone are not names (without a look-ahead, which not every
        // engine has).
        .pattern(Some(concat!(
            r"^(?:[^/.\x00-\x20\x7F-\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]",
            r"|\.[^/.\x00-\x20\x7F-\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]",
            r"|\.\.[^/\x00-\x20\x7F-\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000])",
            r"[^/\x00-\x20\x7F-\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]*$"
        )))
        // JSON Schema counts a string's length in characters, the server in bytes, and no
        // pattern counts bytes: `maxLength` bounds every name taken, and the description
        // says the rest.
        .description(Some(
            "A node name: one key segment (not `.` or `..`) without `/`, whitespace or \
             control characters, at most 253 bytes of UTF-8 (`maxLength` counts characters: \
             a name of non-ASCII characters, 2 to 4 bytes each, is refused below it)",
        ))
        .examples([serde_json::json!("node17.example.com")])
        .into()
);

string_id!(
    /// A pod id: a manifest's `id`.
    PodId,
    check_pod_id,
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_NAME_LEN))
        .pattern(Some(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"))
        .description(Some(
            "A pod id (a manifest's `id`): a label value of 1 to 63 letters, digits, `-`, `_` \
             and `.`, starting and ending with a letter or digit, not shaped like a UUID",
        ))
        .examples([serde_json::json!("hello")])
        .into()
);

fn check_node_name(text: &str) -> Result<(), IdError> {
    if text.len() > MAX_ID_BYTES {
        return Err(IdError(format!(
            "must be a node name of at most {MAX_ID_BYTES} bytes (it has {})",
            text.len()
        )));
    }
    if let Some(problem) = segment_problem(text) {
        return Err(IdError(format!(
            "must be a node name, one key segment, but {problem}"
        )));
    }
    if text.chars().any(char::is_whitespace) {
        return Err(IdError("must be a node name without whitespace".to_owned()));
    }
    Ok(())
}

fn check_pod_id(text: &str) -> Result<(), IdError> {
    if text.is_empty() {
        return Err(IdError("must be a pod id, not empty".to_owned()));
    }
    validate_label_value(text).map_err(|e| {
        IdError(format!(
            "must be a pod id, which becomes a `pod_id` label value and a key segment: {e}"
        ))
    })?;
    if Uuid::try_parse(text).is_ok() {
        return Err(IdError(
            "must be a pod id, not shaped like a UUID: a UUID in an intent key marks a UUID pod"
                .to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_one_after_another_sort_in_that_order() {
        let ids: Vec<String> = (0..100).map(|_| RcId::generate().to_string()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert!(ids.iter().all(|id| id.parse::<RcId>().is_ok()));
    }

    #[test]
    fn uuid_ids_take_only_the_canonical_spelling() {
        let id: RcId = EXAMPLE_UUID.parse().unwrap();
        assert_eq!(id.to_string(), EXAMPLE_UUID);
        assert_eq!(RollId::from(id).to_string(), EXAMPLE_UUID);
        let upper = EXAMPLE_UUID.to_uppercase();
        for bad in [
            upper.as_str(),
            "5a0e3b8c6f2d4c1e9a570c8e2f4b7d11",
            "{5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11}",
            "urn:uuid:5a0e3b8c-6f2d-4c1e-9a57-0c8e2f4b7d11",
            "not-a-uuid",
            "",
        ] {
            let err = bad.parse::<DaemonSetId>().unwrap_err().to_string();
            assert!(
                err.starts_with("must be a lower-case hyphenated UUID"),
                "{bad}: {err}"
            );
        }
        assert!(upper
            .parse::<RollId>()
            .unwrap_err()
            .to_string()
            .ends_with(EXAMPLE_UUID));
    }

    #[test]
    fn ids_round_trip_through_serde() {
        let id: RcId = serde_json::from_str(&format!("\"{EXAMPLE_UUID}\"")).unwrap();
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            format!("\"{EXAMPLE_UUID}\"")
        );
        assert!(serde_json::from_str::<RcId>("\"nope\"").is_err());
        let node: NodeName = serde_json::from_str("\"node1\"").unwrap();
        assert_eq!(node.as_str(), "node1");
    }

    #[test]
    fn node_names_are_key_segments_of_bounded_length() {
        for good in [
            "node1",
            "node17.example.com",
            "a..",
            &"n".repeat(MAX_ID_BYTES),
        ] {
            NodeName::check(good).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "a\u{7}",
            &"n".repeat(MAX_ID_BYTES + 1),
        ] {
            let err = NodeName::check(bad).unwrap_err().to_string();
            assert!(err.starts_with("must be a node name"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn pod_ids_are_label_values_that_are_not_uuids() {
        for good in [
            "hello",
            "p2-log-shipper",
            "a_b.c",
            &"p".repeat(MAX_NAME_LEN),
        ] {
            PodId::check(good).unwrap();
        }
        for bad in [
            "",
            "..",
            "a/b",
            "a b",
            "-a",
            "a:b",
            EXAMPLE_UUID,
            &"p".repeat(MAX_NAME_LEN + 1),
        ] {
            let err = PodId::check(bad).unwrap_err().to_string();
            assert!(err.starts_with("must be a pod id"), "{bad:?}: {err}");
        }
    }
}

//! Validity rules for label keys and values, the same as Kubernetes' qualified names.
//!
//! P2 only checks these when a selector is parsed, so a label it stores may never be
//! selectable; we apply them to every label we write as well.

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;

use super::Labels;

/// Longest allowed key name part and label value, as in Kubernetes.
pub const MAX_NAME_LEN: usize = 63;
/// Longest allowed key prefix (a DNS-1123 subdomain), as in Kubernetes.
pub const MAX_PREFIX_LEN: usize = 253;
/// The longest id that is not a UUID (a node name, each part of a label id), in bytes: the
/// length of a DNS name. Here because label ids are checked here; `crate::model::ids` uses it.
pub const MAX_ID_BYTES: usize = 253;
/// Longest allowed key: a prefix, `/` and a name, 253 + 1 + 63 characters.
pub const MAX_KEY_LEN: usize = MAX_PREFIX_LEN + 1 + MAX_NAME_LEN;

/// A label key as [`validate_label_key`] takes it, for the API document: an optional
/// DNS-1123 subdomain prefix and `/`, then a name. The prefix's own bound of
/// [`MAX_PREFIX_LEN`] is left to the words (a regular expression without lookahead cannot
/// bound one part), the key's to `maxLength`.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A label value as [`validate_label_value`] takes it, for the API document: empty, or a
/// name.
pub const LABEL_VALUE_PATTERN: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";

/// A label value a client sends, in the API document: a component, so that each field
/// holding one keeps its own description.
pub struct LabelValue;

impl utoipa::PartialSchema for LabelValue {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(MAX_NAME_LEN))
            .pattern(Some(LABEL_VALUE_PATTERN))
            .description(Some(format!(
                "A label value: empty, or at most {MAX_NAME_LEN} letters, digits, `-`, `_` \
                 and `.`, starting and ending with a letter or digit"
            )))
            .into()
    }
}

impl utoipa::ToSchema for LabelValue {}

/// A label set a client sends, in the API document: its keys and values as the server
/// checks them.
pub struct LabelSet;

impl utoipa::PartialSchema for LabelSet {
    fn schema() -> RefOr<Schema> {
        let key = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_KEY_LEN))
            .pattern(Some(LABEL_KEY_PATTERN));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property_names(Some(key))
            .additional_properties(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                "LabelValue",
            ))))
            .description(Some(format!(
                "Labels as Kubernetes has them: each key a name, optionally after a DNS \
                 subdomain prefix of at most {MAX_PREFIX_LEN} characters and `/`; each value a \
                 `LabelValue`"
            )))
            .into()
    }
}

impl utoipa::ToSchema for LabelSet {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            "LabelValue".to_owned(),
            <LabelValue as utoipa::PartialSchema>::schema(),
        ));
    }
}

/// Checks a label key: an optional DNS-1123 subdomain prefix and `/`, then a name; at most
/// [`MAX_KEY_LEN`] characters in all.
///
/// The error says which part is wrong and why, without repeating the key, so callers can
/// attach it to whatever field or position they report.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key must not be empty".to_string());
    }
    let len = key.chars().count();
    if len > MAX_KEY_LEN {
        return Err(format!(
            "key must be at most {MAX_KEY_LEN} characters (it has {len})"
        ));
    }
    let name = match key.split_once('/') {
        None => key,
        Some((prefix, name)) => {
            if name.contains('/') {
                return Err(
                    "key may contain at most one '/', between the prefix and the name".to_string(),
                );
            }
            validate_prefix(prefix)?;
            name
        }
    };
    validate_name("name", name, false)
}

/// Checks a label value: empty, or a name of at most 63 characters.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    validate_name("value", value, true)
}

/// What is wrong with a label key, worded as every route reports it; `None` when it is valid.
pub fn label_key_problem(key: &str) -> Option<String> {
    validate_label_key(key)
        .err()
        .map(|e| format!("invalid label key: {e}"))
}

/// What is wrong with a label value, quoting it, as every route reports it; `None` when it is
/// valid.
pub fn label_value_problem(value: &str) -> Option<String> {
    validate_label_value(value)
        .err()
        .map(|e| format!("invalid label value {value:?}: {e}"))
}

/// Checks every key and value of a label set, reporting each problem against
/// `labels.<key>` so a client learns everything wrong in one round trip.
pub fn validate_labels(labels: &Labels) -> Vec<(String, String)> {
    validate_labels_in("labels", labels)
}

/// Like [`validate_labels`], for a label set held in another field (`pod_labels`, `values`).
pub fn validate_labels_in(field: &str, labels: &Labels) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (key, value) in labels {
        let at = format!("{field}.{key}");
        if let Some(problem) = label_key_problem(key) {
            problems.push((at.clone(), problem));
        }
        if let Some(problem) = label_value_problem(value) {
            problems.push((at, problem));
        }
    }
    problems
}

/// A key prefix must be a lowercase DNS-1123 subdomain of at most 253 characters.
fn validate_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("prefix before '/' must not be empty".to_string());
    }
    let len = prefix.chars().count();
    if len > MAX_PREFIX_LEN {
        return Err(format!(
            "prefix must be at most {MAX_PREFIX_LEN} characters (it has {len})"
        ));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "prefix must be a DNS subdomain of lowercase letters, digits, '-' and '.', \
             but contains {c:?}"
        ));
    }
    for label in prefix.split('.') {
        if label.is_empty() {
            return Err(
                "prefix must be a DNS subdomain, but has an empty part between dots \
                 (or a leading or trailing '.')"
                    .to_string(),
            );
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "each dot-separated part of the prefix must start and end with a lowercase \
                 letter or digit, but {label:?} does not"
            ));
        }
    }
    Ok(())
}

/// A key name or value: at most 63 characters of `[-A-Za-z0-9_.]`, alphanumeric at both
/// ends. `what` names the part in messages.
fn validate_name(what: &str, s: &str, allow_empty: bool) -> Result<(), String> {
    if s.is_empty() {
        return if allow_empty {
            Ok(())
        } else {
            Err(format!("{what} must not be empty"))
        };
    }
    let len = s.chars().count();
    if len > MAX_NAME_LEN {
        return Err(format!(
            "{what} must be at most {MAX_NAME_LEN} characters (it has {len})"
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{what} may contain only letters, digits, '-', '_' and '.', but contains {c:?}"
        ));
    }
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!("{what} must start with a letter or digit"));
    }
    if !s.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!("{what} must end with a letter or digit"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_err(key: &str) -> String {
        validate_label_key(key).expect_err(key)
    }

    fn value_err(value: &str) -> String {
        validate_label_value(value).expect_err(value)
    }

    #[test]
    fn valid_keys() {
        for key in [
            "a",
            "A",
            "9",
            "pod_id",
            "replication_controller_id",
            "a.b-c_d",
            "Ab-9",
            "example.com/name",
            "a/b",
            "a-b.c-d.e9/Z_z",
            &"x".repeat(63),
            &format!("{}/{}", "p".repeat(253), "n".repeat(63)),
        ] {
            assert_eq!(validate_label_key(key), Ok(()), "{key}");
        }
    }

    #[test]
    fn invalid_key_names() {
        assert!(key_err("").contains("must not be empty"));
        assert!(key_err(&"x".repeat(64)).contains("at most 63 characters (it has 64)"));
        assert!(key_err("-a").contains("must start with a letter or digit"));
        assert!(key_err("_a").contains("must start"));
        assert!(key_err(".a").contains("must start"));
        assert!(key_err("a-").contains("must end with a letter or digit"));
        assert!(key_err("a.").contains("must end"));
        assert!(key_err("a b").contains("contains ' '"));
        assert!(key_err("a=b").contains("contains '='"));
        assert!(key_err("é").contains("contains 'é'"));
        assert!(key_err("a\tb").contains("'\\t'"));
    }

    #[test]
    fn invalid_key_prefixes() {
        assert!(key_err("/a").contains("prefix before '/' must not be empty"));
        assert!(key_err("a/").contains("name must not be empty"));
        assert!(key_err("a/b/c").contains("at most one '/'"));
        assert!(key_err("Example.com/a").contains("contains 'E'"));
        assert!(key_err("a_b/c").contains("contains '_'"));
        assert!(key_err("a..b/c").contains("empty part"));
        assert!(key_err(".a/c").contains("empty part"));
        assert!(key_err("a./c").contains("empty part"));
        assert!(key_err("-a.b/c").contains("\"-a\" does not"));
        assert!(key_err("a.b-/c").contains("\"b-\" does not"));
        assert!(key_err(&format!("{}/n", "p".repeat(254))).contains("at most 253"));
        assert!(key_err(&"k".repeat(10_000)).contains("at most 317 characters (it has 10000)"));
        assert!(key_err("a/-b").contains("name must start"));
    }

    #[test]
    fn valid_values() {
        for value in ["", "a", "Z", "0", "us-west-2a", "a.b_c-d", &"v".repeat(63)] {
            assert_eq!(validate_label_value(value), Ok(()), "{value}");
        }
    }

    #[test]
    fn invalid_values() {
        assert!(value_err(&"v".repeat(64)).contains("value must be at most 63"));
        assert!(value_err("a b").contains("value may contain only"));
        assert!(value_err("a/b").contains("contains '/'"));
        assert!(value_err("-a").contains("value must start"));
        assert!(value_err("a_").contains("value must end"));
        assert!(value_err(" ").contains("contains ' '"));
    }

    #[test]
    fn validate_labels_reports_every_problem() {
        let labels: Labels = [
            ("good", "fine"),
            ("bad key", "fine"),
            ("k", "bad value"),
            ("-both", "-bad"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let problems = validate_labels(&labels);
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["labels.-both", "labels.-both", "labels.bad key", "labels.k"]
        );
        assert!(problems[0].1.starts_with("invalid label key:"));
        assert!(problems[1].1.starts_with("invalid label value \"-bad\":"));
        assert!(problems[3].1.contains("contains ' '"));
    }

    #[test]
    fn validate_labels_in_uses_the_given_field() {
        let labels: Labels = [("a b".to_string(), String::new())].into();
        assert_eq!(
            validate_labels_in("pod_labels", &labels)[0].0,
            "pod_labels.a b"
        );
        assert!(validate_labels(&Labels::new()).is_empty());
    }
}

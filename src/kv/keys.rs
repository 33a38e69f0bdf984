//! Key and value rules shared by every backend, checked before anything is written.

use super::{StoreError, StoreResult};

/// Largest value a key may hold: Consul's own limit.
pub const MAX_VALUE_BYTES: usize = 512 * 1024;

/// A key is one or more `/`-separated segments, none empty, `.` or `..`, none holding a
/// control character.
pub fn validate_key(key: &str) -> StoreResult<()> {
    if key.is_empty() {
        return Err(StoreError::Invalid("key must not be empty".into()));
    }
    for segment in key.split('/') {
        validate_segment(key, segment)?;
    }
    Ok(())
}

/// A prefix is empty or a key, optionally followed by one trailing `/`.
pub fn validate_prefix(prefix: &str) -> StoreResult<()> {
    match prefix.strip_suffix('/') {
        _ if prefix.is_empty() => Ok(()),
        Some(stem) => validate_key(stem),
        None => validate_key(prefix),
    }
}

/// Refuses values over [`MAX_VALUE_BYTES`].
pub fn validate_value(value: &[u8]) -> StoreResult<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(StoreError::Invalid(format!(
            "value is {} bytes; the limit is {MAX_VALUE_BYTES} bytes (512 KiB)",
            value.len()
        )));
    }
    Ok(())
}

/// What keeps `segment` from being one key segment, `None` when it is one: it must be
/// non-empty, not `.` or `..`, and hold no `/` or control character. The id types in
/// `crate::model::ids` build on this rule.
pub fn segment_problem(segment: &str) -> Option<&'static str> {
    if segment.is_empty() {
        Some("is empty")
    } else if segment == "." || segment == ".." {
        Some("is '.' or '..'")
    } else if segment.contains('/') {
        Some("holds a '/'")
    } else if segment.chars().any(char::is_control) {
        Some("holds a control character")
    } else {
        None
    }
}

fn validate_segment(key: &str, segment: &str) -> StoreResult<()> {
    match segment_problem(segment) {
        None => Ok(()),
        Some(problem) => Err(StoreError::Invalid(format!(
            "key {key:?} has a segment that {problem}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_keys() {
        validate_key("labels/pod/node1/hello").unwrap();
        validate_key("a").unwrap();
        validate_prefix("").unwrap();
        validate_prefix("labels/").unwrap();
        validate_prefix("labels/po").unwrap();
    }

    #[test]
    fn refuses_bad_segments() {
        for key in [
            "", "/a", "a/", "a//b", "a/./b", "a/../b", "..", "a/b\u{7}", "a\nb",
        ] {
            assert!(validate_key(key).is_err(), "{key:?} accepted");
        }
        assert!(validate_prefix("a//").is_err());
        assert!(validate_prefix("../").is_err());
    }

    #[test]
    fn refuses_oversized_values() {
        validate_value(&vec![0; MAX_VALUE_BYTES]).unwrap();
        assert!(matches!(
            validate_value(&vec![0; MAX_VALUE_BYTES + 1]),
            Err(StoreError::Invalid(_))
        ));
    }
}

//! The JSON shapes Consul sends and expects, and their conversion to the store's types.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::kv::{
    KvPair, Lock, SessionBehavior, SessionInfo, SessionSpec, StoreError, StoreResult, TxnFailure,
    TxnOp,
};

/// Decodes a JSON answer; an answer we cannot read means Consul (or something posing as it)
/// is not answering as expected, which callers treat like an outage.
pub(super) fn decode<'a, T: Deserialize<'a>>(what: &str, body: &'a [u8]) -> StoreResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| StoreError::Unavailable(format!("{what}: unreadable answer from Consul: {e}")))
}

/// One KV entry as `/v1/kv` and `/v1/txn` return it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct KvEntry {
    key: String,
    /// Base64; `null` for an empty value and for txn results of writes.
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
    #[serde(default)]
    lock_index: u64,
    #[serde(default)]
    session: Option<String>,
    /// Opaque to Consul; CAS puts set it to a random token to recognise their own write.
    #[serde(default)]
    flags: u64,
}

impl KvEntry {
    pub(super) fn into_pair(self) -> StoreResult<KvPair> {
        let value = match self.value.as_deref() {
            None | Some("") => Vec::new(),
            Some(text) => BASE64.decode(text).map_err(|e| {
                StoreError::Unavailable(format!("value of {:?} is not base64: {e}", self.key))
            })?,
        };
        Ok(KvPair {
            key: self.key,
            value: value.into(),
            create_index: self.create_index,
            modify_index: self.modify_index,
            lock: Lock::of(self.lock_index, self.session.filter(|s| !s.is_empty())),
        })
    }
}

/// Decodes a `/v1/kv` read keeping each entry's flags, which identify the write that made it.
pub(super) fn decode_pairs_with_flags(what: &str, body: &[u8]) -> StoreResult<Vec<(KvPair, u64)>> {
    let entries: Option<Vec<KvEntry>> = decode(what, body)?;
    entries
        .unwrap_or_default()
        .into_iter()
        .map(|entry| {
            let flags = entry.flags;
            entry.into_pair().map(|pair| (pair, flags))
        })
        .collect()
}

/// Decodes a `/v1/kv` read: a JSON array of entries.
pub(super) fn decode_pairs(what: &str, body: &[u8]) -> StoreResult<Vec<KvPair>> {
    let entries: Option<Vec<KvEntry>> = decode(what, body)?;
    entries
        .unwrap_or_default()
        .into_iter()
        .map(KvEntry::into_pair)
        .collect()
}

/// The body of `/v1/session/create`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SessionCreate<'a> {
    name: &'a str,
    #[serde(rename = "TTL")]
    ttl: String,
    lock_delay: String,
    behavior: &'static str,
    /// Empty so that Consul attaches no serf health check: our sessions live by TTL alone.
    checks: [&'static str; 0],
}

impl<'a> SessionCreate<'a> {
    pub(super) fn new(spec: &'a SessionSpec) -> Self {
        SessionCreate {
            name: &spec.name,
            ttl: format_duration(spec.ttl),
            lock_delay: format_duration(spec.lock_delay),
            behavior: spec.behavior.as_str(),
            checks: [],
        }
    }
}

/// The answer of `/v1/session/create`.
#[derive(Debug, Deserialize)]
pub(super) struct SessionCreated {
    #[serde(rename = "ID")]
    pub(super) id: String,
}

/// One session as `/v1/session/info` and `/v1/session/renew` return it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SessionEntry {
    #[serde(rename = "ID")]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "TTL", default, deserialize_with = "lenient_duration")]
    ttl: Duration,
    #[serde(default, deserialize_with = "lenient_duration")]
    lock_delay: Duration,
    #[serde(default)]
    behavior: Option<String>,
    #[serde(default)]
    create_index: u64,
}

/// Decodes a session list (`null` or `[]` when there is none) and returns its first entry.
pub(super) fn decode_session(what: &str, body: &[u8]) -> StoreResult<Option<SessionInfo>> {
    let entries: Option<Vec<SessionEntry>> = decode(what, body)?;
    let Some(entry) = entries.unwrap_or_default().into_iter().next() else {
        return Ok(None);
    };
    let behavior = match entry.behavior.as_deref() {
        // Consul's default when a session was created without one.
        None | Some("") | Some("release") => SessionBehavior::Release,
        Some("delete") => SessionBehavior::Delete,
        Some(other) => {
            return Err(StoreError::Unavailable(format!(
                "{what}: unknown session behavior {other:?}"
            )))
        }
    };
    Ok(Some(SessionInfo {
        id: entry.id,
        name: entry.name,
        ttl: entry.ttl,
        lock_delay: entry.lock_delay,
        behavior,
        create_index: entry.create_index,
    }))
}

/// A duration sent as Go's text form, which Consul parses for both TTL and LockDelay.
pub(super) fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

/// Accepts a duration as Go text (`"15s"`, `"1m30s"`, `""`), as an integer count of
/// nanoseconds (how Consul writes LockDelay), or `null`.
fn lenient_duration<'de, D: Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Nanos(u64),
        Float(f64),
        Text(String),
    }
    match Option::<Raw>::deserialize(de)? {
        None => Ok(Duration::ZERO),
        Some(Raw::Nanos(n)) => Ok(Duration::from_nanos(n)),
        Some(Raw::Float(f)) if f.is_finite() && f >= 0.0 => Ok(Duration::from_nanos(f as u64)),
        Some(Raw::Float(f)) => Err(serde::de::Error::custom(format!("bad duration {f}"))),
        Some(Raw::Text(text)) => parse_go_duration(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("bad duration {text:?}"))),
    }
}

/// Parses Go's `time.Duration` text: a sequence of decimal numbers with units
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`); `"0"` and `""` are zero. Negative is refused.
pub(super) fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        total = total.checked_add(whole.checked_mul(scale)?)?;
        // Nanoseconds are the finest unit, so 18 fraction digits are more than enough.
        let fraction = &fraction[..fraction.len().min(18)];
        if !fraction.is_empty() {
            let digits: u128 = fraction.parse().ok()?;
            total += digits * scale / 10u128.pow(fraction.len() as u32);
        }
        rest = after;
    }
    u64::try_from(total).ok().map(Duration::from_nanos)
}

/// One op of a `/v1/txn` body.
#[derive(Debug, Serialize)]
pub(super) struct TxnOpBody<'a> {
    #[serde(rename = "KV")]
    kv: KvOpBody<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct KvOpBody<'a> {
    verb: &'static str,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
}

impl<'a> From<&'a TxnOp> for TxnOpBody<'a> {
    fn from(op: &'a TxnOp) -> Self {
        let (verb, index, session) = match op {
            TxnOp::Set { .. } => ("set", None, None),
            TxnOp::Cas { index, .. } => ("cas", Some(*index), None),
            TxnOp::Get { .. } => ("get", None, None),
            TxnOp::Delete { .. } => ("delete", None, None),
            TxnOp::DeleteCas { index, .. } => ("delete-cas", Some(*index), None),
            TxnOp::CheckIndex { index, .. } => ("check-index", Some(*index), None),
            // Consul 0.7 has no check-not-exists verb (0.8 added it); a delete-CAS at index 0
            // is the same check there and everywhere: it succeeds, deleting nothing, exactly
            // when the key is absent.
            TxnOp::CheckNotExists { .. } => ("delete-cas", Some(0), None),
            TxnOp::Lock { session, .. } => ("lock", None, Some(session.as_str())),
            TxnOp::Unlock { session, .. } => ("unlock", None, Some(session.as_str())),
            TxnOp::CheckSession { session, .. } => ("check-session", None, Some(session.as_str())),
        };
        TxnOpBody {
            kv: KvOpBody {
                verb,
                key: op.key(),
                value: op.value().map(|v| BASE64.encode(v)),
                index,
                session,
            },
        }
    }
}

/// The answer of `/v1/txn`, both when it commits (200) and when it rolls back (409).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TxnAnswer {
    #[serde(default)]
    results: Option<Vec<TxnResult>>,
    #[serde(default)]
    errors: Option<Vec<TxnError>>,
}

#[derive(Debug, Deserialize)]
struct TxnResult {
    #[serde(rename = "KV")]
    kv: Option<KvEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnError {
    op_index: usize,
    what: String,
}

impl TxnAnswer {
    /// Lines the results up with `ops`: Consul answers only the ops that return an entry.
    /// Check ops come back without a value, as Consul sends them.
    pub(super) fn into_results(self, ops: &[TxnOp]) -> StoreResult<Vec<Option<KvPair>>> {
        let mut results = self.results.unwrap_or_default().into_iter();
        let mut lined_up = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if !op.returns_entry() {
                lined_up.push(None);
                continue;
            }
            let entry = results.next().and_then(|r| r.kv).ok_or_else(|| {
                StoreError::Unavailable(format!("txn: Consul returned no entry for op {i}"))
            })?;
            let mut pair = entry.into_pair()?;
            // Consul leaves the value out of write results; what a committed write stored is
            // the op's own value, which the embedded backend returns as well.
            if let Some(value) = op.value() {
                pair.value = value.into();
            }
            lined_up.push(Some(pair));
        }
        if results.next().is_some() {
            return Err(StoreError::Unavailable(
                "txn: Consul returned more results than ops".into(),
            ));
        }
        Ok(lined_up)
    }

    /// The rollback as a conflict naming every failing op, or `Forbidden` when Consul denied an
    /// op by ACL, which it reports as a failing op ("Permission denied") rather than a 403,
    /// and which no retry can make pass.
    pub(super) fn into_rollback_error(self) -> StoreError {
        let failures: Vec<TxnFailure> = self
            .errors
            .unwrap_or_default()
            .into_iter()
            .map(|e| TxnFailure {
                op_index: e.op_index,
                what: e.what,
            })
            .collect();
        let detail: Vec<String> = failures
            .iter()
            .map(|f| format!("op {}: {}", f.op_index, f.what))
            .collect();
        let message = format!("transaction rolled back: {}", detail.join("; "));
        let denied = |f: &TxnFailure| f.what.to_ascii_lowercase().starts_with("permission denied");
        if failures.iter().any(denied) {
            return StoreError::Forbidden(message);
        }
        StoreError::Conflict { message, failures }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("15s", Duration::from_secs(15)),
            ("0", Duration::ZERO),
            ("", Duration::ZERO),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("250ms", Duration::from_millis(250)),
            ("2h", Duration::from_secs(7200)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            (".5s", Duration::from_millis(500)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), Some(want), "{text:?}");
        }
        for bad in ["15", "s", "-1s", "1x", "1..2s", "."] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn formats_durations_consul_can_parse_back() {
        for d in [
            Duration::from_secs(15),
            Duration::from_millis(1),
            Duration::from_millis(15_500),
            Duration::from_nanos(3),
            Duration::ZERO,
        ] {
            assert_eq!(parse_go_duration(&format_duration(d)), Some(d));
        }
        assert_eq!(format_duration(Duration::from_secs(15)), "15s");
    }

    #[test]
    fn reads_session_durations_in_either_form() {
        let body = br#"[{"ID":"s1","Name":"n","TTL":"15s","LockDelay":5000000000,"Behavior":"delete","CreateIndex":7},
                        {"ID":"s2"}]"#;
        let info = decode_session("info", body).unwrap().unwrap();
        assert_eq!(info.ttl, Duration::from_secs(15));
        assert_eq!(info.lock_delay, Duration::from_secs(5));
        assert_eq!(info.behavior, SessionBehavior::Delete);
        let text = br#"[{"ID":"s1","TTL":"","LockDelay":"1ms"}]"#;
        let info = decode_session("info", text).unwrap().unwrap();
        assert_eq!(
            (info.ttl, info.lock_delay),
            (Duration::ZERO, Duration::from_millis(1))
        );
        assert_eq!(info.behavior, SessionBehavior::Release);
        assert_eq!(decode_session("info", b"null").unwrap(), None);
        assert_eq!(decode_session("info", b"[]").unwrap(), None);
    }
}

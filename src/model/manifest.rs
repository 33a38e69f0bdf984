//! Pod manifests: the raw YAML kept byte for byte, a validated parsed view, and the SHA.
//!
//! A manifest is written back exactly as it was received (comments, key order and any PGP
//! clear-signature included), because preparers may verify the signature over those bytes.
//! Its SHA is instead P2's `manifest.SHA()`: the hex SHA-256 of P2's canonical re-rendering of
//! the parsed manifest (see the `p2_yaml` module), so reformatting or re-signing a manifest does not
//! make it look changed, and a SHA written by P2 (a DS farm's `manifest_sha`) compares equal.

mod p2_yaml;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{LazyLock, Mutex, PoisonError};

use base64::alphabet;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use yaml_serde::{Mapping, Value};

use super::{FieldError, PodId};

const BEGIN_SIGNED: &str = "-----BEGIN PGP SIGNED MESSAGE-----";
const BEGIN_SIGNATURE: &str = "-----BEGIN PGP SIGNATURE-----";
const END_SIGNATURE: &str = "-----END PGP SIGNATURE-----";
/// Health-check path used when the manifest names none.
const DEFAULT_STATUS_PATH: &str = "/_status";

/// A validated pod manifest. Two manifests are equal when their raw bytes are equal; compare
/// [`Manifest::sha`] to ask whether they describe the same pod.
#[derive(Clone)]
pub struct Manifest {
    raw: String,
    pod_id: String,
    sha: String,
    signed: bool,
    health_check: Option<HealthCheck>,
}

/// How the preparer checks a pod's health (HTTP HEAD on `port` and `path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// TCP port of the status endpoint: P2's Go `int`, not range-checked by P2 (a port no
    /// endpoint can have just fails its checks).
    pub port: i64,
    /// Request path, always starting with `/`.
    pub path: String,
    /// Plain HTTP instead of HTTPS.
    pub http: bool,
}

/// The manifests parsed lately, by their text: every replica of an RC stores the same
/// manifest, and each pod listing and farm pass decodes the stored ones again, so a text
/// is parsed once rather than on every read. Emptied once it holds [`PARSED_BYTES`].
static PARSED: LazyLock<Mutex<Parsed>> = LazyLock::new(Mutex::default);

/// The text [`PARSED`] may hold, counted twice (the key and the manifest's own copy).
const PARSED_BYTES: usize = 8 << 20;

#[derive(Default)]
struct Parsed {
    by_text: HashMap<String, Manifest>,
    bytes: usize,
}

impl Manifest {
    /// Parses and validates manifest text, plain YAML or PGP clear-signed YAML, returning
    /// every validation problem at once.
    pub fn parse(raw: &str) -> Result<Manifest, Vec<FieldError>> {
        let lock = || PARSED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(parsed) = lock().by_text.get(raw) {
            return Ok(parsed.clone());
        }
        let parsed = Manifest::parse_text(raw)?;
        let mut memo = lock();
        if memo.bytes + 2 * raw.len() > PARSED_BYTES {
            *memo = Parsed::default();
        }
        memo.bytes += 2 * raw.len();
        memo.by_text.insert(raw.to_owned(), parsed.clone());
        Ok(parsed)
    }

    /// [`Manifest::parse`], without the memo.
    fn parse_text(raw: &str) -> Result<Manifest, Vec<FieldError>> {
        if raw.trim().is_empty() {
            return Err(vec![FieldError::new("manifest", "is empty")]);
        }
        let (text, signed) = match signed_plaintext(raw) {
            Some(Ok(text)) => (Cow::Owned(text), true),
            // A message Go's clearsign cannot read leaves P2 reading the whole text as
            // YAML, which it can when the armor's first line is inside a YAML mapping; a
            // message it reads whose signature P2 cannot read is refused.
            Some(Err(Unread::Message(_))) if is_yaml_mapping(raw) => (Cow::Borrowed(raw), false),
            Some(Err(Unread::Message(why) | Unread::Signature(why))) => {
                return Err(vec![FieldError::new("manifest", why)])
            }
            None => (Cow::Borrowed(raw), false),
        };
        let document = p2_yaml::parse(&text).map_err(|e| {
            let message = match e {
                p2_yaml::ParseError::Syntax(e) => format!("is not valid YAML: {e}"),
                p2_yaml::ParseError::MergeKey(e) => format!("bad YAML merge key: {e}"),
            };
            vec![FieldError::new("manifest", message)]
        })?;
        let yaml = document.yaml();
        let Value::Mapping(top) = untag(&yaml) else {
            return Err(vec![FieldError::new("manifest", "must be a YAML mapping")]);
        };

        let mut problems = Vec::new();
        let pod_id = string_field(top, "id", "id", &mut problems).unwrap_or_default();
        if pod_id.is_empty() && problems.is_empty() {
            problems.push(FieldError::new("id", "is required"));
        }
        check_launchables(top, &mut problems);
        check_health_fields(top, &mut problems);
        if !problems.is_empty() {
            return Err(problems);
        }

        let reading = document.read().map_err(|e| {
            vec![FieldError::new(
                "manifest",
                format!("cannot be read as P2 reads it: {e}"),
            )]
        })?;
        let sha = sha256_hex(&reading.canonical);
        let health_check = health_check(&reading.status);
        Ok(Manifest {
            raw: raw.to_owned(),
            // P2's reading, which keeps the text of an `id` such as `1.10`.
            pod_id: reading.pod_id,
            sha,
            signed,
            health_check,
        })
    }

    /// Builds a manifest from a JSON object, for API clients that send the manifest as JSON
    /// rather than YAML text; the stored raw form is that object as P2's YAML writer renders
    /// it, so that P2 reads back the values the JSON holds.
    pub fn from_json_value(value: &serde_json::Value) -> Result<Manifest, Vec<FieldError>> {
        if !value.is_object() {
            return Err(vec![FieldError::new(
                "manifest",
                "must be a YAML string or a JSON object",
            )]);
        }
        Manifest::parse(&p2_yaml::from_json(value))
    }

    /// A manifest a client sends for a new or changed RC or daemon set, as YAML text or a
    /// JSON object, held to the pod-id rule ([`PodId`]) as well. Manifests read back from the
    /// store are not, so that documents written by other tools stay readable.
    pub fn from_request(value: &serde_json::Value) -> Result<Manifest, Vec<FieldError>> {
        let manifest = match value {
            serde_json::Value::String(text) => Manifest::parse(text),
            other => Manifest::from_json_value(other),
        }?;
        PodId::check(manifest.pod_id()).map_err(|e| vec![FieldError::new("id", e.to_string())])?;
        Ok(manifest)
    }

    /// The bytes exactly as received; this is what gets stored and written to intents.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The pod ID (the manifest's `id`), never empty.
    pub fn pod_id(&self) -> &str {
        &self.pod_id
    }

    /// P2's `manifest.SHA()`: hex SHA-256 of P2's canonical rendering; equal for manifests
    /// that differ only in comments, formatting, key order, keys P2 does not know, or
    /// signature. Every SHA comparison goes through this one function.
    pub fn sha(&self) -> String {
        self.sha.clone()
    }

    /// Whether the raw form is PGP clear-signed.
    pub fn is_signed(&self) -> bool {
        self.signed
    }

    /// The health check the preparer will run, or `None` when the manifest has no status
    /// port, which means the pod always counts as healthy.
    pub fn health_check(&self) -> Option<&HealthCheck> {
        self.health_check.as_ref()
    }
}

impl PartialEq for Manifest {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Manifest {}

impl fmt::Debug for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manifest")
            .field("pod_id", &self.pod_id)
            .field("sha", &self.sha)
            .field("signed", &self.signed)
            .finish_non_exhaustive()
    }
}

/// Serializes as the raw YAML string, as stored documents carry it.
impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

/// Accepts YAML text or a JSON object, the two forms API clients send.
impl<'de> Deserialize<'de> for Manifest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let parsed = match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(text) => Manifest::parse(&text),
            other => Manifest::from_json_value(&other),
        };
        parsed.map_err(|errors| de::Error::custom(super::join_errors(&errors)))
    }
}

/// Manifest problems reported under `at`, the field holding the manifest (for example
/// `new_rc.manifest`).
pub fn errors_at(at: &str, errors: Vec<FieldError>) -> Vec<FieldError> {
    errors
        .into_iter()
        .map(|e| {
            let field = if e.field == "manifest" {
                at.to_owned()
            } else {
                format!("{at}.{}", e.field)
            };
            FieldError::new(field, e.message)
        })
        .collect()
}

/// The signed plaintext of a PGP clear-signed message, `None` when `raw` is not one, as Go's
/// clearsign package gives it to P2.
///
/// The message begins at the first line that starts with its armor's first line, wherever
/// that line is: Go's clearsign looks for it at the start of the text and after every line
/// break, and what comes before it is not part of the message (a comment a tool put on top
/// of a signed file).
///
/// Armor header lines (such as `Hash: SHA256`) each hold a `:` and end at the first empty
/// line; the text runs up to the signature block, with RFC 4880 dash-escaping (`- ` before
/// lines starting with `-`) undone and the blanks ending each line dropped (RFC 4880 signs
/// the text without them, and they would change a block scalar's value, so the SHA). The
/// signature block must be armor P2 can read ([`readable_signature`]).
fn signed_plaintext(raw: &str) -> Option<Result<String, Unread>> {
    let mut lines = raw.lines();
    lines.by_ref().find(|line| line.starts_with(BEGIN_SIGNED))?;
    loop {
        match lines.next() {
            None => {
                return Some(Err(Unread::Message(
                    "signed manifest has no blank line after its armor headers",
                )))
            }
            Some("") => break,
            Some(header) if header.contains(':') => {}
            Some(_) => {
                return Some(Err(Unread::Message(
                    "signed manifest has an armor header without ':'",
                )))
            }
        }
    }
    let mut text = String::new();
    for line in lines.by_ref() {
        if line == BEGIN_SIGNATURE {
            return Some(readable_signature(lines).map(|()| text));
        }
        let line = line.strip_prefix("- ").unwrap_or(line);
        text.push_str(line.trim_end_matches([' ', '\t']));
        text.push('\n');
    }
    Some(Err(Unread::Message(
        "signed manifest has no signature block",
    )))
}

const UNREADABLE: &str = "signed manifest's signature block is not readable armor";
const UNTERMINATED: &str = "signed manifest's signature block is not terminated";

/// Why P2 does not read a clear-signed message as signed.
#[derive(Debug)]
enum Unread {
    /// Go's clearsign cannot read the message (its framing, or its signature block's armor
    /// headers): P2 reads the whole text as YAML instead.
    Message(&'static str),
    /// Go's clearsign reads the message, but not its signature block's body, which P2's
    /// `manifest.FromBytes` reads whole: P2 refuses the manifest.
    Signature(&'static str),
}

/// Whether `text` is a YAML mapping, as an unsigned manifest is.
fn is_yaml_mapping(text: &str) -> bool {
    p2_yaml::parse(text).is_ok_and(|document| matches!(untag(&document.yaml()), Value::Mapping(_)))
}

/// Checks the lines after `-----BEGIN PGP SIGNATURE-----` as P2 reads them: Go's armor
/// decoder wants `Key: value` header lines ended by an empty line, then base64 lines of at
/// most 96 bytes, a `=` line holding the CRC-24 of the bytes they decode to, and the end
/// line. Headers it cannot read leave Go's clearsign reading no message
/// ([`Unread::Message`]); past them, P2's `manifest.FromBytes` reads the signature whole and
/// refuses the manifest when any of it is wrong ([`Unread::Signature`]). The signature
/// itself is not verified here; preparers do that.
fn readable_signature<'a>(mut lines: impl Iterator<Item = &'a str>) -> Result<(), Unread> {
    // Go's armor decoder reads the headers when clearsign decodes the message.
    loop {
        match lines.next().map(str::trim) {
            None => return Err(Unread::Message(UNTERMINATED)),
            Some("") => break,
            Some(header) if header.contains(": ") => {}
            Some(_) => return Err(Unread::Message(UNREADABLE)),
        }
    }
    signature_body(lines).map_err(Unread::Signature)
}

/// Checks the base64 lines, checksum and end line of a signature block, which P2 reads
/// only once clearsign has decoded the message ([`readable_signature`]).
fn signature_body<'a>(mut lines: impl Iterator<Item = &'a str>) -> Result<(), &'static str> {
    let mut body = String::new();
    while let Some(line) = lines.next() {
        if let Some(checksum) = line.strip_prefix('=').filter(|_| line.len() == 5) {
            let checksum = ARMOR_BASE64.decode(checksum).map_err(|_| UNREADABLE)?;
            let data = ARMOR_BASE64.decode(&body).map_err(|_| UNREADABLE)?;
            let [a, b, c] = checksum[..] else {
                return Err(UNREADABLE);
            };
            if crc24(&data) != u32::from_be_bytes([0, a, b, c]) {
                return Err("signed manifest's signature block fails its checksum");
            }
            return match lines.next() {
                Some(END_SIGNATURE) => Ok(()),
                Some(_) => Err(UNREADABLE),
                None => Err(UNTERMINATED),
            };
        }
        if line == END_SIGNATURE || line.len() > 96 {
            return Err(UNREADABLE);
        }
        body.push_str(line);
    }
    Err(UNTERMINATED)
}

/// Base64 as Go's `StdEncoding` decodes it: padded, with any trailing bits.
const ARMOR_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// The OpenPGP armor checksum (RFC 4880 6.1).
fn crc24(data: &[u8]) -> u32 {
    let mut crc: u32 = 0xB7_04CE;
    for &byte in data {
        crc ^= u32::from(byte) << 16;
        for _ in 0..8 {
            crc <<= 1;
            if crc & 0x100_0000 != 0 {
                crc ^= 0x186_4CFB;
            }
        }
    }
    crc & 0xFF_FFFF
}

/// P2's launchable rules: a type is required; hoist and opencontainer need exactly one of
/// `location` or `version.id`; docker needs `image.name` and `image.sha256`.
fn check_launchables(top: &Mapping, problems: &mut Vec<FieldError>) {
    let launchables = match top.get("launchables").map(untag) {
        None | Some(Value::Null) => return,
        Some(Value::Mapping(launchables)) => launchables,
        Some(_) => {
            problems.push(FieldError::new(
                "launchables",
                "must be a mapping of launchable ID to launchable",
            ));
            return;
        }
    };
    for (key, stanza) in launchables {
        let id = scalar_text(key).unwrap_or_else(|| "?".to_owned());
        let path = format!("launchables.{id}");
        let empty = Mapping::new();
        let stanza = match untag(stanza) {
            Value::Mapping(stanza) => stanza,
            Value::Null => &empty,
            _ => {
                problems.push(FieldError::new(path, "must be a mapping"));
                continue;
            }
        };
        let field = |name: &str| format!("{path}.{name}");
        let launchable_type = string_field(
            stanza,
            "launchable_type",
            &field("launchable_type"),
            problems,
        );
        match launchable_type.as_deref().unwrap_or("") {
            "" => problems.push(FieldError::new(field("launchable_type"), "is required")),
            "hoist" | "opencontainer" => {
                let location = non_empty(string_field(
                    stanza,
                    "location",
                    &field("location"),
                    problems,
                ));
                let version_id =
                    nested_string(stanza, "version", "id", &field("version"), problems);
                match (location, version_id) {
                    (Some(_), Some(_)) => problems.push(FieldError::new(
                        field("location"),
                        "set either location or version.id, not both",
                    )),
                    (None, None) => problems.push(FieldError::new(
                        field("location"),
                        "one of location or version.id is required",
                    )),
                    _ => {}
                }
            }
            "docker" => {
                for name in ["name", "sha256"] {
                    if nested_string(stanza, "image", name, &field("image"), problems).is_none() {
                        problems.push(FieldError::new(
                            field(&format!("image.{name}")),
                            "is required",
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Reports the health-check fields P2 cannot read, each by its path; their values are
/// taken from P2's reading ([`health_check`]).
fn check_health_fields(top: &Mapping, problems: &mut Vec<FieldError>) {
    let empty = Mapping::new();
    let status = match top.get("status").map(untag) {
        None | Some(Value::Null) => &empty,
        Some(Value::Mapping(status)) => status,
        Some(_) => {
            problems.push(FieldError::new("status", "must be a mapping"));
            &empty
        }
    };
    port_field(top, "status_port", "status_port", problems);
    port_field(status, "port", "status.port", problems);
    bool_field(top, "status_http", "status_http", problems);
    bool_field(status, "http", "status.http", problems);
    string_field(status, "path", "status.path", problems);
}

/// P2's health-check derivation from its getters: no port means no check; plain HTTP if
/// either flag says so; the path is `path.Join("/", status.path)`, `/_status` when none.
fn health_check(status: &p2_yaml::P2Status) -> Option<HealthCheck> {
    if status.port == 0 {
        return None;
    }
    let path = match status.path.as_str() {
        "" => DEFAULT_STATUS_PATH.to_owned(),
        path => rooted_clean(path),
    };
    Some(HealthCheck {
        port: status.port,
        path,
        http: status.http,
    })
}

/// Go's `path.Join("/", path)`: the path made absolute and cleaned (no empty, `.` or `..`
/// segments, no trailing `/`).
fn rooted_clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    format!("/{}", segments.join("/"))
}

fn untag(value: &Value) -> &Value {
    match value {
        Value::Tagged(tagged) => untag(&tagged.value),
        other => other,
    }
}

/// The text of a scalar as a Go string field would receive it; `None` for collections.
fn scalar_text(value: &Value) -> Option<String> {
    match untag(value) {
        Value::Null => Some(String::new()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|text| !text.is_empty())
}

/// A string-typed key; a collection where a string belongs is a problem.
fn string_field(
    map: &Mapping,
    key: &str,
    path: &str,
    problems: &mut Vec<FieldError>,
) -> Option<String> {
    let value = map.get(key)?;
    let text = scalar_text(value);
    if text.is_none() {
        problems.push(FieldError::new(path, "must be a string"));
    }
    text
}

/// The non-empty string at `outer.inner`, such as `version.id`.
fn nested_string(
    map: &Mapping,
    outer: &str,
    inner: &str,
    path: &str,
    problems: &mut Vec<FieldError>,
) -> Option<String> {
    match map.get(outer).map(untag) {
        None | Some(Value::Null) => None,
        Some(Value::Mapping(nested)) => non_empty(string_field(
            nested,
            inner,
            &format!("{path}.{inner}"),
            problems,
        )),
        Some(_) => {
            problems.push(FieldError::new(path, "must be a mapping"));
            None
        }
    }
}

/// Reports a port P2 cannot read into its Go `int`: any integer, a float truncated.
fn port_field(map: &Mapping, key: &str, path: &str, problems: &mut Vec<FieldError>) {
    let readable = match map.get(key).map(untag) {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => {
            n.as_i64().is_some()
                || n.as_f64()
                    .is_some_and(|f| f.is_finite() && f.abs() < 9.2e18)
        }
        // YAML 1.1 integers YAML 1.2 reads as text (`8_080`, `0b1010`).
        Some(Value::String(text)) => p2_yaml::go_int(text).is_some(),
        Some(_) => false,
    };
    if !readable {
        problems.push(FieldError::new(path, "must be an integer"));
    }
}

/// Reports a boolean P2 cannot read; the YAML 1.1 spellings (`yes`, `on`, ...) that P2's
/// YAML library reads as booleans are booleans.
fn bool_field(map: &Mapping, key: &str, path: &str, problems: &mut Vec<FieldError>) {
    let readable = match map.get(key).map(untag) {
        None | Some(Value::Null | Value::Bool(_)) => true,
        Some(Value::String(text)) => p2_yaml::go_bool(text).is_some(),
        Some(_) => false,
    };
    if !readable {
        problems.push(FieldError::new(path, "must be a boolean"));
    }
}

/// Lowercase hex SHA-256, the form P2 writes SHAs in.
fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_3881c78e.tar.gz\nconfig:\n  ENVIRONMENT: production\nstatus:\n  port: 43770\n  http: true\n";

    #[test]
    fn a_text_parsed_again_comes_from_the_memo_and_invalid_ones_are_not_kept() {
        let raw = format!("{HELLO}# remembered\n");
        let first = Manifest::parse(&raw).unwrap();
        let held = |raw: &str| PARSED.lock().unwrap().by_text.contains_key(raw);
        assert!(held(&raw));
        let again = Manifest::parse(&raw).unwrap();
        assert_eq!((again.raw(), again.sha()), (first.raw(), first.sha()));
        assert!(Manifest::parse("id: [").is_err());
        assert!(!held("id: ["));
        assert!(PARSED.lock().unwrap().bytes <= PARSED_BYTES);
    }

    fn errors(raw: &str) -> Vec<String> {
        Manifest::parse(raw)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn keeps_raw_bytes_and_reads_the_pod_id() {
        let raw = "# deployed by hand\nid:   hello   # the app\nlaunchables: {}\n";
        let manifest = Manifest::parse(raw).unwrap();
        assert_eq!(manifest.raw(), raw);
        assert_eq!(manifest.pod_id(), "hello");
        assert!(!manifest.is_signed());
        assert_eq!(serde_json::to_value(&manifest).unwrap(), raw);
    }

    #[test]
    fn sha_ignores_comments_indentation_key_order_and_flow_style() {
        let base = Manifest::parse(HELLO).unwrap();
        let variants = [
            "# comment\nstatus: {http: true, port: 43770}\nconfig:\n    ENVIRONMENT: production   # prod\nlaunchables:\n    app:\n        location: https://artifacts.example.com/hello_3881c78e.tar.gz\n        launchable_type: hoist\nid: hello\n",
            "{\"id\": \"hello\", \"launchables\": {\"app\": {\"launchable_type\": \"hoist\", \"location\": \"https://artifacts.example.com/hello_3881c78e.tar.gz\"}}, \"config\": {\"ENVIRONMENT\": \"production\"}, \"status\": {\"port\": 43770, \"http\": true}}",
        ];
        for variant in variants {
            let other = Manifest::parse(variant).unwrap();
            assert_eq!(other.sha(), base.sha(), "{variant}");
            assert_ne!(other, base);
        }
        assert_eq!(base.sha().len(), 64);
        assert!(base.sha().bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn sha_changes_with_content() {
        let base = Manifest::parse(HELLO).unwrap();
        for changed in [
            HELLO.replace("production", "staging"),
            HELLO.replace("43770", "43771"),
            HELLO.replace("app:", "main:"),
            format!("{HELLO}run_as: nobody\n"),
        ] {
            assert_ne!(
                Manifest::parse(&changed).unwrap().sha(),
                base.sha(),
                "{changed}"
            );
        }
    }

    #[test]
    fn sha_is_p2s_and_ignores_quoting_and_keys_p2_does_not_know() {
        let base = Manifest::parse(HELLO).unwrap();
        for same in [
            HELLO.replace("ENVIRONMENT: production", "ENVIRONMENT: 'production'"),
            format!("{HELLO}tags:\n- blue\n"),
        ] {
            assert_eq!(Manifest::parse(&same).unwrap().sha(), base.sha(), "{same}");
        }
        // P2 cannot read a quoted string into its boolean field, so neither do we.
        let problems = Manifest::parse(&HELLO.replace("http: true", "http: \"true\"")).unwrap_err();
        assert!(
            problems[0].message.contains("as P2 reads it"),
            "{problems:?}"
        );
    }

    /// A signature block Go's armor decoder reads: base64 of "p2" and its CRC-24.
    const SIGNATURE: &str =
        "-----BEGIN PGP SIGNATURE-----\nVersion: test\n\ncDI=\n=ar9S\n-----END PGP SIGNATURE-----\n";

    /// P2 reads a signed manifest only when Go's clearsign and armor packages read its
    /// framing and its signature block whole (`manifest.FromBytes` reads the signature), so
    /// one they cannot read is refused here too rather than stored where P2 cannot decode it.
    #[test]
    fn refuses_signed_manifests_p2_cannot_read() {
        let signed = |headers: &str, block: &str| {
            format!(
                "{BEGIN_SIGNED}\n{headers}\n\nid: x\n{BEGIN_SIGNATURE}\n{block}{END_SIGNATURE}\n"
            )
        };
        assert_eq!(
            Manifest::parse(&signed("Hash: SHA256", "\ncDI=\n=ar9S\n"))
                .unwrap()
                .pod_id(),
            "x"
        );
        for (raw, why) in [
            (
                signed("Hash: SHA256", "cDI=\n=ar9S\n"),
                "not readable armor",
            ),
            (
                signed("Hash: SHA256", "\ncDI=\n=abcd\n"),
                "fails its checksum",
            ),
            (signed("Hash: SHA256", "\ncDI=\n"), "not readable armor"),
            (
                signed("Hash: SHA256", "\niQEcBAEBCAAGBQJeHdummy\n=ar9S\n"),
                "not readable armor",
            ),
            (
                signed("Hash: SHA256", "Version test\n\ncDI=\n=ar9S\n"),
                "not readable armor",
            ),
            (
                signed("Hash SHA256", "\ncDI=\n=ar9S\n"),
                "armor header without ':'",
            ),
            (
                signed("Hash: SHA256\n ", "\ncDI=\n=ar9S\n"),
                "armor header without ':'",
            ),
        ] {
            let errors = errors(&raw);
            assert!(
                errors.len() == 1 && errors[0].contains(why),
                "{raw}: {errors:?}"
            );
        }
        let trailing_blank = format!(
            "{BEGIN_SIGNED}\n\nid: x\n{BEGIN_SIGNATURE} \n\ncDI=\n=ar9S\n{END_SIGNATURE}\n"
        );
        assert_eq!(
            errors(&trailing_blank),
            ["manifest: signed manifest has no signature block"]
        );
    }

    #[test]
    fn reads_clear_signed_manifests() {
        let plaintext = format!("{HELLO}run_as: blue\ntags:\n- blue\n");
        let signed = format!(
            "{BEGIN_SIGNED}\nHash: SHA256\n\n{HELLO}run_as: blue\ntags:\n- - blue\n{SIGNATURE}"
        );
        let manifest = Manifest::parse(&signed).unwrap();
        assert!(manifest.is_signed());
        assert_eq!(manifest.raw(), signed);
        assert_eq!(manifest.pod_id(), "hello");
        assert_eq!(manifest.sha(), Manifest::parse(&plaintext).unwrap().sha());
        assert_ne!(manifest.sha(), Manifest::parse(HELLO).unwrap().sha());
    }

    /// Go's clearsign finds the armor's first line at the start of the text or at the start
    /// of any later line, and P2 reads the manifest from the signed text alone: lines before
    /// the armor (a comment a tool put on top) are not part of it.
    #[test]
    fn reads_clear_signed_manifests_after_text_before_the_armor() {
        let plaintext = format!("{HELLO}run_as: blue\n");
        let armored = format!("{BEGIN_SIGNED}\nHash: SHA256\n\n{plaintext}{SIGNATURE}");
        for before in [
            "# signed by the release tool\n",
            "id: not-this-one\n\n",
            "\u{a0}\n",
        ] {
            let raw = format!("{before}{armored}");
            let manifest = Manifest::parse(&raw).unwrap_or_else(|e| panic!("{raw}: {e:?}"));
            assert!(manifest.is_signed(), "{raw}");
            assert_eq!(manifest.raw(), raw);
            assert_eq!(manifest.pod_id(), "hello", "{raw}");
            assert_eq!(
                manifest.sha(),
                Manifest::parse(&plaintext).unwrap().sha(),
                "{raw}"
            );
        }
        // Only a line that starts with the armor's first line begins it, as in Go; and a
        // message Go cannot read leaves P2 reading the text as YAML.
        for unsigned in [
            format!("id: x\nconfig:\n  note: |\n    {BEGIN_SIGNED}\n"),
            format!("id: x\nnote: \"a\n{BEGIN_SIGNED}\n b\"\n"),
        ] {
            let manifest = Manifest::parse(&unsigned).unwrap();
            assert!(!manifest.is_signed(), "{unsigned}");
            assert_eq!(manifest.pod_id(), "x", "{unsigned}");
        }
    }

    /// Once Go's clearsign reads a message, P2 reads its signature whole and refuses the
    /// manifest when it cannot (`manifest.FromBytes`): it reads the text as YAML only when
    /// clearsign finds no message. A YAML mapping holding a message whose signature fails its
    /// checksum or is not armor is refused, not taken as unsigned; one holding a message
    /// clearsign cannot read (an armor header without `:`) is YAML.
    #[test]
    fn a_message_inside_yaml_whose_signature_p2_cannot_read_is_refused() {
        let inside = |headers: &str, block: &str| {
            format!(
                "id: x\nnote: \"\n{BEGIN_SIGNED}\n{headers}\n\nid: y\n{BEGIN_SIGNATURE}\n\
                 {block}{END_SIGNATURE}\n\"\n"
            )
        };
        let signed = Manifest::parse(&inside("Hash: SHA256", "\ncDI=\n=ar9S\n")).unwrap();
        assert!(signed.is_signed());
        assert_eq!(signed.pod_id(), "y");
        for (block, why) in [
            ("\ncDI=\n=abcd\n", "fails its checksum"),
            ("\ncDI=\n=ar9S\nmore\n", "not readable armor"),
            (
                &format!("\n{}\n=ar9S\n", "A".repeat(100)),
                "not readable armor",
            ),
        ] {
            let raw = inside("Hash: SHA256", block);
            assert!(is_yaml_mapping(&raw), "{raw}");
            let errors = Manifest::parse(&raw).map(|m| m.pod_id().to_owned());
            assert!(
                errors
                    .as_ref()
                    .is_err_and(|e| e.len() == 1 && e[0].to_string().contains(why)),
                "{raw}: {errors:?}"
            );
        }
        let unreadable = Manifest::parse(&inside("Hash SHA256", "\ncDI=\n=ar9S\n")).unwrap();
        assert!(!unreadable.is_signed());
        assert_eq!(unreadable.pod_id(), "x");
    }

    #[test]
    fn signed_lines_lose_their_trailing_blanks_as_p2_reads_them() {
        let script =
            |ending: &str| format!("id: hello\nconfig:\n  script: |\n    echo hi{ending}\n");
        let signed = format!(
            "{BEGIN_SIGNED}\nHash: SHA256\n\n{}{SIGNATURE}",
            script(" \t ")
        );
        let trimmed = Manifest::parse(&script("")).unwrap().sha();
        assert_ne!(Manifest::parse(&script(" \t ")).unwrap().sha(), trimmed);
        assert_eq!(Manifest::parse(&signed).unwrap().sha(), trimmed);
    }

    #[test]
    fn reads_clear_signed_manifests_with_crlf_line_ends() {
        let signed = format!(
            "{BEGIN_SIGNED}\r\nHash: SHA512\r\n\r\nid: crlf\r\n{}",
            SIGNATURE.replace('\n', "\r\n")
        );
        assert_eq!(Manifest::parse(&signed).unwrap().pod_id(), "crlf");
    }

    #[test]
    fn rejects_broken_signed_manifests() {
        let no_blank = format!("{BEGIN_SIGNED}\nHash: SHA256\n");
        let no_signature = format!("{BEGIN_SIGNED}\nHash: SHA256\n\nid: x\n");
        let unterminated = format!("{BEGIN_SIGNED}\n\nid: x\n{BEGIN_SIGNATURE}\nabc\n");
        for raw in [no_blank, no_signature, unterminated] {
            let errors = errors(&raw);
            assert_eq!(errors.len(), 1, "{raw}");
            assert!(
                errors[0].starts_with("manifest: signed manifest"),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn requires_a_non_empty_id() {
        assert_eq!(errors("launchables: {}\n"), ["id: is required"]);
        assert_eq!(errors("id: ''\n"), ["id: is required"]);
        assert_eq!(errors("id: [a]\n"), ["id: must be a string"]);
        assert_eq!(Manifest::parse("id: 42\n").unwrap().pod_id(), "42");
    }

    #[test]
    fn reads_the_first_document_as_p2_does() {
        let first = Manifest::parse(HELLO).unwrap();
        for raw in [format!("{HELLO}---\n"), format!("{HELLO}---\nid: other\n")] {
            let manifest = Manifest::parse(&raw).unwrap();
            assert_eq!(manifest.pod_id(), "hello", "{raw}");
            assert_eq!(manifest.sha(), first.sha(), "{raw}");
            assert_eq!(manifest.raw(), raw);
        }
    }

    #[test]
    fn rejects_empty_and_non_mapping_documents() {
        assert_eq!(errors("  \n"), ["manifest: is empty"]);
        assert_eq!(errors("- a\n- b\n"), ["manifest: must be a YAML mapping"]);
        assert!(errors("id: [unclosed\n")[0].starts_with("manifest: is not valid YAML"));
    }

    #[test]
    fn validates_every_launchable_and_reports_all_problems() {
        let raw = "\
launchables:
  untyped:
    location: https://a/b.tar.gz
  both:
    launchable_type: hoist
    location: https://a/b.tar.gz
    version: {id: v1}
  neither:
    launchable_type: opencontainer
  docker_bare:
    launchable_type: docker
    image: {name: web}
  fine_hoist:
    launchable_type: hoist
    version: {id: v2, artifact_name: web}
  fine_docker:
    launchable_type: docker
    image: {name: web, sha256: abc}
  other:
    launchable_type: something_else
";
        assert_eq!(
            errors(raw),
            [
                "id: is required",
                "launchables.untyped.launchable_type: is required",
                "launchables.both.location: set either location or version.id, not both",
                "launchables.neither.location: one of location or version.id is required",
                "launchables.docker_bare.image.sha256: is required",
            ]
        );
    }

    #[test]
    fn rejects_malformed_launchable_sections() {
        assert_eq!(
            errors("id: x\nlaunchables: [a]\n"),
            ["launchables: must be a mapping of launchable ID to launchable"]
        );
        assert_eq!(
            errors("id: x\nlaunchables:\n  a: 5\n  b:\n"),
            [
                "launchables.a: must be a mapping",
                "launchables.b.launchable_type: is required"
            ]
        );
        assert_eq!(
            errors("id: x\nlaunchables:\n  a: {launchable_type: hoist, version: v1}\n"),
            [
                "launchables.a.version: must be a mapping",
                "launchables.a.location: one of location or version.id is required"
            ]
        );
    }

    #[test]
    fn derives_health_checks() {
        let check = |raw: &str| Manifest::parse(raw).unwrap().health_check().cloned();
        assert_eq!(
            check(HELLO),
            Some(HealthCheck {
                port: 43770,
                path: "/_status".into(),
                http: true
            })
        );
        assert_eq!(
            check("id: a\nstatus_port: 8080\nstatus_http: yes\nstatus: {port: 9, path: health}\n"),
            Some(HealthCheck {
                port: 8080,
                path: "/health".into(),
                http: true
            })
        );
        assert_eq!(
            check("id: a\nstatus_port: 0\nstatus: {port: 9, path: /up}\n"),
            Some(HealthCheck {
                port: 9,
                path: "/up".into(),
                http: false
            })
        );
        assert_eq!(check("id: a\n"), None);
        // Any Go int, a float truncated, as yaml.v2 reads P2's `int` fields.
        assert_eq!(check("id: a\nstatus_port: 70000\n").unwrap().port, 70000);
        assert_eq!(check("id: a\nstatus_port: 8080.0\n").unwrap().port, 8080);
        assert_eq!(
            errors("id: a\nstatus_port: x\nstatus: {http: maybe}\n"),
            [
                "status_port: must be an integer",
                "status.http: must be a boolean"
            ]
        );
    }

    /// A status port is read as P2's yaml.v2 reads its `int` fields: YAML 1.1 integers, with
    /// `_` separators, `0b` binary and a leading `0` for octal, all of which P2 takes.
    #[test]
    fn status_ports_are_read_as_p2_reads_them() {
        let port = |raw: &str| Manifest::parse(raw).map(|m| m.health_check().map(|c| c.port));
        assert_eq!(port("id: a\nstatus_port: 8_080\n"), Ok(Some(8080)));
        assert_eq!(port("id: a\nstatus: {port: 0b1010}\n"), Ok(Some(10)));
        assert_eq!(port("id: a\nstatus_port: 010\n"), Ok(Some(8)));
        assert_eq!(
            port("id: a\nstatus: {port: \"8080\"}\n").map_err(|_| ()),
            Err(())
        );
    }

    /// The path is P2's `path.Join("/", status.path)`, cleaned as Go cleans it.
    #[test]
    fn status_paths_are_cleaned_as_p2_joins_them() {
        let path = |p: &str| {
            let raw = format!("id: a\nstatus: {{port: 9, path: '{p}'}}\n");
            Manifest::parse(&raw)
                .unwrap()
                .health_check()
                .unwrap()
                .path
                .clone()
        };
        assert_eq!(path("health/"), "/health");
        assert_eq!(path("//up"), "/up");
        assert_eq!(path("/a/./b/../c"), "/a/c");
        assert_eq!(path("../x"), "/x");
        assert_eq!(path("/"), "/");
    }

    /// P2 reads `id` into a Go string, which takes a scalar's text as written: `1.10` is
    /// the pod `1.10`, not the number 1.1.
    #[test]
    fn the_pod_id_is_the_text_p2_reads() {
        for id in ["1.10", "0x1F", "True", "1e3", "+12", "010"] {
            let manifest = Manifest::parse(&format!("id: {id}\n")).unwrap();
            assert_eq!(manifest.pod_id(), id);
        }
    }

    /// P2's YAML library (yaml.v2, non-strict) takes a mapping that repeats a key, and the
    /// last value is the one decoded: the manifest is P2's, with P2's pod id and SHA.
    #[test]
    fn a_repeated_key_is_read_as_p2_reads_it() {
        let repeated = HELLO
            .replace("id: hello\n", "id: draft\nid: hello\n")
            .replace(
                "  ENVIRONMENT: production\n",
                "  ENVIRONMENT: staging\n  ENVIRONMENT: production\n",
            )
            .replace("  port: 43770\n", "  port: 1\n  port: 43770\n");
        let manifest = Manifest::parse(&repeated).unwrap();
        assert_eq!(manifest.pod_id(), "hello");
        assert_eq!(manifest.sha(), Manifest::parse(HELLO).unwrap().sha());
        assert_eq!(manifest.health_check().unwrap().port, 43770);
        assert!(Manifest::from_request(&serde_json::json!(repeated)).is_ok());
    }

    /// A struct field given twice is decoded into the struct the first one filled, so the
    /// health check has the fields of both `status` stanzas, as P2's has.
    #[test]
    fn a_repeated_status_stanza_adds_to_the_first() {
        let manifest =
            Manifest::parse("id: a\nstatus: {http: true, path: up}\nstatus: {port: 9}\n").unwrap();
        assert_eq!(
            manifest.health_check(),
            Some(&HealthCheck {
                port: 9,
                path: "/up".into(),
                http: true
            })
        );
    }

    #[test]
    fn builds_from_a_json_object() {
        let json = serde_json::json!({
            "id": "hello",
            "launchables": {"app": {"launchable_type": "hoist", "location": "https://artifacts.example.com/hello_3881c78e.tar.gz"}},
            "config": {"ENVIRONMENT": "production"},
            "status": {"port": 43770, "http": true}
        });
        let manifest = Manifest::from_json_value(&json).unwrap();
        assert_eq!(manifest.pod_id(), "hello");
        assert_eq!(manifest.sha(), Manifest::parse(HELLO).unwrap().sha());
        assert_eq!(Manifest::parse(manifest.raw()).unwrap(), manifest);
        assert_eq!(
            Manifest::from_json_value(&serde_json::json!("id: x")).unwrap_err()[0].message,
            "must be a YAML string or a JSON object"
        );
    }

    #[test]
    fn deserializes_from_text_or_object() {
        let from_text: Manifest = serde_json::from_value(serde_json::json!(HELLO)).unwrap();
        assert_eq!(from_text.raw(), HELLO);
        let from_object: Manifest =
            serde_json::from_value(serde_json::json!({"id": "obj"})).unwrap();
        assert_eq!(from_object.pod_id(), "obj");
        let err =
            serde_json::from_value::<Manifest>(serde_json::json!("launchables: {}")).unwrap_err();
        assert_eq!(err.to_string(), "id: is required");
    }
}

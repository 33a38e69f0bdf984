//! P2's canonical form of a manifest: what Go's `yaml.Marshal` (gopkg.in/yaml.v2 as P2 pins
//! it) writes for P2's parsed manifest struct. `manifest.SHA()` hashes exactly these bytes, so
//! producing them byte for byte is what makes our SHAs equal to P2's.
//!
//! Reading follows yaml.v2's decoder: keys the struct does not know are dropped, typed fields
//! take the scalar's text (strings) or its YAML 1.1 resolution (ints, bools), `config` is
//! decoded as untyped YAML, and a key a mapping repeats is decoded again into what its first
//! value filled (P2 reads manifests with yaml.v2's non-strict `Unmarshal`, which refuses no
//! repeated key). Writing follows yaml.v2's encoder and its libyaml emitter: struct fields in
//! declaration order with `omitempty`, map keys in yaml.v2's natural order, block style with
//! two-space indents, strings plain when they would read back as strings (else quoted),
//! literal blocks for multi-line strings, and lines folded at 80 columns.
//!
//! Not modelled: non-scalar map keys, which P2's manifests do not use; a manifest with one
//! gets an error here.

use std::cmp::Ordering;

use serde::de::{
    DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};
use yaml_serde::Value;

/// What P2 reads from a manifest's text (the YAML itself, with any PGP armor already
/// removed).
pub struct P2Reading {
    /// The bytes P2's `manifest.SHA()` hashes.
    pub canonical: String,
    /// The `id` as P2's Go string field holds it: the scalar's text as written (`1.10`, not
    /// the number 1.1).
    pub pod_id: String,
    /// The health-check fields as P2's getters give them.
    pub status: P2Status,
}

/// A manifest's health-check fields as P2's getters read them from its struct:
/// `GetStatusPort` (`status_port` if non-zero, else `status.port`), `GetStatusHTTP` (either
/// `status_http` or `status.http`) and `status.path` as written.
pub struct P2Status {
    pub port: i64,
    pub http: bool,
    pub path: String,
}

/// A manifest's YAML as yaml.v2 decodes it, before P2's field types are applied: merge keys
/// expanded, and a key a mapping repeats decoded again into what its first value filled, as
/// yaml.v2 (non-strict, as P2 reads manifests) does rather than refusing the document.
pub struct Document {
    node: Node,
}

/// Why a manifest's text is not a [`Document`].
pub enum ParseError {
    /// The text is not YAML.
    Syntax(String),
    /// A merge key (`<<`) names something other than mappings.
    MergeKey(String),
}

/// Parses a manifest's text (the YAML itself, with any PGP armor already removed).
pub fn parse(text: &str) -> Result<Document, ParseError> {
    let syntax = |e: yaml_serde::Error| ParseError::Syntax(e.to_string());
    let shape =
        <Shape as serde::Deserialize>::deserialize(first_document(text)?).map_err(syntax)?;
    let node = RawSeed {
        shape: &shape,
        base: text,
    }
    .deserialize(first_document(text)?)
    .map_err(syntax)?;
    let node = decode_into(&node, MANIFEST, None).map_err(ParseError::MergeKey)?;
    Ok(Document { node })
}

/// The stream's first document, the only one yaml.v2's `Unmarshal` reads: P2 takes a
/// manifest from it and never looks at what follows (a `---` and further documents).
fn first_document(text: &str) -> Result<yaml_serde::Deserializer<'_>, ParseError> {
    yaml_serde::Deserializer::from_str(text)
        .next()
        .ok_or_else(|| ParseError::Syntax("the text holds no YAML document".into()))
}

impl Document {
    /// The document as YAML 1.2 values (`1.10` a number, `yes` a string), for the checks
    /// that read it so; it has no repeated keys.
    pub fn yaml(&self) -> Value {
        yaml_value(&self.node)
    }

    /// The document read as P2 reads it; see [`P2Reading`].
    pub fn read(&self) -> Result<P2Reading, String> {
        let manifest = manifest_fields(&self.node)?;
        let text = |value: Option<&Go>| match value {
            Some(Go::Str(text)) => text.clone(),
            _ => String::new(),
        };
        let int = |value: Option<&Go>| value.and_then(int_of).unwrap_or(0);
        let flag = |value: Option<&Go>| matches!(value, Some(Go::Bool(true)));
        let status = field_of(&manifest, "status");
        let status_field = |key| status.and_then(|status| field_of(status, key));
        let status = P2Status {
            port: match int(field_of(&manifest, "status_port")) {
                0 => int(status_field("port")),
                port => port,
            },
            http: flag(field_of(&manifest, "status_http")) || flag(status_field("http")),
            path: text(status_field("path")),
        };
        let pod_id = text(field_of(&manifest, "id"));
        let mut emitter = Emitter::default();
        emitter.node(&manifest, -1, false);
        emitter.document_end();
        Ok(P2Reading {
            canonical: emitter.out,
            pod_id,
            status,
        })
    }
}

/// The value of field `key` of a struct.
fn field_of<'g>(value: &'g Go, key: &str) -> Option<&'g Go> {
    match value {
        Go::Struct(fields) => fields.iter().find(|f| f.key == key).map(|f| &f.value),
        _ => None,
    }
}

/// A plain scalar's text as yaml.v2 decodes it into a Go `int` (YAML 1.1 integers, with `_`
/// separators, `0b` binary and a leading `0` for octal; a float truncated); `None` when it
/// refuses it.
pub fn go_int(text: &str) -> Option<i64> {
    int_of(&resolve(text))
}

/// A plain scalar's text as yaml.v2 decodes it into a Go `bool` (YAML 1.1's `yes`, `on`,
/// ...); `None` when it refuses it.
pub fn go_bool(text: &str) -> Option<bool> {
    match resolve(text) {
        Go::Bool(b) => Some(b),
        _ => None,
    }
}

/// A decoded value as yaml.v2 sets a Go `int` from it.
fn int_of(value: &Go) -> Option<i64> {
    match value {
        Go::Int(n) => Some(*n),
        Go::Float(f) if f.is_finite() && f.abs() < 9.2e18 => Some(*f as i64),
        _ => None,
    }
}

fn yaml_value(node: &Node) -> Value {
    match node {
        Node::Scalar { value, .. } => value.clone(),
        Node::Seq(items) => Value::Sequence(items.iter().map(yaml_value).collect()),
        Node::Map(entries) => Value::Mapping(
            entries
                .iter()
                .map(|(key, value)| (yaml_value(key), yaml_value(value)))
                .collect(),
        ),
    }
}

/// YAML text for a manifest a client sent as a JSON object, written as yaml.v2 writes it, so
/// that P2 reads every value back as the JSON gave it: a string such as `"yes"`, `"on"` or
/// `"1_000"` is quoted, where a YAML 1.2 writer leaves it plain for P2's YAML 1.1 reader to
/// take as a boolean or a number. Numbers keep their full precision.
pub fn from_json(value: &serde_json::Value) -> String {
    let mut emitter = Emitter {
        exact_floats: true,
        ..Emitter::default()
    };
    emitter.node(&json_value(value), -1, false);
    emitter.document_end();
    emitter.out
}

fn json_value(value: &serde_json::Value) -> Go {
    use serde_json::Value as Json;
    match value {
        Json::Null => Go::Null,
        Json::Bool(b) => Go::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(n), _) => Go::Int(n),
            (None, Some(n)) => Go::Uint(n),
            (None, None) => Go::Float(n.as_f64().unwrap_or_default()),
        },
        Json::String(s) => Go::Str(s.clone()),
        Json::Array(items) => Go::Seq(items.iter().map(json_value).collect()),
        Json::Object(entries) => Go::Map(sorted(
            entries
                .iter()
                .map(|(key, value)| (Go::Str(key.clone()), json_value(value)))
                .collect(),
        )),
    }
}

// ---------------------------------------------------------------------------------------
// The document as yaml.v2's decoder sees it: scalars keep their text and whether they were
// plain (only plain scalars are resolved to numbers, booleans or null).

#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// `value` is the scalar as a YAML 1.2 reader takes it.
    Scalar {
        text: String,
        plain: bool,
        value: Value,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// The document's first parse: every node's kind, and each scalar as a YAML 1.2 reader takes
/// it. Unlike a [`Value`], a mapping keeps every entry it has, a repeated key included, so
/// that [`RawSeed`] meets the entries the parser gives it in the same order.
enum Shape {
    Scalar(Value),
    Tagged(Box<Shape>),
    Seq(Vec<Shape>),
    Map(Vec<(Shape, Shape)>),
}

impl<'de> serde::Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        deserializer.deserialize_any(ShapeVisitor)
    }
}

/// Builds a [`Shape`] from what the parser reports, as [`Value`]'s own visitor does.
struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Bool(b)))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Number(n.into())))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Number(n.into())))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Number(f.into())))
    }

    fn visit_str<E>(self, text: &str) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::String(text.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Shape, E> {
        Ok(Shape::Scalar(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Shape, D::Error> {
        serde::Deserialize::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Shape, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = access.next_element()? {
            items.push(item);
        }
        Ok(Shape::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Shape, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = access.next_key()? {
            entries.push((key, access.next_value()?));
        }
        Ok(Shape::Map(entries))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Shape, A::Error> {
        let (tag, contents): (String, _) = data.variant()?;
        if tag.is_empty() {
            return Err(serde::de::Error::custom("empty YAML tag is not allowed"));
        }
        Ok(Shape::Tagged(Box::new(contents.newtype_variant()?)))
    }
}

/// Reads one node from the deserializer, asking for the same shape a first parse found, so
/// that every scalar comes back as its text rather than as a number or boolean.
struct RawSeed<'a, 'de> {
    shape: &'a Shape,
    base: &'de str,
}

impl RawSeed<'_, '_> {
    /// The scalar's YAML 1.2 value, from the first parse.
    fn value(&self) -> Value {
        match self.shape {
            Shape::Scalar(value) => value.clone(),
            _ => Value::Null,
        }
    }
}

impl<'de> DeserializeSeed<'de> for RawSeed<'_, 'de> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        match self.shape {
            Shape::Tagged(tagged) => RawSeed {
                shape: tagged,
                base: self.base,
            }
            .deserialize(deserializer)
            .map(|node| match node {
                // An explicit tag keeps a scalar from being resolved, as in yaml.v2.
                Node::Scalar { text, value, .. } => Node::Scalar {
                    text,
                    plain: false,
                    value,
                },
                other => other,
            }),
            Shape::Map(_) => deserializer.deserialize_map(self),
            Shape::Seq(_) => deserializer.deserialize_seq(self),
            Shape::Scalar(_) => deserializer.deserialize_str(self),
        }
    }
}

impl<'de> Visitor<'de> for RawSeed<'_, 'de> {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("YAML of the shape first parsed")
    }

    /// A scalar the parser could lend from the input: quoted when a quote sits on both sides.
    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Node, E> {
        let start = (text.as_ptr() as usize).wrapping_sub(self.base.as_ptr() as usize);
        let quote = |at: Option<usize>| at.and_then(|at| self.base.as_bytes().get(at).copied());
        let before = start.checked_sub(1).filter(|_| start <= self.base.len());
        let after = Some(start + text.len()).filter(|_| start <= self.base.len());
        let quoted = matches!(
            (quote(before), quote(after)),
            (Some(b'"'), Some(b'"')) | (Some(b'\''), Some(b'\''))
        );
        Ok(Node::Scalar {
            text: text.to_owned(),
            plain: !quoted && !tagged_as_string(self.base, start),
            value: self.value(),
        })
    }

    /// A scalar that is not a slice of the input: escaped, folded or a block scalar, none of
    /// which resolves to anything but a string; or an empty plain scalar.
    fn visit_str<E>(self, text: &str) -> Result<Node, E> {
        Ok(Node::Scalar {
            text: text.to_owned(),
            plain: text.is_empty(),
            value: self.value(),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let Shape::Map(shapes) = self.shape else {
            return Err(serde::de::Error::custom("a mapping where none was"));
        };
        let mut entries = Vec::with_capacity(shapes.len());
        for (key, value) in shapes {
            let key = access.next_key_seed(RawSeed {
                shape: key,
                base: self.base,
            })?;
            let Some(key) = key else { break };
            let value = access.next_value_seed(RawSeed {
                shape: value,
                base: self.base,
            })?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let Shape::Seq(shapes) = self.shape else {
            return Err(serde::de::Error::custom("a sequence where none was"));
        };
        let mut items = Vec::with_capacity(shapes.len());
        for shape in shapes {
            match access.next_element_seed(RawSeed {
                shape,
                base: self.base,
            })? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        Ok(Node::Seq(items))
    }
}

/// Whether the scalar starting at byte `start` of `base` carries the tag `!!str`, with which
/// yaml.v2 takes its text as a string whatever it looks like (`!!str 1` is "1"). yaml_serde
/// applies the core schema's tags itself and reports none of them, so the tag is looked for
/// in the text: the last word before the scalar, or before the scalar's anchor.
fn tagged_as_string(base: &str, start: usize) -> bool {
    let Some(before) = base.get(..start) else {
        return false;
    };
    let mut words = before
        .rsplit([' ', '\t', '\r', '\n', '[', '{', ','])
        .filter(|word| !word.is_empty());
    let tag = match words.next() {
        Some(anchor) if anchor.starts_with('&') => words.next(),
        word => word,
    };
    tag == Some("!!str")
}

// ---------------------------------------------------------------------------------------
// Go values: what yaml.v2 decodes into `interface{}` and encodes back.

#[derive(Debug, Clone, PartialEq)]
enum Go {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Go>),
    /// Entries in yaml.v2's output order (see [`key_less`]).
    Map(Vec<(Go, Go)>),
    /// A struct's fields in declaration order.
    Struct(Vec<Field>),
    /// A non-nil pointer, never omitted by `omitempty` even when what it points to is zero.
    Ptr(Box<Go>),
}

impl Go {
    /// Go's `omitempty` test (yaml.v2 `isZero`) for the value as its field holds it.
    fn is_zero(&self) -> bool {
        match self {
            Go::Null => true,
            Go::Bool(b) => !b,
            Go::Int(n) => *n == 0,
            Go::Uint(n) => *n == 0,
            Go::Float(f) => *f == 0.0,
            Go::Str(s) => s.is_empty(),
            Go::Seq(items) => items.is_empty(),
            Go::Map(entries) => entries.is_empty(),
            Go::Struct(fields) => fields.iter().all(|f| f.value.is_zero()),
            Go::Ptr(_) => false,
        }
    }
}

/// yaml.v2's `resolve` for a plain scalar (YAML 1.1 booleans, Go's integer and float syntax).
fn resolve(text: &str) -> Go {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Go::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Go::Bool(false)
        }
        "" | "~" | "null" | "Null" | "NULL" => return Go::Null,
        ".nan" | ".NaN" | ".NAN" => return Go::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Go::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Go::Float(f64::NEG_INFINITY),
        _ => {}
    }
    match text.as_bytes()[0] {
        b'.' => go_parse_float(text).map_or_else(|| Go::Str(text.to_owned()), Go::Float),
        b'0'..=b'9' | b'+' | b'-' => {
            let plain = text.replace('_', "");
            if let Some(n) = go_parse_int(&plain) {
                return n;
            }
            if let Some(f) = go_parse_float(&plain) {
                return Go::Float(f);
            }
            let (negative, digits) = match plain.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, plain.as_str()),
            };
            if let Some(binary) = digits.strip_prefix("0b") {
                if let Ok(n) = i64::from_str_radix(binary, 2) {
                    return Go::Int(if negative { -n } else { n });
                }
            }
            Go::Str(text.to_owned())
        }
        _ => Go::Str(text.to_owned()),
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`, falling back to `ParseUint`: an optional sign, then
/// `0x`, `0o`, `0b` or a leading `0` (octal) for the base.
fn go_parse_int(text: &str) -> Option<Go> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = if let Some(rest) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        (16, rest)
    } else if let Some(rest) = unsigned
        .strip_prefix("0o")
        .or_else(|| unsigned.strip_prefix("0O"))
    {
        (8, rest)
    } else if let Some(rest) = unsigned
        .strip_prefix("0b")
        .or_else(|| unsigned.strip_prefix("0B"))
    {
        (2, rest)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (8, &unsigned[1..])
    } else {
        (10, unsigned)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if negative {
        // i64::MIN's magnitude is one more than i64::MAX.
        return match magnitude {
            m if m <= i64::MAX as u64 => Some(Go::Int(-(m as i64))),
            m if m == i64::MAX as u64 + 1 => Some(Go::Int(i64::MIN)),
            _ => None,
        };
    }
    Some(i64::try_from(magnitude).map_or(Go::Uint(magnitude), Go::Int))
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal notation and `inf`/`infinity`/`nan`. A
/// number past float64's range is refused, as Go refuses it (`ErrRange`), so yaml.v2 keeps
/// it a string; Rust would read it as infinity.
fn go_parse_float(text: &str) -> Option<f64> {
    let unsigned = text.trim_start_matches(['+', '-']);
    if text.len() - unsigned.len() > 1 {
        return None;
    }
    let special = unsigned.to_ascii_lowercase();
    if matches!(special.as_str(), "inf" | "infinity" | "nan") {
        let value = if special == "nan" {
            f64::NAN
        } else {
            f64::INFINITY
        };
        return Some(if text.starts_with('-') { -value } else { value });
    }
    let decimal = unsigned
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if !decimal || !unsigned.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<f64>().ok().filter(|value| value.is_finite())
}

/// A plain scalar's Go value; anything else is a string.
fn untyped(node: &Node) -> Result<Go, String> {
    match node {
        Node::Scalar {
            text, plain: true, ..
        } => Ok(resolve(text)),
        Node::Scalar { text, .. } => Ok(Go::Str(text.clone())),
        Node::Seq(items) => items
            .iter()
            .map(untyped)
            .collect::<Result<_, _>>()
            .map(Go::Seq),
        Node::Map(entries) => {
            let mut map: Vec<(Go, Go)> = Vec::with_capacity(entries.len());
            for (key, value) in merged(entries)? {
                let key = untyped(key)?;
                if matches!(key, Go::Seq(_) | Go::Map(_)) {
                    return Err("a map key must be a scalar".into());
                }
                let value = untyped(value)?;
                // Like a Go map: a repeated key keeps its last value.
                match map.iter_mut().find(|(k, _)| *k == key) {
                    Some(entry) => entry.1 = value,
                    None => map.push((key, value)),
                }
            }
            Ok(Go::Map(sorted(map)))
        }
    }
}

// ---------------------------------------------------------------------------------------
// P2's manifest struct (pkg/manifest/manifest.go, pkg/launch/launchable.go,
// pkg/cgroups/config.go), read as yaml.v2 reads it into the struct.

/// One struct field on its way out: its YAML key, its value, and whether `omitempty` drops it
/// when the value is Go's zero.
#[derive(Debug, Clone, PartialEq)]
struct Field {
    key: &'static str,
    value: Go,
    omit_empty: bool,
}

fn field(key: &'static str, value: Go) -> Field {
    Field {
        key,
        value,
        omit_empty: false,
    }
}

fn omitempty(key: &'static str, value: Go) -> Field {
    Field {
        key,
        value,
        omit_empty: true,
    }
}

fn struct_value(fields: Vec<Field>) -> Go {
    Go::Struct(fields)
}

/// The keys of a mapping decoded into a struct (their text), in document order; a repeated
/// key's last value wins, as it does in Go.
fn struct_entries<'n>(node: &'n Node, what: &str) -> Result<Vec<(String, &'n Node)>, String> {
    match node {
        Node::Map(entries) => {
            let mut out: Vec<(String, &Node)> = Vec::with_capacity(entries.len());
            for (key, value) in merged(entries)? {
                let key = go_string(key, what)?;
                out.retain(|(k, _)| *k != key);
                out.push((key, value));
            }
            Ok(out)
        }
        node if is_null(node) => Ok(Vec::new()),
        _ => Err(format!("{what} must be a mapping")),
    }
}

/// The Go type yaml.v2 decodes a node into, as far as it decides what a repeated key does:
/// yaml.v2 decodes each value of a key into the place the key names, so a later value adds
/// to a struct or map an earlier one filled (`null` empties it), and replaces anything else.
/// This mirrors the struct readers below ([`manifest_fields`], [`launchable`]).
#[derive(Clone, Copy)]
enum Target {
    /// A struct: its fields of struct or map type; any other field is replaced when repeated.
    Struct(&'static [(&'static str, Target)]),
    /// A map with string keys (its entries decoded afresh as the given type).
    Map(&'static Target),
    /// `map[interface{}]interface{}`: keys compared as the Go values they resolve to.
    UntypedMap,
    /// Anything else (a scalar, a slice, `interface{}`): a repeated key replaces it wholly.
    Replaced,
}

/// P2's `manifest` struct.
const MANIFEST: Target = Target::Struct(&[
    ("launchables", Target::Map(&LAUNCHABLE)),
    ("config", Target::UntypedMap),
    ("status", Target::Struct(&[])),
    (
        "resource_limits",
        Target::Struct(&[("cgroup", Target::Struct(&[]))]),
    ),
    ("node_requirements", Target::Map(&Target::Replaced)),
]);

/// P2's `LaunchableStanza`.
const LAUNCHABLE: Target = Target::Struct(&[
    ("cgroup", Target::Struct(&[])),
    ("env", Target::Map(&Target::Replaced)),
    (
        "version",
        Target::Struct(&[("tags", Target::Map(&Target::Replaced))]),
    ),
    ("image", Target::Struct(&[])),
    ("postStart", HOOK),
    ("preStop", HOOK),
]);

const HOOK: Target = Target::Struct(&[("exec", Target::Struct(&[]))]);

/// `node` decoded as yaml.v2 decodes it into `target`, on top of `into` (what an earlier
/// value of the same key filled): merge keys expanded, and each key once, with the value
/// yaml.v2 leaves it. A node of the wrong kind is kept for the struct readers to refuse.
fn decode_into(node: &Node, target: Target, into: Option<Node>) -> Result<Node, String> {
    let entries = match node {
        Node::Map(entries) => entries,
        Node::Seq(items) => {
            return items
                .iter()
                .map(|item| decode_into(item, Target::Replaced, None))
                .collect::<Result<_, _>>()
                .map(Node::Seq)
        }
        scalar => return Ok(scalar.clone()),
    };
    let mut out = match into {
        Some(Node::Map(entries)) => entries,
        _ => Vec::new(),
    };
    // Each entry's key as the Go value it is compared by; `None` never equals another.
    let key_of = |key: &Node| match target {
        Target::Struct(_) | Target::Map(_) => go_string(key, "a key").ok().map(Go::Str),
        Target::UntypedMap | Target::Replaced => untyped(key)
            .ok()
            .filter(|k| !matches!(k, Go::Seq(_) | Go::Map(_))),
    };
    let mut keys: Vec<Option<Go>> = out.iter().map(|(key, _)| key_of(key)).collect();
    for (key, value) in merged(entries)? {
        let id = key_of(key);
        let at = id
            .as_ref()
            .and_then(|id| keys.iter().position(|k| k.as_ref() == Some(id)));
        let field = match (target, &id) {
            (Target::Struct(fields), Some(Go::Str(name))) => fields
                .iter()
                .find(|(field, _)| field == name)
                .map_or(Target::Replaced, |(_, field)| *field),
            (Target::Struct(_), _) => Target::Replaced,
            (Target::Map(entry), _) => *entry,
            (Target::UntypedMap | Target::Replaced, _) => Target::Replaced,
        };
        // A struct's struct or map field is decoded into again; a map's entry is made afresh.
        let earlier = match (target, field, at) {
            (
                Target::Struct(_),
                Target::Struct(_) | Target::Map(_) | Target::UntypedMap,
                Some(at),
            ) => Some(std::mem::replace(&mut out[at].1, Node::Seq(Vec::new()))),
            _ => None,
        };
        let value = decode_into(value, field, earlier)?;
        match at {
            Some(at) => out[at] = (key.clone(), value),
            None => {
                out.push((key.clone(), value));
                keys.push(id);
            }
        }
    }
    Ok(Node::Map(out))
}

/// A mapping's entries with YAML merge keys (`<<`) expanded where they stand, as yaml.v2
/// does: the merged mapping's entries (from a list of mappings, the last one first), which
/// later entries then override.
fn merged(entries: &[(Node, Node)]) -> Result<Vec<(&Node, &Node)>, String> {
    let mut out = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        if !matches!(key, Node::Scalar { text, plain: true, .. } if text == "<<") {
            out.push((key, value));
            continue;
        }
        let sources: Vec<&Node> = match value {
            Node::Seq(items) => items.iter().rev().collect(),
            single => vec![single],
        };
        for source in sources {
            let Node::Map(inner) = source else {
                return Err("a merge key (<<) needs a mapping or a list of mappings".into());
            };
            out.extend(merged(inner)?);
        }
    }
    Ok(out)
}

fn lookup<'n>(entries: &[(String, &'n Node)], key: &str) -> Option<&'n Node> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

fn is_null(node: &Node) -> bool {
    matches!(node, Node::Scalar { text, plain: true, .. } if resolve(text) == Go::Null)
}

/// A Go `string` field: the scalar's text (a plain null is "").
fn go_string(node: &Node, what: &str) -> Result<String, String> {
    match node {
        node if is_null(node) => Ok(String::new()),
        Node::Scalar { text, .. } => Ok(text.clone()),
        _ => Err(format!("{what} must be a string")),
    }
}

fn string_field(entries: &[(String, &Node)], key: &str) -> Result<Go, String> {
    lookup(entries, key)
        .map_or(Ok(String::new()), |node| go_string(node, key))
        .map(Go::Str)
}

/// A Go `int` field (a float is truncated, as yaml.v2 does).
fn int_field(entries: &[(String, &Node)], key: &str) -> Result<Go, String> {
    let Some(node) = lookup(entries, key) else {
        return Ok(Go::Int(0));
    };
    match untyped(node)? {
        Go::Null => Ok(Go::Int(0)),
        value => int_of(&value)
            .map(Go::Int)
            .ok_or_else(|| format!("{key} must be an integer")),
    }
}

/// A Go `bool` field; with `pointer`, a `*bool` that stays nil unless given.
fn bool_field(entries: &[(String, &Node)], key: &str, pointer: bool) -> Result<Go, String> {
    let absent = if pointer { Go::Null } else { Go::Bool(false) };
    let Some(node) = lookup(entries, key) else {
        return Ok(absent);
    };
    match untyped(node)? {
        Go::Null => Ok(absent),
        Go::Bool(b) if pointer => Ok(Go::Ptr(Box::new(Go::Bool(b)))),
        Go::Bool(b) => Ok(Go::Bool(b)),
        _ => Err(format!("{key} must be a boolean")),
    }
}

/// A Go `map[string]string` field.
fn string_map_field(entries: &[(String, &Node)], key: &str) -> Result<Go, String> {
    let Some(node) = lookup(entries, key) else {
        return Ok(Go::Map(Vec::new()));
    };
    let map = struct_entries(node, key)?
        .into_iter()
        .map(|(k, v)| Ok((Go::Str(k), Go::Str(go_string(v, key)?))))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Go::Map(sorted(map)))
}

/// A Go `[]string` field.
fn string_list_field(entries: &[(String, &Node)], key: &str) -> Result<Go, String> {
    match lookup(entries, key) {
        None => Ok(Go::Seq(Vec::new())),
        Some(node) if is_null(node) => Ok(Go::Seq(Vec::new())),
        Some(Node::Seq(items)) => items
            .iter()
            .map(|item| go_string(item, key).map(Go::Str))
            .collect::<Result<_, _>>()
            .map(Go::Seq),
        Some(_) => Err(format!("{key} must be a list of strings")),
    }
}

/// The top level: P2's `manifest` struct.
fn manifest_fields(node: &Node) -> Result<Go, String> {
    let top = struct_entries(node, "the manifest")?;
    let launchables = match lookup(&top, "launchables") {
        None => Vec::new(),
        Some(node) => struct_entries(node, "launchables")?
            .into_iter()
            .map(|(id, stanza)| Ok((Go::Str(id), launchable(stanza)?)))
            .collect::<Result<_, String>>()?,
    };
    let config = match lookup(&top, "config").map(untyped).transpose()? {
        None | Some(Go::Null) => Go::Map(Vec::new()),
        Some(map @ Go::Map(_)) => map,
        Some(_) => return Err("config must be a mapping".into()),
    };
    let status = struct_entries(lookup(&top, "status").unwrap_or(&NULL), "status")?;
    let resource_limits = struct_entries(
        lookup(&top, "resource_limits").unwrap_or(&NULL),
        "resource_limits",
    )?;
    let pod_cgroup = match lookup(&resource_limits, "cgroup") {
        None => Go::Null,
        Some(node) if is_null(node) => Go::Null,
        Some(node) => Go::Ptr(Box::new(cgroup(node)?)),
    };
    Ok(struct_value(vec![
        field("id", string_field(&top, "id")?),
        omitempty("run_as", string_field(&top, "run_as")?),
        field("launchables", Go::Map(sorted(launchables))),
        field("config", config),
        omitempty("status_port", int_field(&top, "status_port")?),
        omitempty("status_http", bool_field(&top, "status_http", false)?),
        omitempty(
            "status",
            struct_value(vec![
                omitempty("http", bool_field(&status, "http", false)?),
                omitempty("path", string_field(&status, "path")?),
                omitempty("port", int_field(&status, "port")?),
                omitempty(
                    "localhost_only",
                    bool_field(&status, "localhost_only", false)?,
                ),
            ]),
        ),
        omitempty(
            "resource_limits",
            struct_value(vec![omitempty("cgroup", pod_cgroup)]),
        ),
        omitempty("readonly", bool_field(&top, "readonly", true)?),
        omitempty(
            "artifact_registry",
            string_field(&top, "artifact_registry")?,
        ),
        omitempty(
            "node_requirements",
            string_map_field(&top, "node_requirements")?,
        ),
        omitempty(
            "min_health_percentage",
            int_field(&top, "min_health_percentage")?,
        ),
        omitempty(
            "termination_grace_period",
            int_field(&top, "termination_grace_period")?,
        ),
    ]))
}

static NULL: Node = Node::Scalar {
    text: String::new(),
    plain: true,
    value: Value::Null,
};

/// P2's `LaunchableStanza`.
fn launchable(node: &Node) -> Result<Go, String> {
    let stanza = struct_entries(node, "a launchable")?;
    let version = struct_entries(lookup(&stanza, "version").unwrap_or(&NULL), "version")?;
    let image = struct_entries(lookup(&stanza, "image").unwrap_or(&NULL), "image")?;
    let cgroup_value = match lookup(&stanza, "cgroup") {
        None => cgroup(&NULL)?,
        Some(node) => cgroup(node)?,
    };
    Ok(struct_value(vec![
        field("launchable_type", string_field(&stanza, "launchable_type")?),
        omitempty("digest_location", string_field(&stanza, "digest_location")?),
        omitempty(
            "digest_signature_location",
            string_field(&stanza, "digest_signature_location")?,
        ),
        omitempty("restart_timeout", string_field(&stanza, "restart_timeout")?),
        omitempty("cgroup", cgroup_value),
        omitempty("env", string_map_field(&stanza, "env")?),
        omitempty("run_as", string_field(&stanza, "run_as")?),
        omitempty("restart_policy", string_field(&stanza, "restart_policy")?),
        omitempty(
            "no_halt_on_update",
            bool_field(&stanza, "no_halt_on_update", false)?,
        ),
        omitempty("entry_points", string_list_field(&stanza, "entry_points")?),
        omitempty("location", string_field(&stanza, "location")?),
        omitempty(
            "version",
            struct_value(vec![
                omitempty("artifact_name", string_field(&version, "artifact_name")?),
                field("id", string_field(&version, "id")?),
                omitempty("tags", string_map_field(&version, "tags")?),
            ]),
        ),
        omitempty(
            "image",
            struct_value(vec![
                field("name", string_field(&image, "name")?),
                field("sha256", string_field(&image, "sha256")?),
            ]),
        ),
        omitempty("entrypoint", string_list_field(&stanza, "entrypoint")?),
        omitempty("postStart", hook(&stanza, "postStart")?),
        omitempty("preStop", hook(&stanza, "preStop")?),
    ]))
}

/// P2's docker `PostStart`/`PreStop`: `{exec: {command: [...]}}`, zero when the command is.
fn hook(stanza: &[(String, &Node)], key: &str) -> Result<Go, String> {
    let outer = struct_entries(lookup(stanza, key).unwrap_or(&NULL), key)?;
    let exec = struct_entries(lookup(&outer, "exec").unwrap_or(&NULL), key)?;
    let command = string_list_field(&exec, "command")?;
    Ok(struct_value(vec![field(
        "exec",
        struct_value(vec![field("command", command)]),
    )]))
}

/// P2's `cgroups.Config`: `cpus` and `memory` (a byte count such as `1G`, written back as
/// a plain number of bytes).
fn cgroup(node: &Node) -> Result<Go, String> {
    let entries = struct_entries(node, "cgroup")?;
    let memory = match lookup(&entries, "memory") {
        None => 0,
        Some(node) => byte_count(&go_string(node, "cgroup.memory")?)?,
    };
    Ok(struct_value(vec![
        omitempty("cpus", int_field(&entries, "cpus")?),
        omitempty("memory", Go::Uint(memory)),
    ]))
}

/// P2's `size.Parse`: a number with an optional `B`, `K`, `M`, `G` or `T` (optionally followed
/// by `b`), any case, in bytes (powers of 1024), truncated to a whole number as Go's `uint64`
/// conversion does.
fn byte_count(text: &str) -> Result<u64, String> {
    let bad = || format!("cgroup.memory: {text:?} is not a byte count");
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let factor: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" => 1024.0,
        "M" | "MB" => 1024.0 * 1024.0,
        "G" | "GB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bytes = number * factor;
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

// ---------------------------------------------------------------------------------------
// yaml.v2's map key order.

fn sorted(mut entries: Vec<(Go, Go)>) -> Vec<(Go, Go)> {
    entries.sort_by(|(a, _), (b, _)| {
        if key_less(a, b) {
            Ordering::Less
        } else if key_less(b, a) {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    });
    entries
}

/// Go's reflect kind numbers, which yaml.v2 falls back on to order keys of different kinds.
fn kind(value: &Go) -> u8 {
    match value {
        Go::Bool(_) => 1,
        Go::Int(_) => 2,
        Go::Uint(_) => 7,
        Go::Float(_) => 14,
        Go::Null => 20,
        Go::Map(_) => 21,
        Go::Seq(_) => 23,
        Go::Str(_) => 24,
        Go::Ptr(_) => 22,
        Go::Struct(_) => 25,
    }
}

fn key_number(value: &Go) -> Option<f64> {
    match value {
        Go::Int(n) => Some(*n as f64),
        Go::Uint(n) => Some(*n as f64),
        Go::Float(f) => Some(*f),
        Go::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// yaml.v2's `keyList.Less`: numbers and booleans by value, then by kind; strings in
/// "natural" order, where runs of digits compare as numbers and a non-letter sorts before a
/// letter.
fn key_less(a: &Go, b: &Go) -> bool {
    if let (Some(x), Some(y)) = (key_number(a), key_number(b)) {
        if x != y {
            return x < y;
        }
        if kind(a) != kind(b) {
            return kind(a) < kind(b);
        }
        return match (a, b) {
            (Go::Bool(x), Go::Bool(y)) => !x & y,
            (Go::Int(x), Go::Int(y)) => x < y,
            (Go::Uint(x), Go::Uint(y)) => x < y,
            _ => false,
        };
    }
    let (Go::Str(a), Go::Str(b)) = (a, b) else {
        return kind(a) < kind(b);
    };
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    for i in 0..a.len().min(b.len()) {
        if a[i] == b[i] {
            continue;
        }
        let (a_letter, b_letter) = (go_is_letter(a[i]), go_is_letter(b[i]));
        if a_letter && b_letter {
            return a[i] < b[i];
        }
        if a_letter || b_letter {
            return b_letter;
        }
        let number = |s: &[char]| {
            let digits: Vec<char> = s[i..]
                .iter()
                .take_while(|c| go_is_digit(**c))
                .copied()
                .collect();
            // Go takes any script's digit less '0' as its value, as here.
            let value = digits.iter().fold(0i64, |n, c| {
                n.wrapping_mul(10)
                    .wrapping_add(i64::from(u32::from(*c) - u32::from('0')))
            });
            (value, i + digits.len())
        };
        let ((an, ai), (bn, bi)) = (number(&a), number(&b));
        if an != bn {
            return an < bn;
        }
        if ai != bi {
            return ai < bi;
        }
        return a[i] < b[i];
    }
    a.len() < b.len()
}

/// Go's `unicode.IsLetter`: general category L. Rust's `is_alphabetic` takes more: marks
/// such as Devanagari's vowel signs and letter-like numbers such as `Ⅻ`.
fn go_is_letter(c: char) -> bool {
    c.general_category_group() == GeneralCategoryGroup::Letter
}

/// Go's `unicode.IsDigit`: general category Nd, the decimal digits of every script.
fn go_is_digit(c: char) -> bool {
    c.general_category() == GeneralCategory::DecimalNumber
}

// ---------------------------------------------------------------------------------------
// The emitter: libyaml's block output as yaml.v2 drives it.

/// libyaml's default line width, which yaml.v2 keeps.
const BEST_WIDTH: usize = 80;
const BEST_INDENT: isize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
    Literal,
}

struct Emitter {
    out: String,
    /// Characters on the current line.
    column: usize,
    /// The last character written was whitespace (or nothing yet).
    whitespace: bool,
    /// Only indentation has been written on this line.
    indention: bool,
    /// Floats at full precision rather than yaml.v2's float32 (for JSON sent by clients).
    exact_floats: bool,
}

impl Default for Emitter {
    fn default() -> Self {
        Emitter {
            out: String::new(),
            column: 0,
            whitespace: true,
            indention: true,
            exact_floats: false,
        }
    }
}

impl Emitter {
    fn put(&mut self, c: char) {
        self.out.push(c);
        self.column += 1;
    }

    fn put_break(&mut self) {
        self.out.push('\n');
        self.column = 0;
    }

    /// libyaml's `write_break`: a `\n` is a new line; any other line break (U+2028, U+2029,
    /// which a single-quoted or literal string may hold) is written as itself, and the line
    /// count starts again after it, so the next text is indented.
    fn write_break(&mut self, c: char) {
        if c == '\n' {
            self.put_break();
        } else {
            self.out.push(c);
            self.column = 0;
        }
        self.indention = true;
    }

    fn write_indent(&mut self, indent: isize) {
        let indent = indent.max(0) as usize;
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.put_break();
        }
        while self.column < indent {
            self.put(' ');
        }
        self.whitespace = true;
        self.indention = true;
    }

    fn indicator(&mut self, text: &str, need_whitespace: bool, is_indention: bool) {
        if need_whitespace && !self.whitespace {
            self.put(' ');
        }
        for c in text.chars() {
            self.put(c);
        }
        self.whitespace = false;
        self.indention = self.indention && is_indention;
    }

    /// A node at `parent` indentation. `in_mapping` is libyaml's mapping context, in which a
    /// block sequence is not indented further.
    fn node(&mut self, value: &Go, parent: isize, in_mapping: bool) {
        match value {
            Go::Ptr(inner) => self.node(inner, parent, in_mapping),
            Go::Struct(fields) => {
                let entries: Vec<(Go, Go)> = fields
                    .iter()
                    .filter(|f| !(f.omit_empty && f.value.is_zero()))
                    .map(|f| (Go::Str(f.key.to_owned()), f.value.clone()))
                    .collect();
                self.mapping(&entries, parent);
            }
            Go::Map(entries) => self.mapping(entries, parent),
            Go::Seq(items) if items.is_empty() => self.indicator("[]", true, false),
            Go::Seq(items) => {
                let indent = if in_mapping && !self.indention {
                    parent.max(0)
                } else {
                    next_indent(parent)
                };
                for item in items {
                    self.write_indent(indent);
                    self.indicator("-", true, true);
                    self.node(item, indent, false);
                }
            }
            scalar => self.scalar(scalar, next_indent(parent), false),
        }
    }

    /// A block mapping whose keys sit at `next_indent(parent)`; `{}` when empty.
    fn mapping(&mut self, entries: &[(Go, Go)], parent: isize) {
        if entries.is_empty() {
            return self.indicator("{}", true, false);
        }
        let indent = next_indent(parent);
        for (key, value) in entries {
            self.write_indent(indent);
            if self.is_simple_key(key) {
                self.scalar(key, next_indent(indent), true);
                self.indicator(":", false, false);
            } else {
                self.indicator("?", true, true);
                self.scalar(key, next_indent(indent), false);
                self.write_indent(indent);
                self.indicator(":", true, true);
            }
            self.node(value, indent, true);
        }
    }

    /// libyaml's `check_simple_key`: a key is written `key: value` only when it is at most
    /// 128 bytes and on one line; any other is written `? key`, with `: value` on the next
    /// line.
    fn is_simple_key(&self, key: &Go) -> bool {
        self.scalar_text(key)
            .is_some_and(|(text, _)| text.len() <= 128 && !text.chars().any(is_break))
    }

    fn document_end(&mut self) {
        self.write_indent(0);
    }

    /// One scalar; `simple_key` when it is a simple mapping key (never folded, never a block).
    fn scalar(&mut self, value: &Go, indent: isize, simple_key: bool) {
        let Some((text, style)) = self.scalar_text(value) else {
            return self.node(value, indent, false);
        };
        let style = select_style(&text, style, simple_key);
        let allow_breaks = !simple_key;
        match style {
            Style::Plain => self.plain(&text, indent, allow_breaks),
            Style::Single => self.single_quoted(&text, indent, allow_breaks),
            Style::Double => self.double_quoted(&text, indent, allow_breaks),
            Style::Literal => self.literal(&text, indent),
        }
    }

    /// A scalar's text and the style yaml.v2 asks for; `None` for a collection.
    fn scalar_text(&self, value: &Go) -> Option<(String, Style)> {
        Some(match value {
            Go::Null => ("null".to_owned(), Style::Plain),
            Go::Bool(b) => (b.to_string(), Style::Plain),
            Go::Int(n) => (n.to_string(), Style::Plain),
            Go::Uint(n) => (n.to_string(), Style::Plain),
            Go::Float(f) if self.exact_floats => (format!("{f:?}"), Style::Plain),
            Go::Float(f) => (go_float32(*f), Style::Plain),
            Go::Str(s) => (s.clone(), string_style(s)),
            Go::Seq(_) | Go::Map(_) | Go::Struct(_) | Go::Ptr(_) => return None,
        })
    }

    fn plain(&mut self, text: &str, indent: isize, allow_breaks: bool) {
        if !self.whitespace {
            self.put(' ');
        }
        let chars: Vec<char> = text.chars().collect();
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && chars.get(i + 1) != Some(&' ')
                {
                    self.write_indent(indent);
                } else {
                    self.put(c);
                }
                spaces = true;
            } else {
                self.put(c);
                self.indention = false;
                spaces = false;
            }
        }
        self.whitespace = false;
        self.indention = false;
    }

    fn single_quoted(&mut self, text: &str, indent: isize, allow_breaks: bool) {
        self.indicator("'", true, false);
        let chars: Vec<char> = text.chars().collect();
        let mut spaces = false;
        let mut breaks = false;
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i != 0
                    && i + 1 != chars.len()
                    && chars.get(i + 1) != Some(&' ')
                {
                    self.write_indent(indent);
                } else {
                    self.put(c);
                }
                spaces = true;
            } else if is_break(c) {
                if !breaks && c == '\n' {
                    self.put_break();
                }
                self.write_break(c);
                breaks = true;
            } else {
                if breaks {
                    self.write_indent(indent);
                }
                if c == '\'' {
                    self.put('\'');
                }
                self.put(c);
                self.indention = false;
                spaces = false;
                breaks = false;
            }
        }
        self.indicator("'", false, false);
        self.whitespace = false;
        self.indention = false;
    }

    fn double_quoted(&mut self, text: &str, indent: isize, allow_breaks: bool) {
        self.indicator("\"", true, false);
        let chars: Vec<char> = text.chars().collect();
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if !printable(c) || c == '\u{FEFF}' || is_break(c) || c == '"' || c == '\\' {
                self.put('\\');
                let escape = match c {
                    '\0' => Some('0'),
                    '\u{7}' => Some('a'),
                    '\u{8}' => Some('b'),
                    '\t' => Some('t'),
                    '\n' => Some('n'),
                    '\u{b}' => Some('v'),
                    '\u{c}' => Some('f'),
                    '\r' => Some('r'),
                    '\u{1b}' => Some('e'),
                    '"' => Some('"'),
                    '\\' => Some('\\'),
                    '\u{85}' => Some('N'),
                    '\u{a0}' => Some('_'),
                    '\u{2028}' => Some('L'),
                    '\u{2029}' => Some('P'),
                    _ => None,
                };
                match escape {
                    Some(e) => self.put(e),
                    None => {
                        let code = u32::from(c);
                        let hex = match code {
                            0..=0xFF => format!("x{code:02X}"),
                            0x100..=0xFFFF => format!("u{code:04X}"),
                            _ => format!("U{code:08X}"),
                        };
                        hex.chars().for_each(|h| self.put(h));
                    }
                }
                spaces = false;
            } else if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i != 0
                    && i + 1 != chars.len()
                {
                    self.write_indent(indent);
                    if chars.get(i + 1) == Some(&' ') {
                        self.put('\\');
                    }
                } else {
                    self.put(c);
                }
                spaces = true;
            } else {
                self.put(c);
                spaces = false;
            }
        }
        self.indicator("\"", false, false);
        self.whitespace = false;
        self.indention = false;
    }

    fn literal(&mut self, text: &str, indent: isize) {
        self.indicator("|", true, false);
        let first = text.chars().next();
        if first.is_some_and(|c| c == ' ' || is_break(c)) {
            self.indicator(&BEST_INDENT.to_string(), false, false);
        }
        let chars: Vec<char> = text.chars().collect();
        let chomp = match chars.as_slice() {
            [] => Some("-"),
            [.., last] if !is_break(*last) => Some("-"),
            [_] => Some("+"),
            [.., before, _] if is_break(*before) => Some("+"),
            _ => None,
        };
        if let Some(chomp) = chomp {
            self.indicator(chomp, false, false);
        }
        self.put_break();
        self.indention = true;
        self.whitespace = true;
        let mut breaks = true;
        for &c in &chars {
            if is_break(c) {
                self.write_break(c);
                breaks = true;
            } else {
                if breaks {
                    self.write_indent(indent);
                    breaks = false;
                }
                self.put(c);
                self.indention = false;
            }
        }
    }
}

/// libyaml's indentation for the contents of a node at `parent` (-1 for the document).
fn next_indent(parent: isize) -> isize {
    if parent < 0 {
        0
    } else {
        parent + BEST_INDENT
    }
}

/// libyaml's printable characters; anything else is escaped in double quotes.
fn printable(c: char) -> bool {
    matches!(u32::from(c), 0x0A | 0x20..=0x7E | 0xA0..=0xD7FF | 0xE000..=0xFFFD)
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank_or_end(c: Option<&char>) -> bool {
    c.is_none_or(|c| *c == ' ' || *c == '\t' || is_break(*c))
}

/// yaml.v2's choice for a string: double quotes when plain text would read back as another
/// type (or a base-60 float, or the merge key `<<`, which yaml.v2 resolves to its own tag),
/// a literal block when it has a line break, plain otherwise.
fn string_style(text: &str) -> Style {
    if resolve(text) != Go::Str(text.to_owned()) || is_base60_float(text) || text == "<<" {
        Style::Double
    } else if text.contains('\n') {
        Style::Literal
    } else {
        Style::Plain
    }
}

/// YAML 1.1's sexagesimal floats (`1:20`), which yaml.v2 quotes for other parsers' sake.
fn is_base60_float(text: &str) -> bool {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    let (number, fraction) = match body.split_once('.') {
        Some((number, fraction)) => (number, Some(fraction)),
        None => (body, None),
    };
    let mut parts = number.split(':');
    let Some(first) = parts.next() else {
        return false;
    };
    let rest: Vec<&str> = parts.collect();
    first.starts_with(|c: char| c.is_ascii_digit())
        && first.chars().all(|c| c.is_ascii_digit() || c == '_')
        && !rest.is_empty()
        && rest.iter().all(|part| {
            (1..=2).contains(&part.len())
                && part.chars().all(|c| c.is_ascii_digit())
                && (part.len() == 1 || part.as_bytes()[0] <= b'5')
        })
        && fraction.is_none_or(|f| f.chars().all(|c| c.is_ascii_digit() || c == '_'))
}

/// libyaml's analysis of a scalar, then its style selection (`yaml_emitter_select_scalar_style`).
fn select_style(text: &str, wanted: Style, simple_key: bool) -> Style {
    let chars: Vec<char> = text.chars().collect();
    let mut block_indicators = false;
    let mut line_breaks = false;
    let mut special = false;
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    if text.starts_with("---") || text.starts_with("...") {
        block_indicators = true;
    }
    let mut preceded_by_whitespace = true;
    for (i, &c) in chars.iter().enumerate() {
        let followed_by_whitespace = is_blank_or_end(chars.get(i + 1));
        // Only block context matters: flow style is used for nothing but `{}` and `[]`.
        if i == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(c) {
                block_indicators = true;
            }
            if c == '?' || c == ':' || c == '-' {
                block_indicators |= followed_by_whitespace;
            }
        } else {
            if c == ':' {
                block_indicators |= followed_by_whitespace;
            }
            if c == '#' && preceded_by_whitespace {
                block_indicators = true;
            }
        }
        if !printable(c) || c == '\u{FEFF}' {
            special = true;
        }
        if is_break(c) {
            line_breaks = true;
        }
        let last = i + 1 == chars.len();
        if c == ' ' {
            leading_space |= i == 0;
            trailing_space |= last;
            break_space |= previous_break;
            previous_space = true;
            previous_break = false;
        } else if is_break(c) {
            leading_break |= i == 0;
            trailing_break |= last;
            space_break |= previous_space;
            previous_break = true;
            previous_space = false;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = c == ' ' || c == '\t' || is_break(c);
    }
    let mut plain_allowed = true;
    let mut single_allowed = true;
    let mut block_allowed = true;
    if leading_space || leading_break || trailing_space || trailing_break {
        plain_allowed = false;
    }
    if trailing_space {
        block_allowed = false;
    }
    if break_space {
        plain_allowed = false;
        single_allowed = false;
    }
    if space_break || special {
        plain_allowed = false;
        single_allowed = false;
        block_allowed = false;
    }
    if line_breaks || block_indicators {
        plain_allowed = false;
    }
    if text.is_empty() {
        // libyaml: an empty scalar may be plain in block context, single-quoted otherwise.
        plain_allowed = !simple_key;
        single_allowed = true;
        block_allowed = false;
    }
    let mut style = wanted;
    if simple_key && line_breaks {
        style = Style::Double;
    }
    if style == Style::Plain && !plain_allowed {
        style = Style::Single;
    }
    if style == Style::Single && !single_allowed {
        style = Style::Double;
    }
    if style == Style::Literal && (!block_allowed || simple_key) {
        style = Style::Double;
    }
    style
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)` (yaml.v2 writes floats at float32 precision),
/// with YAML's spellings of infinity and NaN. Told of the float32, as Go tells it: a finite
/// float beyond float32's range is infinity there.
fn go_float32(value: f64) -> String {
    let single = value as f32;
    if single.is_nan() {
        return ".nan".into();
    }
    if single.is_infinite() {
        return if single > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    if single == 0.0 {
        return if single.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's shortest round-trip digits for f32, in exponent form: d.ddde±x.
    let exponent_form = format!("{single:e}");
    let (mantissa, exponent) = exponent_form
        .split_once('e')
        .expect("{:e} always writes an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if !(-4..6).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.abs());
    }
    let point = exponent + 1;
    if point <= 0 {
        format!(
            "{sign}0.{}{digits}",
            "0".repeat(point.unsigned_abs() as usize)
        )
    } else if point as usize >= digits.len() {
        format!(
            "{sign}{digits}{}",
            "0".repeat(point as usize - digits.len())
        )
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{sign}{whole}.{fraction}")
    }
}

#[cfg(test)]
mod tests {
    //! Each expected text below is derived by hand from P2's struct definitions and yaml.v2's
    //! rules, and its SHA is `sha256sum` of that text: what P2's `manifest.SHA()` gives.

    use super::super::Manifest;

    fn canonical(raw: &str) -> Result<String, String> {
        let Ok(document) = super::parse(raw) else {
            return Err("not YAML".into());
        };
        document.read().map(|reading| reading.canonical)
    }

    fn check(raw: &str, expected: &str, sha: &str) {
        assert_eq!(canonical(raw).unwrap(), expected);
        assert_eq!(Manifest::parse(raw).unwrap().sha(), sha);
    }

    const HELLO: &str = "id: hello\nlaunchables:\n  app:\n    launchable_type: hoist\n    location: https://artifacts.example.com/hello_3881c78e.tar.gz\nconfig:\n  ENVIRONMENT: production\nstatus:\n  port: 43770\n  http: true\n";
    const HELLO_CANONICAL: &str = "id: hello
launchables:
  app:
    launchable_type: hoist
    location: https://artifacts.example.com/hello_3881c78e.tar.gz
config:
  ENVIRONMENT: production
status:
  http: true
  port: 43770
";
    const HELLO_SHA: &str = "c0055f6b06a9a48b75763996805e5ed69d159d44ed147131692c039b3aaec1fc";

    #[test]
    fn hoist_with_a_location() {
        check(HELLO, HELLO_CANONICAL, HELLO_SHA);
    }

    #[test]
    fn comments_indentation_flow_style_quoting_and_unknown_keys_do_not_count() {
        let raw = "# deployed by hand\nstatus: {http: yes, port: 43770}   # legacy yes\nconfig:\n    ENVIRONMENT: 'production'\nlaunchables:\n    app:\n        location: \"https://artifacts.example.com/hello_3881c78e.tar.gz\"\n        launchable_type: hoist\n        not_a_p2_field: 1\nid: hello\ntags:\n- blue\n";
        check(raw, HELLO_CANONICAL, HELLO_SHA);
    }

    #[test]
    fn signed_manifests_hash_their_plaintext() {
        let signed = format!(
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n{HELLO}extra:\n- - blue\n-----BEGIN PGP SIGNATURE-----\n\ncDI=\n=ar9S\n-----END PGP SIGNATURE-----\n"
        );
        let manifest = Manifest::parse(&signed).unwrap();
        assert!(manifest.is_signed());
        assert_eq!(manifest.sha(), HELLO_SHA);
    }

    /// A string field keeps the scalar's text (`1.10`, not the float 1.1) and is quoted on the
    /// way out because plain it would read as a float; `config` is written even when absent.
    #[test]
    fn hoist_with_a_version() {
        let raw = "id: web\nlaunchables:\n  web:\n    version:\n      id: 1.10\n      artifact_name: web-app\n    launchable_type: hoist\n";
        let expected = "id: web
launchables:
  web:
    launchable_type: hoist
    version:
      artifact_name: web-app
      id: \"1.10\"
config: {}
";
        check(
            raw,
            expected,
            "edabb65fbef2251cbcc80a5e3fecb5fb6eca75e47603e1eccf4651f8f1f5e913",
        );
    }

    #[test]
    fn docker_with_an_image_entrypoint_and_hook() {
        let raw = "id: nginx\nstatus_port: 8080\nlaunchables:\n  proxy:\n    launchable_type: docker\n    postStart:\n      exec:\n        command: [/bin/sh, -c, echo started]\n    entrypoint: [nginx, -g, \"daemon off;\"]\n    image:\n      sha256: 3f1e9a7c0b5d\n      name: registry.example.com/team/nginx\n    preStop:\n      exec:\n        command: []\n";
        let expected = "id: nginx
launchables:
  proxy:
    launchable_type: docker
    image:
      name: registry.example.com/team/nginx
      sha256: 3f1e9a7c0b5d
    entrypoint:
    - nginx
    - -g
    - daemon off;
    postStart:
      exec:
        command:
        - /bin/sh
        - -c
        - echo started
config: {}
status_port: 8080
";
        check(
            raw,
            expected,
            "33a2ad93b716b0b7ca731400299943c4831f0558c7086a81e039b6e081fd0d29",
        );
    }

    /// Untyped config: YAML 1.1 resolution of plain scalars only (`y` is true), Go's octal, float32
    /// formatting, yaml.v2's natural key order (numbers first, then non-letters, digit runs by
    /// value), quoting of strings that would read as something else, literal blocks, and
    /// plain text folded past column 80.
    #[test]
    fn config_with_nested_maps_and_every_kind_of_scalar() {
        let raw = "id: app
launchables: {}
config:
  zeta: 1
  alpha:
    nested:
      b: yes
      a: \"yes\"
    list:
    - 1.5
    - ~
    - on
  10: ten
  9: nine
  key2: x
  key10: y
  Key: upper
  _private: z
  empty: ''
  multi: |
    line one
    line two
  port: \"8080\"
  octal: 0755
  big: 1e6
  jvm: -Xmx4g -XX:+UseG1GC -XX:MaxGCPauseMillis=200 -Dcom.example.very.long.property.name=some-value-here -Dfoo=bar
";
        let expected = "id: app
launchables: {}
config:
  9: nine
  10: ten
  _private: z
  Key: upper
  alpha:
    list:
    - 1.5
    - null
    - true
    nested:
      a: \"yes\"
      b: true
  big: 1e+06
  empty: \"\"
  jvm: -Xmx4g -XX:+UseG1GC -XX:MaxGCPauseMillis=200 -Dcom.example.very.long.property.name=some-value-here
    -Dfoo=bar
  key2: x
  key10: true
  multi: |
    line one
    line two
  octal: 493
  port: \"8080\"
  zeta: 1
";
        check(
            raw,
            expected,
            "e374958f2501d5705004ec2e9fde1012b1f017d9b78886e160ba99225e1339a2",
        );
    }

    /// Struct fields in P2's order with `omitempty`: zero legacy status fields vanish, a
    /// given `readonly: false` stays (a pointer), byte counts are written in bytes.
    #[test]
    fn status_stanza_resource_limits_and_the_other_top_level_fields() {
        let raw = "id: svc
unknown_key: dropped
node_requirements: {disk: ssd}
artifact_registry: https://registry.example.com
readonly: false
resource_limits:
  cgroup:
    memory: 1G
    cpus: 2
status_http: false
status_port: 0
status:
  localhost_only: true
  path: health
  port: 9000
run_as: svcuser
launchables:
  svc:
    no_halt_on_update: true
    restart_timeout: 30s
    entry_points: [bin/launch, bin/worker]
    env: {B: \"2\", A: one}
    cgroup: {cpus: 1, memory: 512M}
    location: https://a.example.com/svc.tar.gz
    launchable_type: hoist
";
        let expected = "id: svc
run_as: svcuser
launchables:
  svc:
    launchable_type: hoist
    restart_timeout: 30s
    cgroup:
      cpus: 1
      memory: 536870912
    env:
      A: one
      B: \"2\"
    no_halt_on_update: true
    entry_points:
    - bin/launch
    - bin/worker
    location: https://a.example.com/svc.tar.gz
config: {}
status:
  path: health
  port: 9000
  localhost_only: true
resource_limits:
  cgroup:
    cpus: 2
    memory: 1073741824
readonly: false
artifact_registry: https://registry.example.com
node_requirements:
  disk: ssd
";
        check(
            raw,
            expected,
            "ec8e5b36998f6a94e6096039db6bfe2b3de6c8474fb0b5ac32f32c5b7fe627d8",
        );
    }

    /// Merge keys expand where they stand: later keys win, and from a list the first mapping.
    #[test]
    fn merge_keys_expand_as_in_yaml_v2() {
        let raw = "id: m\nbase: &base {a: 1, b: 2}\nother: &other {b: 3, c: 4}\nconfig:\n  <<: [*base, *other]\n  a: 9\nstatus:\n  <<: {port: 1, path: x}\n  port: 2\n";
        let expected = "id: m\nlaunchables: {}\nconfig:\n  a: 9\n  b: 2\n  c: 4\nstatus:\n  path: x\n  port: 2\n";
        assert_eq!(canonical(raw).unwrap(), expected);
    }

    /// yaml.v2 decodes a repeated key again into what the first one filled: a struct field
    /// (`status`, a launchable's `version`) keeps what the later value leaves out, a map field
    /// (`config`, `launchables`) keeps its other entries, and anything else, including an
    /// entry of a map, is replaced; null empties the field.
    #[test]
    fn repeated_keys_decode_as_in_yaml_v2() {
        let raw = "id: draft
id: r
status: {http: true, port: 1}
status: {port: 2}
config: {a: 1, nested: {p: 1}, nested: {q: 2}}
config: {b: 2, a: 3}
launchables:
  web: {launchable_type: hoist, location: https://a/web.tar.gz}
  web: {launchable_type: hoist, version: {id: v1}, version: {artifact_name: web2}}
launchables:
  db: {launchable_type: hoist, location: https://a/db.tar.gz}
resource_limits: {cgroup: {cpus: 2}}
resource_limits: ~
";
        let expected = "id: r
launchables:
  db:
    launchable_type: hoist
    location: https://a/db.tar.gz
  web:
    launchable_type: hoist
    version:
      artifact_name: web2
      id: v1
config:
  a: 3
  b: 2
  nested:
    q: 2
status:
  http: true
  port: 2
";
        assert_eq!(canonical(raw).unwrap(), expected);
        let without_repeats = "id: r\nstatus: {http: true, port: 2}\nconfig: {a: 3, b: 2, nested: {q: 2}}\nlaunchables:\n  web: {launchable_type: hoist, version: {id: v1, artifact_name: web2}}\n  db: {launchable_type: hoist, location: https://a/db.tar.gz}\n";
        assert_eq!(canonical(without_repeats).unwrap(), expected);
        assert_eq!(
            Manifest::parse(raw).unwrap().sha(),
            Manifest::parse(without_repeats).unwrap().sha()
        );
    }

    #[test]
    fn strings_are_quoted_as_libyaml_quotes_them() {
        let raw = "id: q\nconfig:\n  colon: 'a: b'\n  hash: 'a #b'\n  lead: ' x'\n  dash: '- x'\n  star: '*x'\n  tab: \"a\\tb\"\n  quote: \"it's\"\n  time: '1:20'\n  nul: 'null'\n  trail: \"a\\n\"\n  keep: \"a\\n\\n\"\n  bare: \"a\\nb\"\n";
        let expected = "id: q
launchables: {}
config:
  bare: |-
    a
    b
  colon: 'a: b'
  dash: '- x'
  hash: 'a #b'
  keep: |+
    a

  lead: ' x'
  nul: \"null\"
  quote: it's
  star: '*x'
  tab: \"a\\tb\"
  time: \"1:20\"
  trail: |
    a
";
        assert_eq!(canonical(raw).unwrap(), expected);
    }

    #[test]
    fn float32_formatting_and_natural_key_order() {
        use super::{go_float32, key_less, Go};
        for (value, text) in [
            (1.5, "1.5"),
            (100.0, "100"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (std::f64::consts::PI, "3.1415927"),
            (-2.5e-7, "-2.5e-07"),
        ] {
            assert_eq!(go_float32(value), text, "{value}");
        }
        let s = |text: &str| Go::Str(text.into());
        assert!(key_less(&s("a1"), &s("a10")));
        assert!(key_less(&s("a2"), &s("a10")));
        assert!(key_less(&s("_x"), &s("A")));
        assert!(key_less(&s("Z"), &s("a")));
        assert!(key_less(&Go::Int(10), &s("1")));
        assert!(key_less(&Go::Int(2), &Go::Int(10)));
    }

    /// Keys compare by Go's idea of a letter and a digit, as yaml.v2 sorts them: a letter-like
    /// number (`Ⅻ`, general category Nl) or a mark is no letter there, so it sorts before
    /// any letter; a digit of another script is a digit, worth its distance from `'0'`.
    /// Before, Rust's `is_alphabetic` took `Ⅻ` for a letter, sorting it after `b` by code
    /// point, and only ASCII digits were digits.
    #[test]
    fn keys_sort_by_gos_letters_and_digits() {
        use super::{key_less, Go};
        let s = |text: &str| Go::Str(text.into());
        assert!(key_less(&s("aⅫ"), &s("ab")));
        assert!(!key_less(&s("ab"), &s("aⅫ")));
        // U+0903, a spacing mark that Unicode counts as alphabetic.
        assert!(key_less(&s("a\u{903}"), &s("ab")));
        // U+0663, ARABIC-INDIC DIGIT THREE: 0x663 - 0x30 = 1587, past 12.
        assert!(key_less(&s("x12"), &s("x\u{663}")));
        assert!(!key_less(&s("x\u{663}"), &s("x12")));
        // Letters of any script still sort by code point among themselves.
        assert!(key_less(&s("aé"), &s("aж")));
    }

    /// A float that float32 cannot hold is written as yaml.v2 writes it, infinity (Go's
    /// `FormatFloat(f, 'g', -1, 32)` gives `+Inf` for it); before, the manifest's reading
    /// panicked on it, a request's and the mirror's alike.
    #[test]
    fn a_float_beyond_float32s_range_is_written_as_infinity() {
        use super::go_float32;
        assert_eq!(go_float32(1e300), ".inf");
        assert_eq!(go_float32(-3.5e38), "-.inf");
        assert_eq!(go_float32(3.4e38), "3.4e+38");
        assert_eq!(
            canonical("id: hello\nconfig:\n  big: 1e300\n  small: -1e39\n").unwrap(),
            "id: hello\nlaunchables: {}\nconfig:\n  big: .inf\n  small: -.inf\n"
        );
    }

    /// A number past float64's range is no float to yaml.v2: Go's `ParseFloat` refuses it
    /// (`ErrRange`), so `resolve` leaves it a string, written back as it came. Only the
    /// spellings of infinity are infinity; one that merely underflows is 0 in both.
    #[test]
    fn a_number_beyond_float64s_range_stays_a_string() {
        assert_eq!(
            canonical("id: hello\nconfig:\n  big: 1e400\n  small: -1.5E+309\n  tiny: 1e-400\n")
                .unwrap(),
            "id: hello\nlaunchables: {}\nconfig:\n  big: 1e400\n  small: -1.5E+309\n  tiny: 0\n"
        );
    }

    /// `!!str` makes yaml.v2 take a plain scalar's text as a string, as quotes do.
    #[test]
    fn a_str_tag_keeps_a_plain_scalar_a_string() {
        assert_eq!(
            canonical("id: hello\nconfig:\n  a: !!str 1\n  b: !!str &x true\n  c: [!!str 0x10, 1]\n  d: !!str\n    2.5\n  e: 1\n").unwrap(),
            "id: hello\nlaunchables: {}\nconfig:\n  a: \"1\"\n  b: \"true\"\n  c:\n  - \"0x10\"\n  - 1\n  d: \"2.5\"\n  e: 1\n"
        );
    }

    /// A key longer than 128 bytes, or holding a line break, is no simple key to libyaml:
    /// it is written after `? `, as any other scalar is written (a plain one folded at 80
    /// columns, one with a line break as a literal block), and its value after `: ` on the
    /// next line.
    #[test]
    fn long_and_multi_line_keys_are_written_as_complex_keys() {
        let simple = "k".repeat(128);
        let long = "k".repeat(129);
        let folded = format!("{} {}", "w".repeat(85), "w".repeat(50));
        assert_eq!(
            canonical(&format!(
                "id: hello\nconfig:\n  {simple}: 1\n  {long}: 2\n  \"a\\nb\": 3\n  {folded}: {{x: 4}}\n"
            ))
            .unwrap(),
            format!(
                "id: hello\nlaunchables: {{}}\nconfig:\n  ? |-\n    a\n    b\n  : 3\n  {simple}: 1\n  ? {long}\n  : 2\n  ? {}\n    {}\n  : x: 4\n",
                "w".repeat(85),
                "w".repeat(50)
            )
        );
    }

    /// libyaml writes a line break other than `\n` (U+2028, U+2029) as itself inside a
    /// single-quoted or literal string, and indents the text after it as a new line; a JSON
    /// manifest holding one keeps it.
    #[test]
    fn other_line_breaks_are_written_as_themselves_and_indented_after() {
        let json =
            serde_json::json!({"id": "hello", "config": {"a": "x\u{2028}y", "b": "p\nq\u{2029}r"}});
        let read: serde_json::Value = yaml_serde::from_str(&super::from_json(&json)).unwrap();
        assert_eq!(read, json);
        assert_eq!(
            canonical("id: hello\nconfig:\n  a: \"x\\Ly\"\n  b: \"p\\nq\\Pr\"\n").unwrap(),
            "id: hello\nlaunchables: {}\nconfig:\n  a: 'x\u{2028}    y'\n  b: |-\n    p\n    q\u{2029}    r\n"
        );
    }

    #[test]
    fn json_is_written_so_that_both_readers_get_its_values_back() {
        use super::{from_json, json_value, parse, untyped};
        let strings = [
            "yes", "on", "NO", "off", "y", "~", "null", "", "1_000", "0x1F", "017", "0b101",
            "1:20", "1.10", ".5", "+1", "1e3", ".inf", "<<", "=", "-", "- a", "a: b", "#x", "x #y",
            " lead", "trail ", "a\nb", "ends\n", "a\tb", "'q'", "\"dq\"", "@at", "`tick", "%pct",
            "!bang", "&amp", "*star", "[a]", "{a}", "é ü", "\u{85}", ">", "|", "?", ":", ",",
            "1-2-3",
        ];
        let mut config = serde_json::Map::new();
        for (i, text) in strings.iter().enumerate() {
            config.insert(format!("s{i}"), serde_json::json!(text));
            config.insert((*text).to_owned(), serde_json::json!(i));
        }
        let long = "a long value  with two spaces, ".repeat(8);
        config.insert("long".into(), serde_json::json!(long));
        config.insert(
            "quoted_long".into(),
            serde_json::json!(format!("{long}: yes")),
        );
        config.insert(
            "long_lines".into(),
            serde_json::json!(format!("{long}\n{long}\n")),
        );
        let json = serde_json::json!({
            "id": "hello",
            "config": config,
            "list": strings.as_slice(),
            "numbers": [0.123456789, -1e300, 3.0, u64::MAX, i64::MIN, 0],
            "nothing": null, "empty": {}, "none": [], "flag": false,
        });
        let text = from_json(&json);

        let as_yaml_1_2: serde_json::Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(as_yaml_1_2, json, "{text}");
        let Ok(document) = parse(&text) else {
            panic!("{text}")
        };
        assert_eq!(
            untyped(&document.node).unwrap(),
            json_value(&json),
            "{text}"
        );
    }
}

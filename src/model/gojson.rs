//! Go `encoding/json` compatibility: Go's field matching on read and Go's escaping on write.
//!
//! P2 decodes with Go's rules: an object key matches a struct field case-insensitively, unknown
//! keys are ignored, a `null` leaves the field at its zero value, and when a key repeats the
//! last one wins. [`Folded`] applies those rules before handing the object to a derived serde
//! struct, so a document P2 accepts is accepted here too.

use std::io;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::ser::{CharEscape, CompactFormatter};
use serde_json::{Map, Value};

/// A `T` decoded with Go's field matching; `T` is a plain derived struct whose serde field
/// names are the canonical (written) names.
pub(crate) struct Folded<T>(pub(crate) T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Folded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = struct_fields::<T>();
        let entries = deserializer.deserialize_map(EntriesVisitor)?;
        let mut object = Map::new();
        for (key, value) in entries {
            if value.is_null() {
                continue;
            }
            if let Some(field) = fields.iter().find(|field| go_fold_eq(&key, field)) {
                object.insert((*field).to_owned(), value);
            }
        }
        serde_json::from_value(Value::Object(object))
            .map(Folded)
            .map_err(de::Error::custom)
    }
}

/// Writes `value` as compact JSON the way Go's `json.Marshal` does, including its escaping of
/// `<`, `>`, `&`, U+2028 and U+2029, so documents we write are byte-identical to P2's.
pub(crate) fn to_vec<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value
        .serialize(&mut serializer)
        .expect("stored documents have string keys and no fallible fields");
    out
}

/// Whether the stored JSON bytes `stored` may hold the string `text` (an id), told without
/// decoding them: JSON holds a string as it is unless it escapes a character somewhere (our
/// writer and Go's escape none that an id has), so bytes that escape one, or are not UTF-8,
/// may hold it whatever they look like.
pub(crate) fn may_hold(stored: &[u8], text: &str) -> bool {
    std::str::from_utf8(stored).map_or(true, |json| json.contains('\\') || json.contains(text))
}

struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..at])?;
            writer.write_all(escape.as_bytes())?;
            start = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    /// Go's `json.Marshal` of P2's era (before Go 1.22) has short escapes only for `\n`,
    /// `\r` and `\t`: backspace and form feed are `\u0008` and `\u000c`, as every other
    /// control character.
    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        match char_escape {
            CharEscape::Backspace => writer.write_all(b"\\u0008"),
            CharEscape::FormFeed => writer.write_all(b"\\u000c"),
            other => CompactFormatter.write_char_escape(writer, other),
        }
    }
}

/// Go's key comparison for an ASCII field name: ASCII case folding, plus the two non-ASCII
/// runes that fold to ASCII letters (KELVIN SIGN to `k`, LONG S to `s`).
fn go_fold_eq(key: &str, field: &str) -> bool {
    let mut key_chars = key.chars();
    for f in field.chars() {
        let Some(k) = key_chars.next() else {
            return false;
        };
        let same = k.eq_ignore_ascii_case(&f)
            || (k == '\u{212A}' && f.eq_ignore_ascii_case(&'k'))
            || (k == '\u{017F}' && f.eq_ignore_ascii_case(&'s'));
        if !same {
            return false;
        }
    }
    key_chars.next().is_none()
}

/// Object entries in document order, so that "last key wins" follows the document.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Value)>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<String, Value>()? {
            entries.push(entry);
        }
        Ok(entries)
    }
}

/// The serde field names of a derived struct, read by asking it to deserialize from a probe
/// that records the field list; this keeps the list in one place, the struct itself.
fn struct_fields<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields = None;
    // The probe always fails once it has seen the field list; the error carries nothing.
    let _ = T::deserialize(FieldProbe(&mut fields));
    fields.unwrap_or(&[])
}

struct FieldProbe<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldProbe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn may_hold_is_false_only_for_plain_utf8_without_the_text() {
        assert!(may_hold(br#"{"OldRC":"abc-1"}"#, "abc-1"));
        assert!(!may_hold(br#"{"OldRC":"abc-2"}"#, "abc-1"));
        assert!(may_hold(br#"{"OldRC":"\u0061bc-1"}"#, "abc-1"));
        assert!(may_hold(b"{\"OldRC\":\"\xff\"}", "abc-1"));
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Sample {
        #[serde(rename = "OldRC", default)]
        old_rc: String,
        #[serde(default)]
        desk: i64,
        #[serde(default)]
        list: Option<Vec<u8>>,
    }

    fn decode(json: &str) -> Result<Sample, serde_json::Error> {
        serde_json::from_str::<Folded<Sample>>(json).map(|f| f.0)
    }

    #[test]
    fn reads_the_field_list_of_a_derived_struct() {
        assert_eq!(struct_fields::<Sample>(), ["OldRC", "desk", "list"]);
    }

    #[test]
    fn matches_keys_case_insensitively_and_ignores_unknown_keys() {
        let s = decode(r#"{"oldrc":"a","DESK":3,"extra":{"x":1}}"#).unwrap();
        assert_eq!(s.old_rc, "a");
        assert_eq!(s.desk, 3);
    }

    #[test]
    fn last_duplicate_key_wins_and_null_is_a_no_op() {
        let s = decode(r#"{"OldRC":"first","oldRc":"second","desk":null}"#).unwrap();
        assert_eq!(s.old_rc, "second");
        assert_eq!(s.desk, 0);
        let s = decode(r#"{"desk":5,"DESK":null}"#).unwrap();
        assert_eq!(s.desk, 5);
    }

    #[test]
    fn folds_kelvin_sign_and_long_s_like_go() {
        let s = decode("{\"de\u{017F}\u{212A}\":7}").unwrap();
        assert_eq!(s.desk, 7);
        assert!(!go_fold_eq("des", "desk"));
        assert!(!go_fold_eq("deskk", "desk"));
    }

    #[test]
    fn rejects_non_objects_and_wrong_types() {
        assert!(decode("[1]").is_err());
        assert!(decode(r#"{"desk":"three"}"#).is_err());
    }

    #[test]
    fn writes_go_escapes() {
        let out = to_vec(&serde_json::json!({"k": "a<b>&c\u{2028}d\ne\u{8}f\u{c}g\u{1}\t\r\\\""}));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"k":"a\u003cb\u003e\u0026c\u2028d\ne\u0008f\u000cg\u0001\t\r\\\""}"#
        );
    }
}

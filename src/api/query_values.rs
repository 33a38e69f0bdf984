//! What a query parameter's value must be, and the one wording of a value that is not:
//! `must be <what the parameter takes>, got "<the value as sent>"`, whatever the parameter
//! and its kind. For a field of a route's query type, what it takes is read from the
//! parameter's own OpenAPI schema ([`takes`]), so the answer says what the published
//! document says; the parameters read from text by hand (`limit`, `index`, `wait`, a roll's
//! `state`, an event's `kind`) describe themselves with the same functions.

use std::fmt::Display;

use utoipa::openapi::schema::{KnownFormat, Schema, SchemaFormat, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::Number;

/// The cause of a value that is not what its parameter takes.
pub fn not_of_kind(takes: impl Display, got: &str) -> String {
    format!("must be {takes}, got {got:?}")
}

/// What a boolean parameter takes.
pub const BOOLEAN: &str = "true or false";

/// What a parameter takes when its schema says nothing more precise that can be worded.
pub const AS_DOCUMENTED: &str = "a value as the API document describes the parameter";

/// What a whole-number parameter from `min` to `max` takes.
pub fn whole_number(min: impl Display, max: impl Display) -> String {
    format!("a whole number from {min} to {max}")
}

/// What a duration parameter of at most `max` takes, in Go's duration text.
pub fn duration(max: &str) -> String {
    format!("a duration from 0s to {max} such as 30s")
}

/// What a parameter naming one of `names` takes: `a, b or c`.
pub fn one_of<S: AsRef<str>>(names: &[S]) -> String {
    match names {
        [] => "nothing".to_owned(),
        [one] => one.as_ref().to_owned(),
        [rest @ .., last] => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} or {}", rest.join(", "), last.as_ref())
        }
    }
}

/// What a parameter with this published `schema` takes: `true or false` for a boolean, a
/// whole number between the schema's `minimum` and `maximum` (or its format's bounds) for an
/// integer, one of its names for an enum, and [`AS_DOCUMENTED`] otherwise. A field whose
/// type is narrower than its format (a `u16` is published as `int32`) must declare its
/// bounds, `#[param(minimum = .., maximum = ..)]`, for the words to be true.
pub fn takes(schema: Option<&RefOr<Schema>>) -> String {
    let Some(RefOr::T(Schema::Object(object))) = schema else {
        return AS_DOCUMENTED.to_owned();
    };
    let SchemaType::Type(kind) = &object.schema_type else {
        return AS_DOCUMENTED.to_owned();
    };
    match kind {
        Type::Boolean => BOOLEAN.to_owned(),
        Type::Integer => {
            let (format_min, format_max) = match &object.format {
                Some(SchemaFormat::KnownFormat(KnownFormat::Int32)) => {
                    (Some(i32::MIN.to_string()), Some(i32::MAX.to_string()))
                }
                Some(SchemaFormat::KnownFormat(KnownFormat::Int64)) => {
                    (Some(i64::MIN.to_string()), Some(i64::MAX.to_string()))
                }
                _ => (None, None),
            };
            let min = object.minimum.as_ref().map(number).or(format_min);
            let max = object.maximum.as_ref().map(number).or(format_max);
            match (min, max) {
                (Some(min), Some(max)) => whole_number(min, max),
                _ => "a whole number".to_owned(),
            }
        }
        Type::String => match &object.enum_values {
            Some(values) => {
                let names: Vec<String> = values
                    .iter()
                    .map(|value| match value.as_str() {
                        Some(name) => name.to_owned(),
                        None => value.to_string(),
                    })
                    .collect();
                one_of(&names)
            }
            None => AS_DOCUMENTED.to_owned(),
        },
        _ => AS_DOCUMENTED.to_owned(),
    }
}

/// A schema's bound as the document writes it.
fn number(bound: &Number) -> String {
    match bound {
        Number::Int(n) => n.to_string(),
        Number::UInt(n) => n.to_string(),
        Number::Float(n) => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use utoipa::{IntoParams, ToSchema};

    use crate::api::extract::{declared_params, QueryProblems};

    #[derive(Debug, Deserialize, PartialEq, ToSchema)]
    #[serde(rename_all = "lowercase")]
    enum Shape {
        Round,
        Square,
    }

    #[derive(Debug, Deserialize, IntoParams, PartialEq)]
    #[into_params(parameter_in = Query)]
    struct Query {
        flag: Option<bool>,
        #[serde(default)]
        forced: bool,
        #[param(minimum = 0, maximum = 65535)]
        count: Option<u16>,
        /// Bounded by its format alone.
        big: Option<i64>,
        #[param(inline)]
        shape: Option<Shape>,
        /// Published as a reference, whose names the parameter does not carry.
        other_shape: Option<Shape>,
        text: Option<String>,
    }

    /// The query read as a route reads it, or the `(parameter, cause)` of each refusal.
    fn read(query: &str) -> Result<Query, Vec<(String, String)>> {
        let mut problems = QueryProblems::new(Some(query), declared_params::<Query>);
        let value = problems.read();
        match problems.finish() {
            Ok(()) => Ok(value.expect("read when nothing is refused")),
            Err(e) => Err(e
                .body()
                .causes
                .into_iter()
                .map(|c| (c.field, c.message))
                .collect()),
        }
    }

    #[test]
    fn reads_each_kind() {
        assert_eq!(
            read("flag=false&forced=true&count=7&big=-8&shape=square&other_shape=round&text=a+b")
                .unwrap(),
            Query {
                flag: Some(false),
                forced: true,
                count: Some(7),
                big: Some(-8),
                shape: Some(Shape::Square),
                other_shape: Some(Shape::Round),
                text: Some("a b".to_owned()),
            }
        );
        assert_eq!(read("text=").unwrap().text.as_deref(), Some(""));
    }

    #[test]
    fn a_value_not_of_its_kind_says_what_the_published_schema_takes() {
        let refused =
            |field: &str, message: &str| Err(vec![(field.to_owned(), message.to_owned())]);
        assert_eq!(
            read("flag=y%65s"),
            refused("flag", r#"must be true or false, got "yes""#)
        );
        assert_eq!(
            read("forced=TRUE"),
            refused("forced", r#"must be true or false, got "TRUE""#)
        );
        assert_eq!(
            read("count=-1"),
            refused(
                "count",
                r#"must be a whole number from 0 to 65535, got "-1""#
            )
        );
        assert_eq!(
            read("big=x"),
            refused(
                "big",
                r#"must be a whole number from -9223372036854775808 to 9223372036854775807, got "x""#
            )
        );
        assert_eq!(
            read("shape=oval"),
            refused("shape", r#"must be round or square, got "oval""#)
        );
        assert_eq!(
            read("other_shape=oval"),
            refused(
                "other_shape",
                r#"must be a value as the API document describes the parameter, got "oval""#
            )
        );
    }

    #[test]
    fn one_of_lists_names_as_a_sentence() {
        assert_eq!(super::one_of::<&str>(&[]), "nothing");
        assert_eq!(super::one_of(&["all"]), "all");
        assert_eq!(super::one_of(&["a", "b", "c"]), "a, b or c");
    }
}

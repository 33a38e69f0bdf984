//! Kubernetes-style label selectors: parsing, canonical text and matching.
//!
//! Selectors are stored as text (an RC's `node_selector`, a DS's `node_selector`) and compared
//! by their canonical text, so parsing and printing must agree with P2's vendored Kubernetes
//! parser: `parse(display(s))` prints the same as `s`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::validation::{validate_label_key, validate_label_value};
use super::LabelValues;

/// How a requirement relates a key to its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `k=v`: present and equal.
    Equals,
    /// `k==v`: the same as [`Operator::Equals`], kept apart so the text round-trips.
    DoubleEquals,
    /// `k!=v`: absent, or present with another value.
    NotEquals,
    /// `k in (a,b)`: present with one of the values.
    In,
    /// `k notin (a,b)`: absent, or present with none of the values.
    NotIn,
    /// `k`: present with any value.
    Exists,
    /// `!k`: absent.
    DoesNotExist,
}

/// One condition of a selector; always valid, because the only ways to build one check it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    /// One value for the equality forms, a sorted set for `in`/`notin`, none otherwise.
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, checking the key, every value and the number of values
    /// (one for `=`, `==`, `!=`; at least one for `in`/`notin`; none for existence).
    /// Set values are de-duplicated and sorted, as the canonical text needs.
    pub fn new<I, V>(key: impl Into<String>, operator: Operator, values: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = V>,
        V: Into<String>,
    {
        let key = key.into();
        validate_label_key(&key).map_err(|e| format!("invalid label key {key:?}: {e}"))?;
        let mut values: Vec<String> = values.into_iter().map(Into::into).collect();
        for value in &values {
            validate_label_value(value)
                .map_err(|e| format!("invalid label value {value:?}: {e}"))?;
        }
        match operator {
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    return Err(format!(
                        "'{}' takes exactly one value, got {}",
                        operator_text(operator),
                        values.len()
                    ));
                }
            }
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    return Err(format!(
                        "'{}' needs at least one value",
                        operator_text(operator)
                    ));
                }
                values.sort();
                values.dedup();
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    return Err(format!(
                        "an existence requirement takes no values, got {}",
                        values.len()
                    ));
                }
            }
        }
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    /// `key=value`, the requirement the farms use to find what they own.
    pub fn equals(key: impl Into<String>, value: impl Into<String>) -> Result<Self, String> {
        Requirement::new(key, Operator::Equals, [value.into()])
    }

    /// The label key this requirement is about.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How the key is tested.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values compared against (sorted for set forms, empty for existence).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a label set satisfies this requirement; the negative forms hold for an
    /// absent key, as in Kubernetes.
    pub fn matches(&self, labels: &(impl LabelValues + ?Sized)) -> bool {
        let value = labels.value(&self.key);
        let listed = |v: &str| self.values.iter().any(|listed| listed == v);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => value.is_some_and(listed),
            Operator::NotEquals | Operator::NotIn => !value.is_some_and(listed),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.operator {
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::In | Operator::NotIn => write!(
                f,
                "{} {} ({})",
                self.key,
                operator_text(self.operator),
                self.values.join(",")
            ),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => write!(
                f,
                "{}{}{}",
                self.key,
                operator_text(self.operator),
                self.values[0]
            ),
        }
    }
}

/// The operator as written in a selector.
fn operator_text(operator: Operator) -> &'static str {
    match operator {
        Operator::Equals => "=",
        Operator::DoubleEquals => "==",
        Operator::NotEquals => "!=",
        Operator::In => "in",
        Operator::NotIn => "notin",
        Operator::Exists => "",
        Operator::DoesNotExist => "!",
    }
}

/// A conjunction of requirements; the empty selector matches everything.
///
/// Requirements are kept sorted by key (stably, so ties keep the order they were given in),
/// which makes the printed form canonical. Serialises as that text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector with no requirements, which matches every label set.
    pub fn everything() -> Selector {
        Selector::default()
    }

    /// P2's "matches nothing" selector, `x=1,x=0`: contradictory, yet it survives a text
    /// round trip, unlike a special value would.
    pub fn nothing() -> Selector {
        let one = Requirement::equals("x", "1").expect("'x=1' is a valid requirement");
        let zero = Requirement::equals("x", "0").expect("'x=0' is a valid requirement");
        Selector::from_requirements([one, zero])
    }

    /// A selector from already-checked requirements, sorted into canonical order.
    pub fn from_requirements(requirements: impl IntoIterator<Item = Requirement>) -> Selector {
        let mut requirements: Vec<Requirement> = requirements.into_iter().collect();
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Selector { requirements }
    }

    /// This selector with one more requirement, kept in canonical order.
    pub fn and(self, requirement: Requirement) -> Selector {
        Selector::from_requirements(self.requirements.into_iter().chain([requirement]))
    }

    /// The requirements in canonical order.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether every requirement holds for the label set.
    pub fn matches(&self, labels: &(impl LabelValues + ?Sized)) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector has no requirements and so selects everything; callers
    /// use it to refuse an unbounded selection where one is dangerous.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

/// Why a selector did not parse, and at which character (counted from 0) of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector at position {position}: {message}")]
pub struct ParseSelectorError {
    /// Character offset of the offending token; the input's length for "end of input".
    pub position: usize,
    /// What was expected or what is wrong there.
    pub message: String,
}

impl FromStr for Selector {
    type Err = ParseSelectorError;

    /// Parses the Kubernetes selector grammar:
    ///
    /// ```text
    /// selector    ::= "" | requirement ("," requirement)*
    /// requirement ::= "!" KEY | KEY | KEY ("=" | "==" | "!=") VALUE? | KEY ("in" | "notin") set
    /// set         ::= "(" VALUE? ("," VALUE?)* ")"
    /// ```
    ///
    /// A missing value is the empty string. `in` and `notin` are keywords only where an
    /// operator is expected. Unlike P2's parser this also accepts `(a,,)`, which P2 refuses
    /// although it accepts `(a,,b)` and `(a,)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parser = Parser {
            tokens: lex(s),
            next: 0,
        };
        Ok(Selector::from_requirements(parser.selector()?))
    }
}

impl Serialize for Selector {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Selector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for Selector {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "Kubernetes label selector, e.g. `az=us-west-2a,tier in (web,api),!draining`; \
                 the empty string selects everything",
            ))
            .examples([serde_json::json!("cluster_name=production,!draining")])
            .into()
    }
}

impl utoipa::ToSchema for Selector {}

/// What the lexer found; `in` and `notin` are words whose meaning depends on position.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    OpenParen,
    CloseParen,
    Comma,
    End,
}

impl Token {
    /// How the token is named in error messages.
    fn describe(&self) -> String {
        match self {
            Token::Word(w) => format!("'{w}'"),
            Token::Not => "'!'".to_string(),
            Token::Equals => "'='".to_string(),
            Token::DoubleEquals => "'=='".to_string(),
            Token::NotEquals => "'!='".to_string(),
            Token::OpenParen => "'('".to_string(),
            Token::CloseParen => "')'".to_string(),
            Token::Comma => "','".to_string(),
            Token::End => "end of input".to_string(),
        }
    }
}

/// Selector whitespace is exactly Kubernetes': other Unicode spaces end up inside a word and
/// fail key or value validation.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',')
}

/// Splits the input into tokens with their character positions; never fails, because any
/// run of ordinary characters is a word and every special character is a token.
fn lex(s: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = s.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_space(c) {
            i += 1;
            continue;
        }
        let start = i;
        let next = chars.get(i + 1).copied();
        let token = match (c, next) {
            ('=', Some('=')) => Token::DoubleEquals,
            ('!', Some('=')) => Token::NotEquals,
            ('=', _) => Token::Equals,
            ('!', _) => Token::Not,
            ('(', _) => Token::OpenParen,
            (')', _) => Token::CloseParen,
            (',', _) => Token::Comma,
            _ => {
                while i < chars.len() && !is_space(chars[i]) && !is_special(chars[i]) {
                    i += 1;
                }
                tokens.push((start, Token::Word(chars[start..i].iter().collect())));
                continue;
            }
        };
        i += if matches!(token, Token::DoubleEquals | Token::NotEquals) {
            2
        } else {
            1
        };
        tokens.push((start, token));
    }
    tokens.push((chars.len(), Token::End));
    tokens
}

/// Recursive-descent parser over the token list, which always ends with [`Token::End`].
struct Parser {
    tokens: Vec<(usize, Token)>,
    next: usize,
}

impl Parser {
    fn peek(&self) -> &(usize, Token) {
        &self.tokens[self.next]
    }

    fn advance(&mut self) -> (usize, Token) {
        let item = self.tokens[self.next].clone();
        if item.1 != Token::End {
            self.next += 1;
        }
        item
    }

    fn error(position: usize, message: impl Into<String>) -> ParseSelectorError {
        ParseSelectorError {
            position,
            message: message.into(),
        }
    }

    fn unexpected(expected: &str, (position, found): &(usize, Token)) -> ParseSelectorError {
        Parser::error(
            *position,
            format!("expected {expected}, found {}", found.describe()),
        )
    }

    fn selector(&mut self) -> Result<Vec<Requirement>, ParseSelectorError> {
        let mut requirements = Vec::new();
        if self.peek().1 == Token::End {
            return Ok(requirements);
        }
        loop {
            if !matches!(self.peek().1, Token::Word(_) | Token::Not) {
                let what = if requirements.is_empty() {
                    "a key, '!' or end of input"
                } else {
                    "a key or '!' after ','"
                };
                return Err(Parser::unexpected(what, self.peek()));
            }
            requirements.push(self.requirement()?);
            let after = self.advance();
            match after.1 {
                Token::End => return Ok(requirements),
                Token::Comma => {}
                _ => return Err(Parser::unexpected("',' or end of input", &after)),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, ParseSelectorError> {
        let negated = self.peek().1 == Token::Not;
        if negated {
            self.advance();
        }
        let (key_at, key) = match self.advance() {
            (at, Token::Word(word)) => (at, word),
            other => return Err(Parser::unexpected("a key", &other)),
        };
        validate_label_key(&key)
            .map_err(|e| Parser::error(key_at, format!("invalid label key {key:?}: {e}")))?;
        let ends_requirement = matches!(self.peek().1, Token::End | Token::Comma);
        if negated || ends_requirement {
            if !ends_requirement {
                return Err(Parser::unexpected(
                    &format!("',' or end of input after '!{key}'"),
                    self.peek(),
                ));
            }
            let operator = if negated {
                Operator::DoesNotExist
            } else {
                Operator::Exists
            };
            return Ok(Requirement {
                key,
                operator,
                values: Vec::new(),
            });
        }
        let operator_token = self.advance();
        let (operator, values) = match &operator_token.1 {
            Token::Equals => (Operator::Equals, self.exact_value()?),
            Token::DoubleEquals => (Operator::DoubleEquals, self.exact_value()?),
            Token::NotEquals => (Operator::NotEquals, self.exact_value()?),
            Token::Word(w) if w == "in" => (Operator::In, self.value_set(w)?),
            Token::Word(w) if w == "notin" => (Operator::NotIn, self.value_set(w)?),
            _ => {
                return Err(Parser::unexpected(
                    &format!("'=', '==', '!=', 'in' or 'notin' after key '{key}'"),
                    &operator_token,
                ))
            }
        };
        Requirement::new(key, operator, values).map_err(|e| Parser::error(operator_token.0, e))
    }

    /// The value after `=`, `==` or `!=`; nothing before `,` or the end means `""`.
    fn exact_value(&mut self) -> Result<Vec<String>, ParseSelectorError> {
        match self.peek().1 {
            Token::End | Token::Comma => Ok(vec![String::new()]),
            _ => Ok(vec![self.value()?]),
        }
    }

    /// `( v1, v2, … )` where any entry may be empty, meaning `""`.
    fn value_set(&mut self, keyword: &str) -> Result<Vec<String>, ParseSelectorError> {
        let open = self.advance();
        if open.1 != Token::OpenParen {
            return Err(Parser::unexpected(&format!("'(' after '{keyword}'"), &open));
        }
        let mut values = Vec::new();
        loop {
            match self.peek().1 {
                Token::Word(_) => values.push(self.value()?),
                Token::Comma | Token::CloseParen => values.push(String::new()),
                _ => return Err(Parser::unexpected("a value, ',' or ')'", self.peek())),
            }
            let after = self.advance();
            match after.1 {
                Token::Comma => {}
                Token::CloseParen => return Ok(values),
                _ => return Err(Parser::unexpected("',' or ')'", &after)),
            }
        }
    }

    /// One word in value position (where `in` and `notin` are plain values), validated.
    fn value(&mut self) -> Result<String, ParseSelectorError> {
        match self.advance() {
            (at, Token::Word(value)) => {
                validate_label_value(&value).map_err(|e| {
                    Parser::error(at, format!("invalid label value {value:?}: {e}"))
                })?;
                Ok(value)
            }
            other => Err(Parser::unexpected("a value", &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::Labels;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(s: &str) -> Selector {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn parse_err(s: &str) -> ParseSelectorError {
        match s.parse::<Selector>() {
            Ok(sel) => panic!("{s:?} should not parse, got {sel}"),
            Err(e) => e,
        }
    }

    fn only(s: &str) -> Requirement {
        let sel = parse(s);
        assert_eq!(sel.requirements().len(), 1, "{s}");
        sel.requirements()[0].clone()
    }

    fn assert_req(s: &str, key: &str, operator: Operator, values: &[&str]) {
        let r = only(s);
        assert_eq!(r.key(), key, "{s}");
        assert_eq!(r.operator(), operator, "{s}");
        assert_eq!(r.values(), values, "{s}");
    }

    #[test]
    fn every_grammar_form() {
        assert_req("k=v", "k", Operator::Equals, &["v"]);
        assert_req("k==v", "k", Operator::DoubleEquals, &["v"]);
        assert_req("k!=v", "k", Operator::NotEquals, &["v"]);
        assert_req("k in (b,a)", "k", Operator::In, &["a", "b"]);
        assert_req("k notin (b,a)", "k", Operator::NotIn, &["a", "b"]);
        assert_req("k", "k", Operator::Exists, &[]);
        assert_req("!k", "k", Operator::DoesNotExist, &[]);
        assert_req(
            "example.com/app=web-1",
            "example.com/app",
            Operator::Equals,
            &["web-1"],
        );
    }

    #[test]
    fn whitespace_between_tokens_is_ignored() {
        assert_eq!(parse(" k = v ").to_string(), "k=v");
        assert_eq!(parse("k\t==\nv\r").to_string(), "k==v");
        assert_eq!(parse("k in(a , b)").to_string(), "k in (a,b)");
        assert_eq!(parse("k notin(a)").to_string(), "k notin (a)");
        assert_eq!(parse("! k , j").to_string(), "j,!k");
        assert_eq!(parse("a=1 , b != 2").to_string(), "a=1,b!=2");
    }

    #[test]
    fn whitespace_separates_words() {
        // "kin" is one word, so no operator follows the key.
        let e = parse_err("kin (a)");
        assert_eq!(e.position, 4);
        assert!(e.message.contains("found '('"), "{e}");
        let e = parse_err("k in (a b)");
        assert_eq!(e.position, 8);
        assert!(e.message.contains("expected ',' or ')', found 'b'"), "{e}");
        // Other Unicode spaces are not separators, so they end up in the key.
        assert!(parse_err("a\u{a0}=b").message.contains("invalid label key"));
    }

    #[test]
    fn empty_input_is_everything() {
        for s in ["", " ", "\t\r\n "] {
            let sel = parse(s);
            assert!(sel.is_everything(), "{s:?}");
            assert_eq!(sel, Selector::everything());
            assert_eq!(sel.to_string(), "");
        }
        assert!(Selector::everything().matches(&Labels::new()));
        assert!(Selector::everything().matches(&labels(&[("a", "b")])));
        assert!(!parse("a").is_everything());
    }

    /// An object without a label set is matched as one with no labels.
    #[test]
    fn an_absent_label_set_is_an_empty_one() {
        let none: Option<&Labels> = None;
        let some = labels(&[("k", "v")]);
        assert!(parse("!k").matches(&none));
        assert!(parse("k notin (v)").matches(&none));
        assert!(!parse("k").matches(&none));
        assert!(!parse("k=v").matches(&none));
        assert!(parse("k=v").matches(&Some(&some)));
        assert!(!parse("!k").matches(&Some(&some)));
    }

    #[test]
    fn missing_exact_value_is_the_empty_string() {
        assert_req("k=", "k", Operator::Equals, &[""]);
        assert_req("k==", "k", Operator::DoubleEquals, &[""]);
        assert_req("k!=", "k", Operator::NotEquals, &[""]);
        let sel = parse("k=,j=x");
        assert_eq!(sel.to_string(), "j=x,k=");
        assert_eq!(sel.requirements()[1].values(), [""]);
        assert!(parse("k=").matches(&labels(&[("k", "")])));
        assert!(!parse("k=").matches(&labels(&[("k", "v")])));
        assert!(!parse("k=").matches(&Labels::new()));
    }

    #[test]
    fn empty_entries_in_value_lists_are_the_empty_string() {
        assert_req("k in ()", "k", Operator::In, &[""]);
        assert_req("k in (,)", "k", Operator::In, &[""]);
        assert_req("k in (a,,b)", "k", Operator::In, &["", "a", "b"]);
        assert_req("k in (,a)", "k", Operator::In, &["", "a"]);
        assert_req("k in (a,)", "k", Operator::In, &["", "a"]);
        assert_req("k in (a,,)", "k", Operator::In, &["", "a"]);
        assert_req("k notin ( , )", "k", Operator::NotIn, &[""]);
        assert_req("k in (b,a,b)", "k", Operator::In, &["a", "b"]);
        assert!(parse("k in ()").matches(&labels(&[("k", "")])));
        assert!(!parse("k in ()").matches(&labels(&[("k", "x")])));
    }

    #[test]
    fn in_and_notin_are_keywords_only_in_operator_position() {
        assert_req("in", "in", Operator::Exists, &[]);
        assert_req("!notin", "notin", Operator::DoesNotExist, &[]);
        assert_req("in=in", "in", Operator::Equals, &["in"]);
        assert_req("in in (in,notin)", "in", Operator::In, &["in", "notin"]);
        assert_req("notin notin (notin)", "notin", Operator::NotIn, &["notin"]);
        assert_req("k!=notin", "k", Operator::NotEquals, &["notin"]);
        assert_eq!(parse("a,in").to_string(), "a,in");
        let e = parse_err("k in in");
        assert!(
            e.message.contains("expected '(' after 'in', found 'in'"),
            "{e}"
        );
    }

    #[test]
    fn set_forms_need_at_least_one_value() {
        // The parser cannot produce an empty set (`()` already means `""`), so the rule is
        // enforced where requirements are built.
        let none: [&str; 0] = [];
        let e = Requirement::new("k", Operator::In, none).unwrap_err();
        assert!(e.contains("'in' needs at least one value"), "{e}");
        let e = Requirement::new("k", Operator::NotIn, none).unwrap_err();
        assert!(e.contains("'notin' needs at least one value"), "{e}");
    }

    #[test]
    fn value_counts_are_checked_for_built_requirements() {
        let e = Requirement::new("k", Operator::Equals, ["a", "b"]).unwrap_err();
        assert!(e.contains("'=' takes exactly one value, got 2"), "{e}");
        let none: [&str; 0] = [];
        assert!(Requirement::new("k", Operator::NotEquals, none).is_err());
        assert!(Requirement::new("k", Operator::Exists, ["a"]).is_err());
        assert!(Requirement::new("k", Operator::DoesNotExist, ["a"]).is_err());
        assert!(Requirement::new("k", Operator::Exists, none).is_ok());
        assert!(Requirement::new("bad key", Operator::Exists, none)
            .unwrap_err()
            .contains("invalid label key \"bad key\""));
        assert!(Requirement::equals("k", "bad value")
            .unwrap_err()
            .contains("invalid label value \"bad value\""));
    }

    #[test]
    fn canonical_form() {
        let cases = [
            ("k=v", "k=v"),
            ("k==v", "k==v"),
            ("k!=v", "k!=v"),
            ("k in (b,a)", "k in (a,b)"),
            ("k   notin   ( c , a ,b )", "k notin (a,b,c)"),
            ("k in (a,,b)", "k in (,a,b)"),
            ("k", "k"),
            ("!k", "!k"),
            ("z=1,a=2,m", "a=2,m,z=1"),
            ("x=1,x=0", "x=1,x=0"),
            ("x=0,x=1", "x=0,x=1"),
            ("b,!a,a=1,c in (y,x)", "!a,a=1,b,c in (x,y)"),
            (
                "tier notin (web), app.io/name==api ,!draining,zone",
                "app.io/name==api,!draining,tier notin (web),zone",
            ),
        ];
        for (input, canonical) in cases {
            assert_eq!(parse(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn canonical_form_round_trips() {
        for input in [
            "",
            "k=",
            "k in ()",
            "k notin (,a)",
            "a=1,a=2,a!=3,a==4",
            "x=1,x=0",
            "in in (in),notin,!x,y notin (a,b,,c)",
            "example.com/a==b , b in (c) , !c",
        ] {
            let once = parse(input).to_string();
            let reparsed = parse(&once);
            assert_eq!(reparsed.to_string(), once, "{input}");
            assert_eq!(reparsed, parse(input), "{input}");
        }
    }

    #[test]
    fn ties_keep_written_order() {
        let sel = parse("b=1,a!=2,b=0,a=3,b==9");
        assert_eq!(sel.to_string(), "a!=2,a=3,b=1,b=0,b==9");
    }

    #[test]
    fn nothing_matches_nothing_and_round_trips() {
        let nothing = Selector::nothing();
        assert_eq!(nothing.to_string(), "x=1,x=0");
        assert_eq!(parse(&nothing.to_string()), nothing);
        assert!(!nothing.is_everything());
        for set in [
            labels(&[]),
            labels(&[("x", "1")]),
            labels(&[("x", "0")]),
            labels(&[("y", "1")]),
        ] {
            assert!(!nothing.matches(&set), "{set:?}");
        }
    }

    #[test]
    fn matching_truth_table() {
        let absent = labels(&[("other", "v")]);
        let equal = labels(&[("k", "v")]);
        let different = labels(&[("k", "w")]);
        let empty = labels(&[("k", "")]);
        // (selector, absent, k=v, k=w, k="")
        let table = [
            ("k=v", false, true, false, false),
            ("k==v", false, true, false, false),
            ("k!=v", true, false, true, true),
            ("k in (v,x)", false, true, false, false),
            ("k notin (v,x)", true, false, true, true),
            ("k in (v,w)", false, true, true, false),
            ("k notin (v,w)", true, false, false, true),
            ("k in ()", false, false, false, true),
            ("k notin ()", true, true, true, false),
            ("k", false, true, true, true),
            ("!k", true, false, false, false),
            ("k=", false, false, false, true),
            ("k!=", true, true, true, false),
        ];
        for (s, on_absent, on_equal, on_different, on_empty) in table {
            let sel = parse(s);
            assert_eq!(sel.matches(&absent), on_absent, "{s} on absent key");
            assert_eq!(sel.matches(&equal), on_equal, "{s} on k=v");
            assert_eq!(sel.matches(&different), on_different, "{s} on k=w");
            assert_eq!(sel.matches(&empty), on_empty, "{s} on k=\"\"");
        }
    }

    #[test]
    fn all_requirements_must_hold() {
        let sel = parse("app=web,zone in (a,b),!draining");
        assert!(sel.matches(&labels(&[("app", "web"), ("zone", "a")])));
        assert!(sel.matches(&labels(&[("app", "web"), ("zone", "b"), ("x", "y")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("zone", "c")])));
        assert!(!sel.matches(&labels(&[("app", "api"), ("zone", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("zone", "a"), ("draining", "")])));
        assert!(!sel.matches(&labels(&[("zone", "a")])));
    }

    #[test]
    fn invalid_keys_and_values_are_rejected_with_their_position() {
        let e = parse_err("a=1,-bad=2");
        assert_eq!(e.position, 4);
        assert!(e.message.contains("invalid label key \"-bad\""), "{e}");
        assert!(
            e.message.contains("must start with a letter or digit"),
            "{e}"
        );

        let e = parse_err("a=1,k in (good,bad_)");
        assert_eq!(e.position, 15);
        assert!(e.message.contains("invalid label value \"bad_\""), "{e}");

        let e = parse_err(&format!("k={}", "v".repeat(64)));
        assert_eq!(e.position, 2);
        assert!(e.message.contains("at most 63 characters"), "{e}");

        let e = parse_err("a/b/c");
        assert!(e.message.contains("at most one '/'"), "{e}");
        assert!(parse_err("!Bad.Prefix/x").message.contains("prefix"));
        assert!(parse_err("k=a/b").message.contains("invalid label value"));
        assert!(parse_err("k>1").message.contains("contains '>'"));
        assert!(parse_err("é=1").message.contains("contains 'é'"));
    }

    #[test]
    fn unknown_or_misplaced_tokens() {
        let e = parse_err("k=v)");
        assert_eq!(e.position, 3);
        assert!(
            e.message
                .contains("expected ',' or end of input, found ')'"),
            "{e}"
        );

        let e = parse_err("k v");
        assert_eq!(e.position, 2);
        assert!(e.message.contains("'in' or 'notin' after key 'k'"), "{e}");
        assert!(e.message.contains("found 'v'"), "{e}");

        let e = parse_err("=v");
        assert_eq!(e.position, 0);
        assert!(
            e.message
                .contains("expected a key, '!' or end of input, found '='"),
            "{e}"
        );

        let e = parse_err("k=(v)");
        assert!(e.message.contains("expected a value, found '('"), "{e}");
        assert!(parse_err("k===v").message.contains("found '='"));
        assert!(parse_err("k=!v").message.contains("found '!'"));
        assert!(parse_err("!!k")
            .message
            .contains("expected a key, found '!'"));
        assert!(parse_err("!")
            .message
            .contains("expected a key, found end of input"));

        let e = parse_err("!k=v");
        assert_eq!(e.position, 2);
        assert!(e.message.contains("after '!k', found '='"), "{e}");
    }

    #[test]
    fn missing_identifier_after_comma() {
        let e = parse_err("a=1,");
        assert_eq!(e.position, 4);
        assert!(e.message.contains("a key or '!' after ','"), "{e}");
        assert!(e.message.contains("end of input"), "{e}");
        let e = parse_err("a,,b");
        assert_eq!(e.position, 2);
        assert!(e.message.contains("after ','"), "{e}");
        let e = parse_err(",a");
        assert_eq!(e.position, 0);
        assert!(e.message.contains("found ','"), "{e}");
    }

    #[test]
    fn missing_parentheses() {
        let e = parse_err("k in a");
        assert_eq!(e.position, 5);
        assert!(
            e.message.contains("expected '(' after 'in', found 'a'"),
            "{e}"
        );
        let e = parse_err("k notin");
        assert_eq!(e.position, 7);
        assert!(
            e.message.contains("'(' after 'notin', found end of input"),
            "{e}"
        );
        let e = parse_err("k in (a,b");
        assert_eq!(e.position, 9);
        assert!(
            e.message
                .contains("expected ',' or ')', found end of input"),
            "{e}"
        );
        let e = parse_err("k in (");
        assert!(e.message.contains("a value, ',' or ')'"), "{e}");
        let e = parse_err("k in (a=b)");
        assert!(e.message.contains("found '='"), "{e}");
    }

    #[test]
    fn error_display_names_the_position() {
        let e = parse_err("a=1,");
        assert_eq!(
            e.to_string(),
            "invalid selector at position 4: expected a key or '!' after ',', found end of input"
        );
    }

    #[test]
    fn built_selectors_are_canonical() {
        let sel = Selector::everything()
            .and(Requirement::equals("z", "1").unwrap())
            .and(Requirement::new("a", Operator::NotIn, ["y", "x", "y"]).unwrap());
        assert_eq!(sel.to_string(), "a notin (x,y),z=1");
        assert_eq!(parse(&sel.to_string()), sel);
        let from = Selector::from_requirements(sel.requirements().iter().rev().cloned());
        assert_eq!(from, sel);
    }

    #[test]
    fn serde_uses_the_canonical_text() {
        let sel = parse("z=1, a in (c,b)");
        let json = serde_json::to_string(&sel).unwrap();
        assert_eq!(json, "\"a in (b,c),z=1\"");
        assert_eq!(serde_json::from_str::<Selector>(&json).unwrap(), sel);
        assert_eq!(
            serde_json::from_str::<Selector>("\"\"").unwrap(),
            Selector::everything()
        );
        let e = serde_json::from_str::<Selector>("\"a=1,\"").unwrap_err();
        assert!(
            e.to_string().contains("invalid selector at position 4"),
            "{e}"
        );
    }
}

//! Go-style durations: `"1h30m"` text in the API, integer nanoseconds in stored documents.
//!
//! P2's tools and documents speak Go's `time.Duration`, so the API accepts and prints the same
//! text forms (`ParseDuration` / `Duration.String`), limited to what Go can hold (about 292
//! years) and to non-negative values.

use std::time::Duration;

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;
/// Go's `time.Duration` is an `int64` of nanoseconds; nothing longer survives a round trip.
const MAX_NANOS: u128 = i64::MAX as u128;
/// Fraction digits beyond this are below a nanosecond even for hours, so they are ignored.
const MAX_FRACTION_DIGITS: usize = 18;

/// The text [`parse_duration`] takes, for the API document: `0`, or one or more numbers
/// (with an optional fraction) each with its unit, after an optional `+`. The bounds a
/// parameter or field adds are given in its words.
pub const DURATION_PATTERN: &str =
    r"^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|\u00B5s|\u03BCs|ms|s|m|h))+)$";

/// Parses Go duration text such as `"30s"`, `"1h30m"`, `"1.5s"`, `"500ms"` or `"0"`.
///
/// Units are `ns`, `us` (or `µs`/`μs`), `ms`, `s`, `m` and `h`; components may be combined and
/// carry fractions. Negative durations are refused because nothing in the domain can wait a
/// negative time.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = |why: &str| format!("invalid duration {text:?}: {why}");
    if text.starts_with('-') {
        return Err(invalid("negative durations are not allowed"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("empty"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = split_digits(rest);
        let (fraction, after, had_dot) = match after.strip_prefix('.') {
            Some(after_dot) => {
                let (fraction, after) = split_digits(after_dot);
                (fraction, after, true)
            }
            None => ("", after, false),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid(if had_dot {
                "a '.' needs digits"
            } else {
                "expected a number"
            }));
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => NANOS_PER_MICRO,
            "ms" => NANOS_PER_MILLI,
            "s" => NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "h" => 3600 * NANOS_PER_SECOND,
            "" => return Err(invalid("missing unit")),
            other => return Err(invalid(&format!("unknown unit {other:?}"))),
        };
        let overflow = || invalid("too long (the limit is about 292 years)");
        let mut component = whole
            .bytes()
            .try_fold(0u128, |acc, digit| {
                acc.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
            })
            .and_then(|n| n.checked_mul(unit_nanos))
            .ok_or_else(overflow)?;
        let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
        if !fraction.is_empty() {
            let numerator: u128 = fraction.parse().map_err(|_| invalid("bad fraction"))?;
            let scale = 10u128.pow(fraction.len() as u32);
            component += numerator * unit_nanos / scale;
        }
        total = total.checked_add(component).ok_or_else(overflow)?;
        if total > MAX_NANOS {
            return Err(overflow());
        }
        rest = after;
    }
    Ok(Duration::from_nanos(total as u64))
}

fn split_digits(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.split_at(end)
}

/// Prints a duration as Go's `Duration.String` does (`"1h30m0s"`, `"30s"`, `"1.5s"`,
/// `"500ms"`, `"0s"`), so values shown by the API read the same as in P2's tools.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < NANOS_PER_MICRO {
        return format!("{nanos}ns");
    }
    if nanos < NANOS_PER_MILLI {
        return format!("{}\u{b5}s", with_fraction(nanos, 3));
    }
    if nanos < NANOS_PER_SECOND {
        return format!("{}ms", with_fraction(nanos, 6));
    }
    let seconds = nanos / NANOS_PER_SECOND;
    let (hours, minutes) = (seconds / 3600, seconds / 60 % 60);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    let whole_and_sub = (seconds % 60) * NANOS_PER_SECOND + nanos % NANOS_PER_SECOND;
    out.push_str(&with_fraction(whole_and_sub, 9));
    out.push('s');
    out
}

/// `value / 10^digits` printed with only the significant fraction digits.
fn with_fraction(value: u128, digits: u32) -> String {
    let scale = 10u128.pow(digits);
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:0width$}", width = digits as usize);
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// Serde helper for durations carried as Go duration text, for the API:
/// `#[serde(with = "crate::model::duration::duration_string")]`.
pub mod duration_string {
    use std::time::Duration;

    use serde::{de, Deserialize, Deserializer, Serializer};

    /// Writes the duration as Go duration text.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*duration))
    }

    /// Reads Go duration text.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(de::Error::custom)
    }

    /// The same for optional fields, such as the fields of a partial update.
    pub mod option {
        use std::time::Duration;

        use serde::{de, Deserialize, Deserializer, Serializer};

        /// Writes `null` or Go duration text.
        pub fn serialize<S: Serializer>(
            duration: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match duration {
                Some(duration) => super::serialize(duration, serializer),
                None => serializer.serialize_none(),
            }
        }

        /// Reads `null` or Go duration text.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(deserializer)?
                .map(|text| crate::model::parse_duration(&text).map_err(de::Error::custom))
                .transpose()
        }
    }
}

/// Serde helper for durations stored as Go's `time.Duration` JSON, an integer count of
/// nanoseconds: `#[serde(with = "crate::model::duration::duration_nanos")]`.
pub mod duration_nanos {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes whole nanoseconds, saturating at Go's limit (about 292 years), which no real
    /// delay or timeout reaches.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        let nanos = duration.as_nanos().min(super::MAX_NANOS) as u64;
        serializer.serialize_u64(nanos)
    }

    /// Reads whole nanoseconds; a negative value (which Go's `time.Duration` may hold) is
    /// read as zero, as P2 reads a negative `RollDelay` (it only waits when `> 0`).
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let nanos = i64::deserialize(deserializer)?;
        Ok(Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
    }
}

/// A daemon set's per-node timeout that P2 stores as negative nanoseconds: "no timeout".
pub const NO_TIMEOUT: Duration = Duration::from_nanos(u64::MAX);

/// A DS timeout as the API shows it: Go's text, and [`NO_TIMEOUT`] as Go prints the
/// negative duration P2 stores for it, `"-1ns"`.
pub fn format_timeout(timeout: Duration) -> String {
    if timeout == NO_TIMEOUT {
        "-1ns".to_owned()
    } else {
        format_duration(timeout)
    }
}

/// A DS `timeout` in nanoseconds, where a negative value (P2's "no timeout") reads as
/// [`NO_TIMEOUT`] and is written back as `-1`.
pub mod timeout_nanos {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::NO_TIMEOUT;

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        if *duration == NO_TIMEOUT {
            return serializer.serialize_i64(-1);
        }
        super::duration_nanos::serialize(duration, serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let nanos = i64::deserialize(deserializer)?;
        Ok(u64::try_from(nanos).map_or(NO_TIMEOUT, Duration::from_nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_go_forms() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("10m", Duration::from_secs(600)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", ms(500)),
            ("1.5s", ms(1500)),
            (".5s", ms(500)),
            ("5.s", Duration::from_secs(5)),
            ("1h1m1s1ms1us1ns", Duration::from_nanos(3_661_001_001_001)),
            ("2\u{b5}s", Duration::from_micros(2)),
            ("2\u{3bc}s", Duration::from_micros(2)),
            ("+7ns", Duration::from_nanos(7)),
            ("1.0000000001s", Duration::from_secs(1)),
            (
                "0.1234567891234567891234h",
                Duration::from_nanos(444_444_440_844),
            ),
            (
                "2562047h47m16.854775807s",
                Duration::from_nanos(i64::MAX as u64),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_text() {
        for text in [
            "",
            "-1s",
            "10",
            "1x",
            "s",
            ".s",
            "1h-5m",
            "1.5.5s",
            "+",
            "2562047h47m16.854775808s",
            "99999999999999999999999999999999999999999h",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} should fail");
        }
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
        assert!(parse_duration("10").unwrap_err().contains("missing unit"));
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_100), "1.1\u{b5}s"),
            (Duration::from_micros(2_200), "2.2ms"),
            (ms(500), "500ms"),
            (ms(1500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(600), "10m0s"),
            (Duration::from_secs(5400), "1h30m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_nanos(3_661_000_000_001), "1h1m1.000000001s"),
        ];
        for (duration, want) in cases {
            assert_eq!(format_duration(duration), want);
        }
    }

    #[test]
    fn text_round_trips() {
        for nanos in [
            0,
            1,
            999,
            1_000,
            1_500_000,
            30_000_000_000,
            5_400_000_000_123,
            i64::MAX as u64,
        ] {
            let duration = Duration::from_nanos(nanos);
            assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
        }
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Body {
        #[serde(with = "duration_string")]
        text: Duration,
        #[serde(with = "duration_nanos")]
        nanos: Duration,
        #[serde(default, with = "duration_string::option")]
        maybe: Option<Duration>,
    }

    #[test]
    fn serde_helpers_round_trip() {
        let body = Body {
            text: Duration::from_secs(5400),
            nanos: Duration::from_secs(30),
            maybe: Some(ms(250)),
        };
        let json = serde_json::to_string(&body).unwrap();
        assert_eq!(
            json,
            r#"{"text":"1h30m0s","nanos":30000000000,"maybe":"250ms"}"#
        );
        assert_eq!(serde_json::from_str::<Body>(&json).unwrap(), body);
        let absent: Body = serde_json::from_str(r#"{"text":"1s","nanos":0}"#).unwrap();
        assert_eq!(absent.maybe, None);
    }

    #[test]
    fn serde_helpers_reject_bad_values() {
        assert!(serde_json::from_str::<Body>(r#"{"text":"1","nanos":0}"#).is_err());
        // A negative Go duration is zero here, as P2 reads a negative RollDelay.
        let negative: Body = serde_json::from_str(r#"{"text":"1s","nanos":-5}"#).unwrap();
        assert_eq!(negative.nanos, Duration::ZERO);
        assert!(serde_json::from_str::<Body>(r#"{"text":"1s","nanos":0,"maybe":"x"}"#).is_err());
    }

    #[test]
    fn nanos_saturate_at_go_limit() {
        let body = Body {
            text: Duration::ZERO,
            nanos: Duration::MAX,
            maybe: None,
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["nanos"], i64::MAX);
    }
}

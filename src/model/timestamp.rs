//! RFC 3339 timestamps as Go's `time.Time` writes them in JSON, for health and audit records,
//! and their reading, for the times clients send.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats `time` in UTC the way Go marshals a `time.Time` (RFC 3339 with as many fraction
/// digits as needed, none for whole seconds), so P2's readers parse what we write.
pub fn format_rfc3339(time: SystemTime) -> String {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (after.as_secs() as i64, after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            let seconds = -(before.as_secs() as i64);
            match before.subsec_nanos() {
                0 => (seconds, 0),
                nanos => (seconds - 1, 1_000_000_000 - nanos),
            }
        }
    };
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Reads an RFC 3339 time such as `2020-01-14T11:06:40.12Z` or `2020-01-14T12:06:40+01:00`,
/// any that RFC 3339 allows (before the epoch too, and with a fraction of any length, read
/// to the nanosecond), as OpenAPI's `date-time` promises clients; `None` for anything else.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if bytes.len() < 20
        || !matches!(bytes[10], b'T' | b't' | b' ')
        || separators.iter().any(|&(i, c)| bytes[i] != c)
    {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        nanos = format!("{:0<9}", &fraction[..len.min(9)]).parse().ok()?;
        rest = &fraction[len..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = rest.get(1..)?;
            let (h, m) = zone.split_once(':')?;
            if h.len() != 2
                || m.len() != 2
                || !(h.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit())
            {
                return None;
            }
            let (h, m) = (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?);
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month as u32, day as u32);
    if civil_from_days(days) != (year, month as u32, day as u32) {
        return None;
    }
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let whole = std::time::Duration::from_secs(seconds.unsigned_abs());
    let at_second = if seconds < 0 {
        UNIX_EPOCH.checked_sub(whole)?
    } else {
        UNIX_EPOCH.checked_add(whole)?
    };
    at_second.checked_add(std::time::Duration::from_nanos(nanos.into()))
}

/// Day count since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let shifted_month = i64::from((month + 9) % 12);
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(seconds, nanos)
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(at(1_579_000_000, 0)), "2020-01-14T11:06:40Z");
        assert_eq!(
            format_rfc3339(at(1_579_000_000, 120_000_000)),
            "2020-01-14T11:06:40.12Z"
        );
        assert_eq!(
            format_rfc3339(at(951_782_400, 1)),
            "2000-02-29T00:00:00.000000001Z"
        );
        assert_eq!(format_rfc3339(at(4_102_444_799, 0)), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn parses_what_it_formats_and_offsets() {
        for time in [
            UNIX_EPOCH,
            at(1_579_000_000, 120_000_000),
            at(951_782_400, 1),
        ] {
            assert_eq!(parse_rfc3339(&format_rfc3339(time)), Some(time));
        }
        assert_eq!(
            parse_rfc3339("2020-01-14T12:06:40+01:00"),
            Some(at(1_579_000_000, 0))
        );
        for bad in [
            "",
            "2020-01-14",
            "2020-02-30T00:00:00Z",
            "2020-01-14T11:06:40",
            "2020-01-14T11:06:40.Z",
            "x020-01-14T11:06:40Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    /// Any time RFC 3339 allows is read: before the epoch (Go's zero time among them), and
    /// with more fraction digits than nanoseconds hold; before, both were refused, so
    /// `GET /api/v1/events?since=` refused values its `date-time` parameter promises.
    #[test]
    fn reads_times_before_the_epoch_and_long_fractions() {
        let before = |seconds: u64| UNIX_EPOCH - Duration::from_secs(seconds);
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Some(before(1)));
        assert_eq!(
            parse_rfc3339("1969-12-31T23:59:59.5Z"),
            Some(before(1) + Duration::from_millis(500))
        );
        assert_eq!(
            parse_rfc3339("0001-01-01T00:00:00Z"),
            Some(before(62_135_596_800))
        );
        assert_eq!(
            parse_rfc3339("2020-01-14T11:06:40.1200000009999Z"),
            Some(at(1_579_000_000, 120_000_000))
        );
    }

    /// An offset is hours 00 to 23 and minutes 00 to 59 (RFC 3339's time-numoffset); before,
    /// any two digits were taken, so `-99:99` moved the time by more than four days.
    #[test]
    fn an_offset_out_of_range_is_refused() {
        for bad in [
            "2020-01-14T11:06:40+24:00",
            "2020-01-14T11:06:40-99:99",
            "2020-01-14T11:06:40+01:60",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(
            parse_rfc3339("2020-01-15T11:05:40+23:59"),
            Some(at(1_579_000_000, 0))
        );
    }

    #[test]
    fn formats_instants_before_the_epoch() {
        let before = UNIX_EPOCH - Duration::new(1, 500_000_000);
        assert_eq!(format_rfc3339(before), "1969-12-31T23:59:58.5Z");
    }
}

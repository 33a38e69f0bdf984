//! RFC 3339 timestamps as Go's `time.Time` writes them in JSON, for health and audit records.

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
    fn formats_instants_before_the_epoch() {
        let before = UNIX_EPOCH - Duration::new(1, 500_000_000);
        assert_eq!(format_rfc3339(before), "1969-12-31T23:59:58.5Z");
    }
}

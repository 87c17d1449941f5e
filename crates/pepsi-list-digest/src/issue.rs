//! A digest's volume and number, counted as Mailman counts them under its default volume
//! frequency (monthly): the first digest of a list is volume 1, number 1; each next one
//! takes the next number, until a digest opens in a later calendar month (UTC) than the
//! last one was sent, which starts the next volume at number 1. Pure.

use chrono::{DateTime, Datelike, Utc};

/// The last digest a list sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Last {
    pub volume: i32,
    pub number: i32,
    pub sent_at: DateTime<Utc>,
}

/// The volume and number of a digest opened at `now`, after `last` (none: the list's first).
pub fn next(last: Option<Last>, now: DateTime<Utc>) -> (i32, i32) {
    let Some(last) = last else {
        return (1, 1);
    };
    let month = |t: DateTime<Utc>| i64::from(t.year()) * 12 + i64::from(t.month0());
    if month(now) > month(last.sent_at) {
        (last.volume.saturating_add(1), 1)
    } else {
        (last.volume, last.number.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn volumes_and_numbers_table() {
        let last = |volume, number, sent| Last {
            volume,
            number,
            sent_at: at(sent),
        };
        let cases: &[(Option<Last>, &str, (i32, i32))] = &[
            (None, "2026-12-06T02:00:00Z", (1, 1)),
            (
                Some(last(1, 1, "2026-12-01T00:00:00Z")),
                "2026-12-31T23:59:59Z",
                (1, 2),
            ),
            (
                Some(last(1, 7, "2026-12-31T23:59:59Z")),
                "2027-01-01T00:00:00Z",
                (2, 1),
            ),
            (
                Some(last(3, 4, "2026-11-30T10:00:00Z")),
                "2026-12-01T00:00:01Z",
                (4, 1),
            ),
            // A year later in the same month is a later month too.
            (
                Some(last(3, 4, "2025-12-15T10:00:00Z")),
                "2026-12-15T10:00:00Z",
                (4, 1),
            ),
            // A clock that went back never goes back a volume.
            (
                Some(last(5, 2, "2026-12-10T00:00:00Z")),
                "2026-11-30T00:00:00Z",
                (5, 3),
            ),
        ];
        for (last, now, want) in cases {
            assert_eq!(next(*last, at(now)), *want, "{last:?} {now}");
        }
    }
}

//! Pure parsers that turn an expanded option value into a typed one.
//!
//! Each returns, on failure, the description of what was expected ("a whole number"), which
//! the caller wraps with file, line, section, option and value. No I/O and no expansion here.

use std::any::type_name;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub(super) const BOOL_EXPECTED: &str = "yes or no (also true/false, on/off, 1/0)";
pub(super) const DURATION_EXPECTED: &str =
    "a duration such as 250ms, 30s, 5m, 2h, 1d or 1h30m (a bare number is seconds)";
pub(super) const SIZE_EXPECTED: &str =
    "a size such as 4096, 64k, 10M or 2GiB (k, M, G and T are multiples of 1024)";

pub(super) fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Ok(true),
        "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(BOOL_EXPECTED.to_owned()),
    }
}

pub(super) fn parse_number<T: FromStr>(text: &str) -> Result<T, String> {
    let text = text.trim();
    text.parse::<T>().map_err(|_| number_expectation::<T>(text))
}

/// Says what `T` accepts, tailored to why `text` failed: a whole number that is merely out of
/// range gets the range, anything else is told it needs a number at all.
fn number_expectation<T>(text: &str) -> String {
    let ty = type_name::<T>();
    macro_rules! range {
        ($($t:ident),*) => {
            match ty {
                $(stringify!($t) => Some(($t::MIN.to_string(), $t::MAX.to_string())),)*
                _ => None,
            }
        };
    }
    if let Some((min, max)) = range!(
        u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
    ) {
        let is_whole = text
            .strip_prefix(['-', '+'])
            .unwrap_or(text)
            .bytes()
            .all(|b| b.is_ascii_digit())
            && !text.is_empty();
        if is_whole {
            format!("a whole number from {min} to {max}")
        } else {
            "a whole number".to_owned()
        }
    } else if ty == "f32" || ty == "f64" {
        "a number".to_owned()
    } else if ty.contains("NonZero") {
        "a whole number greater than zero".to_owned()
    } else {
        format!("a value of type {ty}")
    }
}

pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let fail = || DURATION_EXPECTED.to_owned();
    if text.is_empty() {
        return Err(fail());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| fail());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_end == 0 {
            return Err(fail());
        }
        let amount: u64 = rest[..digits_end].parse().map_err(|_| fail())?;
        rest = rest[digits_end..].trim_start();
        let unit_end = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match rest[..unit_end].to_ascii_lowercase().as_str() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(fail()),
        };
        let part = amount.checked_mul(unit_ms).ok_or_else(fail)?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(fail)?;
        rest = rest[unit_end..].trim_start();
    }
    Ok(total)
}

/// A size as the configuration writes it (`10M`, `1GiB`, `512k`, `4096`): binary multiples.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let fail = || SIZE_EXPECTED.to_owned();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits_end == 0 {
        return Err(fail());
    }
    let amount: u64 = text[..digits_end].parse().map_err(|_| fail())?;
    let multiplier: u64 = match text[digits_end..]
        .trim_start()
        .to_ascii_lowercase()
        .as_str()
    {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(fail()),
    };
    amount.checked_mul(multiplier).ok_or_else(fail)
}

pub(super) fn parse_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        Err("a path".to_owned())
    } else {
        Ok(PathBuf::from(text))
    }
}

pub(super) fn parse_list(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

pub(super) fn parse_choice(text: &str, allowed: &[&str]) -> Result<String, String> {
    let text = text.trim();
    allowed
        .iter()
        .find(|candidate| candidate.eq_ignore_ascii_case(text))
        .map(|candidate| (*candidate).to_owned())
        .ok_or_else(|| match allowed {
            [] => "no value at all (this option has no allowed values)".to_owned(),
            [only] => (*only).to_owned(),
            _ => format!("one of {}", allowed.join(", ")),
        })
}

/// The longest public origin `https_origin` accepts.
pub const MAX_ORIGIN: usize = 200;

/// `[pepsi] <name>` as stored text, a public https origin of pepsi-httpd's pages (`purpose`
/// says which, for the error): `None` when unset or empty, an error naming the value when it
/// is not an `https://` URL without a path, query or trailing slash.
pub fn https_origin(
    name: &str,
    purpose: &str,
    value: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Err(format!(
            "[pepsi] {name} = {v}: {why} ({purpose}, as https://mail.example.org)"
        ))
    };
    let Some(rest) = v.strip_prefix("https://") else {
        return bad("it must start with https://");
    };
    if v.len() > MAX_ORIGIN {
        return bad("it is longer than 200 characters");
    }
    if rest.is_empty() || rest.ends_with('/') || rest.contains('/') {
        return bad("a host (and port) is needed, without a path or a trailing slash");
    }
    if rest.chars().any(|c| {
        c.is_whitespace() || c.is_control() || matches!(c, '?' | '#' | '"' | '<' | '>' | '@')
    }) {
        return bad("no spaces, credentials, query or fragment");
    }
    Ok(Some(v.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders a parse result as `ok <debug>` or `err <expected>` so a table can hold both.
    fn render<T: std::fmt::Debug>(result: Result<T, String>) -> String {
        match result {
            Ok(value) => format!("ok {value:?}"),
            Err(expected) => format!("err {expected}"),
        }
    }

    fn check<T: std::fmt::Debug>(
        parse: impl Fn(&str) -> Result<T, String>,
        cases: &[(&str, &str)],
    ) {
        for (input, expected) in cases {
            assert_eq!(render(parse(input)), *expected, "input {input:?}");
        }
    }

    #[test]
    fn bools() {
        let no = format!("err {BOOL_EXPECTED}");
        check(
            parse_bool,
            &[
                ("yes", "ok true"),
                ("YES", "ok true"),
                ("True", "ok true"),
                ("on", "ok true"),
                ("1", "ok true"),
                ("no", "ok false"),
                ("FALSE", "ok false"),
                ("Off", "ok false"),
                ("0", "ok false"),
                (" yes ", "ok true"),
                ("y", &no),
                ("2", &no),
                ("", &no),
                ("enabled", &no),
            ],
        );
    }

    #[test]
    fn numbers() {
        check(
            parse_number::<u32>,
            &[
                ("0", "ok 0"),
                ("42", "ok 42"),
                (" 7 ", "ok 7"),
                ("many", "err a whole number"),
                ("4.5", "err a whole number"),
                ("", "err a whole number"),
                ("-1", "err a whole number from 0 to 4294967295"),
                ("4294967296", "err a whole number from 0 to 4294967295"),
            ],
        );
        check(
            parse_number::<i8>,
            &[
                ("-128", "ok -128"),
                ("200", "err a whole number from -128 to 127"),
            ],
        );
        check(
            parse_number::<f64>,
            &[
                ("0.25", "ok 0.25"),
                ("1e3", "ok 1000.0"),
                ("half", "err a number"),
            ],
        );
        check(
            parse_number::<std::num::NonZeroU16>,
            &[("3", "ok 3"), ("0", "err a whole number greater than zero")],
        );
        let other = format!("err a value of type {}", type_name::<std::net::IpAddr>());
        check(
            parse_number::<std::net::IpAddr>,
            &[("127.0.0.1", "ok 127.0.0.1"), ("localhost", &other)],
        );
    }

    #[test]
    fn durations() {
        let no = format!("err {DURATION_EXPECTED}");
        check(
            parse_duration,
            &[
                ("250ms", "ok 250ms"),
                ("30s", "ok 30s"),
                ("5m", "ok 300s"),
                ("2h", "ok 7200s"),
                ("1d", "ok 86400s"),
                ("1h30m", "ok 5400s"),
                ("1h 30m", "ok 5400s"),
                ("5 m", "ok 300s"),
                ("1m30s500ms", "ok 90.5s"),
                ("45", "ok 45s"),
                (" 45 ", "ok 45s"),
                ("0", "ok 0ns"),
                ("2H", "ok 7200s"),
                ("", &no),
                ("m", &no),
                ("5x", &no),
                ("5 minutes", &no),
                ("1h 30", &no),
                ("-5s", &no),
                ("1.5h", &no),
                ("99999999999999999999d", &no),
                ("18446744073709551615d", &no),
            ],
        );
    }

    #[test]
    fn sizes() {
        let no = format!("err {SIZE_EXPECTED}");
        check(
            parse_size,
            &[
                ("4096", "ok 4096"),
                ("0", "ok 0"),
                ("12b", "ok 12"),
                ("64k", "ok 65536"),
                ("64K", "ok 65536"),
                ("64kb", "ok 65536"),
                ("64KiB", "ok 65536"),
                ("10M", "ok 10485760"),
                ("10 MiB", "ok 10485760"),
                ("2G", "ok 2147483648"),
                ("2GiB", "ok 2147483648"),
                ("1T", "ok 1099511627776"),
                ("", &no),
                ("k", &no),
                ("1.5M", &no),
                ("10 M B", &no),
                ("5 bytes", &no),
                ("-1", &no),
                ("16777216T", &no),
            ],
        );
    }

    #[test]
    fn lists() {
        let cases: &[(&str, &[&str])] = &[
            ("a,b,c", &["a", "b", "c"]),
            ("a b  c", &["a", "b", "c"]),
            ("a, b,\tc", &["a", "b", "c"]),
            (",a,,b,", &["a", "b"]),
            ("", &[]),
            (" , ", &[]),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_list(input), *expected, "input {input:?}");
        }
    }

    #[test]
    fn choices() {
        let modes = ["strict", "Relaxed", "off"];
        check(
            |text| parse_choice(text, &modes),
            &[
                ("strict", "ok \"strict\""),
                ("STRICT", "ok \"strict\""),
                ("relaxed", "ok \"Relaxed\""),
                (" off ", "ok \"off\""),
                ("on", "err one of strict, Relaxed, off"),
                ("", "err one of strict, Relaxed, off"),
            ],
        );
        check(
            |text| parse_choice(text, &["only"]),
            &[("other", "err only")],
        );
    }

    #[test]
    fn paths() {
        check(
            parse_path,
            &[
                ("/var/lib/pepsi", "ok \"/var/lib/pepsi\""),
                ("rel/dir", "ok \"rel/dir\""),
                ("", "err a path"),
            ],
        );
    }
}

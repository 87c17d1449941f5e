//! Text for people, shared by the operator tools and the message writers: aligned tables,
//! durations in the two largest units, cells clipped to a width, values on one line.
//! Pure functions, no I/O.

/// `secs` as the two largest units: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn human_duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// `text` cut to `max` characters, with `…` when it was longer; newlines become spaces.
pub fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut s: String = flat.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// `value` on one line, fit for a header field: control characters (CR, LF, TAB, ...) and
/// runs of white space become one space, none at either end, so no value can start a field
/// of its own.
pub fn one_line(value: &str) -> String {
    value
        .split(|c: char| c.is_control() || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Left-aligned columns separated by two spaces; numeric columns (`right[i]`) right-aligned.
pub fn table(headers: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right.get(i).copied().unwrap_or(false) {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, &mut headers.iter().copied());
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_table() {
        let cases = [
            ("plain", "plain"),
            ("  two  words ", "two words"),
            ("a\r\nBcc: x@example.org", "a Bcc: x@example.org"),
            ("tab\tand\u{2003}em space", "tab and em space"),
            ("\r\n\t", ""),
            ("über straße", "über straße"),
        ];
        for (value, want) in cases {
            assert_eq!(one_line(value), want, "{value:?}");
        }
    }

    #[test]
    fn durations_read_as_the_two_largest_units() {
        let cases = [
            (-3.0, "0s"),
            (0.4, "0s"),
            (45.9, "45s"),
            (60.0, "1m00s"),
            (192.0, "3m12s"),
            (3599.0, "59m59s"),
            (3600.0, "1h00m"),
            (7500.0, "2h05m"),
            (86400.0, "1d00h"),
            (273600.0, "3d04h"),
            (f64::NAN, "0s"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn clip_cuts_long_text_and_flattens_newlines() {
        let cases = [
            ("short", 10, "short"),
            ("exactly10!", 10, "exactly10!"),
            ("eleven char", 10, "eleven ch…"),
            ("a\nb\tc", 10, "a b c"),
            ("ünïcödé", 4, "ünï…"),
        ];
        for (text, max, want) in cases {
            assert_eq!(clip(text, max), want, "{text:?}");
        }
    }

    #[test]
    fn table_pads_columns_and_right_aligns_numbers() {
        let out = table(
            &["ID", "NAME"],
            &[true, false],
            &[
                vec!["7".into(), "seven".into()],
                vec!["1000".into(), "x".into()],
            ],
        );
        assert_eq!(out, "  ID  NAME\n   7  seven\n1000  x\n");
    }
}

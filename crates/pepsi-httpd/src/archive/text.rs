//! The pure text work of the archive's pages: addresses hidden from readers who are not
//! logged-in members, HTML of posts sanitised (ammonia), file names of downloads made safe,
//! XML escaped for the feeds, and the paths' month and url id read. No I/O.

use std::sync::LazyLock;

use chrono::NaiveDate;

/// How many characters of an address's domain a hidden address keeps.
const DOMAIN_SHOWN: usize = 2;

fn local_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._%+-=!#$&'*/?^`{|}~".contains(c)
}

fn domain_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '-'
}

/// `address` as a reader who is not a member sees it: the local part, `@`, the first two
/// characters of the domain and an ellipsis (`alice@ex…`). Anything without a domain is
/// returned as it is.
pub fn hide_address(address: &str) -> String {
    match pepsi_conf::address::parts(address) {
        Some((local, domain)) if !domain.is_empty() => {
            let shown: String = domain.chars().take(DOMAIN_SHOWN).collect();
            format!("{local}@{shown}…")
        }
        _ => address.to_owned(),
    }
}

/// `text` with every address in it (`local@domain.tld`) hidden as [`hide_address`] does.
/// What it writes holds no character that was not there or `…`, so hiding the addresses
/// of sanitised HTML leaves it sanitised.
pub fn hide_addresses(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut done = 0; // chars[..done] are written
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '@' {
            i += 1;
            continue;
        }
        let mut start = i;
        while start > done && local_char(chars[start - 1]) {
            start -= 1;
        }
        let mut end = i + 1;
        while end < chars.len() && domain_char(chars[end]) {
            end += 1;
        }
        // A domain ends with a label, not with the sentence's full stop.
        while end > i + 1 && matches!(chars[end - 1], '.' | '-') {
            end -= 1;
        }
        let domain: String = chars[i + 1..end].iter().collect();
        if start == i || !domain.contains('.') {
            i += 1;
            continue;
        }
        out.extend(&chars[done..start]);
        let local: String = chars[start..i].iter().collect();
        out.push_str(&hide_address(&format!("{local}@{domain}")));
        done = end;
        i = end;
    }
    out.extend(&chars[done..]);
    out
}

static SANITISER: LazyLock<ammonia::Builder<'static>> = LazyLock::new(|| {
    let mut b = ammonia::Builder::default();
    // No remote images (a web bug tells the sender who read it), and none inline either:
    // the pages' CSP would not load them.
    b.rm_tags(["img"])
        .url_schemes(["http", "https", "mailto"].into())
        .link_rel(Some("nofollow noopener noreferrer"));
    b
});

/// The HTML of a post as a page may show it: ammonia's allow-list (no script, no style,
/// no event attribute, no form, no frame), without images, links `rel="nofollow
/// noopener noreferrer"`.
pub fn sanitise(html: &str) -> String {
    SANITISER.clean(html).to_string()
}

/// A file name a download may carry: ASCII letters, digits, `.`, `-` and `_`, others as
/// `_`, no leading dot, at most 100 characters; `part-<n>` when nothing is left.
pub fn file_name(name: Option<&str>, n: usize) -> String {
    let safe: String = name
        .unwrap_or_default()
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .skip_while(|c| *c == '.')
        .take(100)
        .collect();
    if safe.trim_matches(['_', '.']).is_empty() {
        format!("part-{n}")
    } else {
        safe
    }
}

/// `text` escaped for XML 1.0 character data and attribute values; characters XML 1.0
/// does not allow (controls but tab, line feed and carriage return) are left out.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}') => {}
            c => out.push(c),
        }
    }
    out
}

/// The first day of the month a path names (`YYYY-MM`).
pub fn month(text: &str) -> Option<NaiveDate> {
    let (y, m) = text.split_once('-')?;
    if y.len() != 4 || m.len() != 2 || !(y.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)
}

/// A url id as the archive makes them (32 lower-case hex digits); anything else is no post,
/// and the database is not asked.
pub fn url_id(text: &str) -> Option<&str> {
    (text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_hidden() {
        let cases = [
            ("alice@example.org", "alice@ex…"),
            ("a@b", "a@b…"),
            ("no address", "no address"),
            ("@example.org", "@ex…"),
        ];
        for (input, expected) in cases {
            assert_eq!(hide_address(input), expected, "{input}");
        }
    }

    #[test]
    fn addresses_in_text_are_hidden() {
        let cases = [
            ("write to alice@example.org.", "write to alice@ex…."),
            (
                "<bob.smith+x@mail.example.com> wrote:",
                "<bob.smith+x@ma…> wrote:",
            ),
            ("a@b.c and c@d.e", "a@b.… and c@d.…"),
            ("user@localhost stays", "user@localhost stays"),
            ("@twitter handle", "@twitter handle"),
            ("café é@exämple.org", "café é@exämple.org"),
            (
                "href=\"mailto:carol@example.net\"",
                "href=\"mailto:carol@ex…\"",
            ),
            ("", ""),
        ];
        for (input, expected) in cases {
            assert_eq!(hide_addresses(input), expected, "{input}");
        }
    }

    #[test]
    fn html_is_sanitised() {
        let cases = [
            ("<p>hi<script>alert(1)</script></p>", "<p>hi</p>"),
            (
                "<a href=\"https://x.test/\" onclick=\"f()\">x</a>",
                "<a href=\"https://x.test/\" rel=\"nofollow noopener noreferrer\">x</a>",
            ),
            ("<img src=\"https://tracker.test/p.gif\">seen", "seen"),
            (
                "<a href=\"javascript:alert(1)\">x</a>",
                "<a rel=\"nofollow noopener noreferrer\">x</a>",
            ),
            ("<style>body{}</style><b>b</b>", "<b>b</b>"),
            ("<iframe src=\"https://x.test\"></iframe>ok", "ok"),
        ];
        for (input, expected) in cases {
            assert_eq!(sanitise(input), expected, "{input}");
        }
    }

    #[test]
    fn download_names_are_safe() {
        let cases = [
            (Some("report.pdf"), 2, "report.pdf"),
            (Some("../../etc/passwd"), 2, "passwd"),
            (Some("C:\\x\\a b;c\".txt"), 3, "a_b_c_.txt"),
            (Some(".hidden"), 1, "hidden"),
            (Some("\u{e9}t\u{e9}.txt"), 1, "_t_.txt"),
            (Some("..."), 4, "part-4"),
            (None, 5, "part-5"),
        ];
        for (name, n, expected) in cases {
            assert_eq!(file_name(name, n), expected, "{name:?}");
        }
    }

    #[test]
    fn xml_is_escaped() {
        let cases = [
            ("a<b>&\"c'", "a&lt;b&gt;&amp;&quot;c&apos;"),
            ("bell\u{7}\u{0}end\n", "bellend\n"),
            ("ünï", "ünï"),
        ];
        for (input, expected) in cases {
            assert_eq!(xml_escape(input), expected, "{input:?}");
        }
    }

    #[test]
    fn months_and_url_ids_are_read() {
        let months = [
            ("2026-03", NaiveDate::from_ymd_opt(2026, 3, 1)),
            ("2026-13", None),
            ("2026-3", None),
            ("26-03", None),
            ("2026-0a", None),
            ("+026-03", None),
        ];
        for (input, expected) in months {
            assert_eq!(month(input), expected, "{input}");
        }
        let ids = [
            ("0123456789abcdef0123456789abcdef", true),
            ("0123456789ABCDEF0123456789abcdef", false),
            ("0123", false),
        ];
        for (input, ok) in ids {
            assert_eq!(url_id(input).is_some(), ok, "{input}");
        }
    }
}

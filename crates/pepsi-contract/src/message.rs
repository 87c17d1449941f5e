//! The stored message's shape (headers || CRLF || body, `pepsi_smtp::message`) and what
//! the stages read from its header block.

pub use pepsi_smtp::message::{join, split};

/// The addresses of every From field of a header block (a From may list several authors;
/// groups are entered). An unparsable or absent From gives none.
pub fn from_addresses(headers: &[u8]) -> Vec<String> {
    addresses_of(headers, &[mail_parser::HeaderName::From])
}

/// The addresses of every To, Cc and Bcc field of a header block, in field order (groups
/// are entered): the recipients `sendmail -t` reads. Names and comments are dropped; an
/// unparsable field gives none.
pub fn recipient_addresses(headers: &[u8]) -> Vec<String> {
    use mail_parser::HeaderName;
    addresses_of(headers, &[HeaderName::To, HeaderName::Cc, HeaderName::Bcc])
}

/// The addresses of every To, Cc, Resent-To and Resent-Cc field: the recipients a message
/// shows (an automatic reply answers only those, `autoreply`).
pub fn visible_recipient_addresses(headers: &[u8]) -> Vec<String> {
    use mail_parser::HeaderName;
    addresses_of(
        headers,
        &[
            HeaderName::To,
            HeaderName::Cc,
            HeaderName::ResentTo,
            HeaderName::ResentCc,
        ],
    )
}

fn addresses_of(headers: &[u8], names: &[mail_parser::HeaderName<'static>]) -> Vec<String> {
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let Some(message) = mail_parser::MessageParser::default().parse_headers(&block) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for header in message.headers() {
        if !names.contains(&header.name) {
            continue;
        }
        if let Some(address) = header.value.as_address() {
            out.extend(
                address
                    .iter()
                    .filter_map(|a| a.address())
                    .map(str::to_owned),
            );
        }
    }
    out
}

/// The values of every field named `name` (any letter case), unfolded (continuation line
/// breaks removed) and trimmed, in field order; bytes that are not UTF-8 are replaced.
pub fn field_values(headers: &[u8], name: &str) -> Vec<String> {
    fields(headers)
        .filter(|f| field_name(f).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())))
        .map(|f| {
            let colon = f.iter().position(|&b| b == b':').expect("a named field");
            let value: Vec<u8> = f[colon + 1..]
                .iter()
                .copied()
                .filter(|&b| b != b'\r' && b != b'\n')
                .collect();
            String::from_utf8_lossy(&value).trim().to_owned()
        })
        .collect()
}

/// The names of the header block's fields, as written, in order.
pub fn field_names(headers: &[u8]) -> Vec<String> {
    fields(headers)
        .filter_map(field_name)
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// Whether the header block has a field named `name` (any letter case).
pub fn has_field(headers: &[u8], name: &str) -> bool {
    fields(headers).any(|f| field_name(f).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())))
}

/// The header block without its fields named `name` (any letter case), continuation lines
/// included; every other byte is kept.
pub fn remove_fields(headers: &[u8], name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len());
    for field in fields(headers) {
        if !field_name(field).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())) {
            out.extend_from_slice(field);
        }
    }
    out
}

/// The whole fields of a CRLF header block, each with its continuation lines and CRLF.
pub fn fields(headers: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = headers;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = 0;
        loop {
            end = match rest[end..].windows(2).position(|w| w == b"\r\n") {
                Some(p) => end + p + 2,
                None => rest.len(),
            };
            if end >= rest.len() || !matches!(rest[end], b' ' | b'\t') {
                break;
            }
        }
        let (field, tail) = rest.split_at(end);
        rest = tail;
        Some(field)
    })
}

/// The name of a field (the bytes before its colon), trimmed of trailing blanks.
pub fn field_name(field: &[u8]) -> Option<&[u8]> {
    let colon = field.iter().position(|&b| b == b':')?;
    let name = &field[..colon];
    let trimmed = name.trim_ascii_end();
    (!trimmed.is_empty() && !trimmed.contains(&b'\r')).then_some(trimmed)
}

#[cfg(test)]
mod field_tests {
    #[test]
    fn recipients_fields_and_removal() {
        let h = b"From: a@x.test\r\nTo: B <b@y.test>, c@z.test\r\nSubject: s\r\n\
                  Cc: team: d@x.test;\r\nBCC: Hidden\r\n <e@x.test>\r\nbcc: f@x.test\r\n";
        assert_eq!(
            super::recipient_addresses(h),
            ["b@y.test", "c@z.test", "d@x.test", "e@x.test", "f@x.test"]
        );
        assert!(super::has_field(h, "subject"));
        assert!(!super::has_field(h, "Date"));
        assert_eq!(
            super::remove_fields(h, "Bcc"),
            b"From: a@x.test\r\nTo: B <b@y.test>, c@z.test\r\nSubject: s\r\nCc: team: d@x.test;\r\n"
        );
        assert_eq!(super::remove_fields(b"", "Bcc"), b"");
        assert_eq!(
            super::field_values(h, "bcc"),
            ["Hidden <e@x.test>", "f@x.test"]
        );
        assert_eq!(super::field_values(h, "Date"), Vec::<String>::new());
        assert_eq!(
            super::field_names(h),
            ["From", "To", "Subject", "Cc", "BCC", "bcc"]
        );
        assert_eq!(
            super::recipient_addresses(b"Subject: none\r\n"),
            Vec::<String>::new()
        );
    }
}

#[cfg(test)]
mod from_tests {
    #[test]
    fn from_addresses_of_every_from_field() {
        let cases: [(&[u8], &[&str]); 5] = [
            (
                b"From: Alice <alice@example.test>\r\nTo: b@x.test\r\n",
                &["alice@example.test"],
            ),
            (
                b"From: a@x.test, \"B\" <b@y.test>\r\n",
                &["a@x.test", "b@y.test"],
            ),
            (
                b"From: a@x.test\r\nFrom: ceo@y.test\r\n",
                &["a@x.test", "ceo@y.test"],
            ),
            (
                b"From: team: a@x.test, b@y.test;\r\n",
                &["a@x.test", "b@y.test"],
            ),
            (b"Subject: none\r\n", &[]),
        ];
        for (headers, want) in cases {
            assert_eq!(
                super::from_addresses(headers),
                want,
                "{}",
                String::from_utf8_lossy(headers)
            );
        }
    }
}

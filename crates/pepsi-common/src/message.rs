//! The stored message's shape (headers || CRLF || body, `pepsi_smtp::message`) and what
//! the stages read from its header block.

pub use pepsi_smtp::message::{join, split};

/// The addresses of every From field of a header block (a From may list several authors;
/// groups are entered). An unparsable or absent From gives none.
pub fn from_addresses(headers: &[u8]) -> Vec<String> {
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let Some(message) = mail_parser::MessageParser::default().parse_headers(&block) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for value in message.header_values(mail_parser::HeaderName::From) {
        if let Some(address) = value.as_address() {
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

//! A challenge's token: 16 random bytes, base64url without padding (22 characters). The
//! challenge mail carries it twice, in the confirmation link (`{base}/secretary/{token}`)
//! and in its own Message-ID (`<secretary.{token}@{host}>`), so that a reply, which names
//! that Message-ID in In-Reply-To or References, confirms as the link does. The tables keep
//! sha256 of it ([`digest`]), never the token. Pure, but for [`Token::new`]'s random bytes.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};

/// Where the confirmation pages start.
pub const PREFIX: &str = "/secretary";
/// The local part's prefix of a challenge's Message-ID.
pub const MESSAGE_ID_PREFIX: &str = "secretary.";
/// The length of a token's text.
pub const TOKEN_LEN: usize = 22;

/// A fresh token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// 16 bytes from the system's random generator.
    pub fn new() -> Result<Token, String> {
        let mut bytes = [0u8; 16];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| "the random generator failed".to_owned())?;
        Ok(Token(URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// A token as text from a link or a Message-ID, when it has a token's form.
    pub fn parse(text: &str) -> Option<Token> {
        is_token(text).then(|| Token(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// sha256 of the token's text: what the tables keep.
    pub fn digest(&self) -> Vec<u8> {
        digest(&self.0)
    }
}

/// sha256 of a token's text.
pub fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Whether `text` has a token's form (22 base64url characters).
pub fn is_token(text: &str) -> bool {
    text.len() == TOKEN_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The confirmation link of `token` under the public origin `base`.
pub fn confirm_url(base: &str, token: &Token) -> String {
    format!("{base}{PREFIX}/{}", token.as_str())
}

/// The challenge's Message-ID (without angle brackets).
pub fn message_id(token: &Token, host: &str) -> String {
    format!("{MESSAGE_ID_PREFIX}{}@{host}", token.as_str())
}

/// The token of a challenge that a message answers: the first message identifier in
/// `In-Reply-To`, then `References`, of the form `<secretary.{token}@…>`.
pub fn answered_token(headers: &[u8]) -> Option<Token> {
    for name in ["In-Reply-To", "References"] {
        for value in pepsi_contract::message::field_values(headers, name) {
            for id in value.split(['<', '>', ' ', '\t', ',']) {
                if let Some(rest) = id.strip_prefix(MESSAGE_ID_PREFIX)
                    // A message identifier (id-left@id-right), not an address.
                    && let Some((token, _host)) = rest.split_once('@')
                    && let Some(t) = Token::parse(token)
                {
                    return Some(t);
                }
            }
        }
    }
    None
}

/// The page's human check: a sum of two numbers from 2 to 9 that only someone reading the
/// page can answer, the same for every view of one token (so no state is kept), different
/// from token to token. A link scanner that follows the link confirms nothing: only a form
/// posted with the right answer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanCheck {
    pub a: u8,
    pub b: u8,
}

impl HumanCheck {
    pub fn for_token(token: &Token) -> HumanCheck {
        let h = Sha256::digest(format!("pepsi-secretary-check:{}", token.as_str()).as_bytes());
        HumanCheck {
            a: 2 + h[0] % 8,
            b: 2 + h[1] % 8,
        }
    }

    /// The question, in words.
    pub fn question(&self) -> String {
        format!("How much is {} plus {}?", self.a, self.b)
    }

    /// Whether `answer` (digits, spaces around allowed) is the sum.
    pub fn accepts(&self, answer: &str) -> bool {
        let answer = answer.trim();
        answer.bytes().all(|b| b.is_ascii_digit())
            && answer.parse::<u32>().ok() == Some(u32::from(self.a) + u32::from(self.b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_one_form() {
        let t = Token::new().unwrap();
        assert!(is_token(t.as_str()), "{}", t.as_str());
        assert_ne!(t, Token::new().unwrap());
        assert_eq!(t.digest().len(), 32);
        for (text, ok) in [
            ("AAAAAAAAAAAAAAAAAAAAAA", true),
            ("-_AzAzAzAzAzAzAzAzAz09", true),
            ("AAAAAAAAAAAAAAAAAAAAA", false),
            ("AAAAAAAAAAAAAAAAAAAAAAA", false),
            ("AAAAAAAAAAAAAAAAAAAAA=", false),
            ("AAAAAAAAAAAAAAAAAAAA/A", false),
        ] {
            assert_eq!(is_token(text), ok, "{text}");
        }
        let t = Token::parse("AAAAAAAAAAAAAAAAAAAAAA").unwrap();
        assert_eq!(
            confirm_url("https://m.example", &t),
            "https://m.example/secretary/AAAAAAAAAAAAAAAAAAAAAA"
        );
        assert_eq!(
            message_id(&t, "mx.example"),
            "secretary.AAAAAAAAAAAAAAAAAAAAAA@mx.example"
        );
    }

    #[test]
    fn a_reply_names_the_challenge_it_answers() {
        let tok = "AbCdEfGhIjKlMnOpQrStUv";
        for (headers, want) in [
            (
                format!("In-Reply-To: <secretary.{tok}@mx.example>\r\n"),
                Some(tok),
            ),
            (
                format!("References: <a@b> <secretary.{tok}@mx.example>\r\nIn-Reply-To: <a@b>\r\n"),
                Some(tok),
            ),
            // Folded, as a long References field is.
            (
                format!("References: <a@b>\r\n\t<secretary.{tok}@mx.example>\r\n"),
                Some(tok),
            ),
            (
                "In-Reply-To: <secretary.short@mx.example>\r\n".to_owned(),
                None,
            ),
            (format!("Subject: <secretary.{tok}@mx.example>\r\n"), None),
            (format!("In-Reply-To: <other.{tok}@mx.example>\r\n"), None),
        ] {
            assert_eq!(
                answered_token(headers.as_bytes()).map(|t| t.as_str().to_owned()),
                want.map(str::to_owned),
                "{headers}"
            );
        }
    }

    #[test]
    fn the_human_check_is_the_tokens_own() {
        let t = Token::parse("AAAAAAAAAAAAAAAAAAAAAA").unwrap();
        let c = HumanCheck::for_token(&t);
        assert_eq!(c, HumanCheck::for_token(&t));
        assert!((2..=9).contains(&c.a) && (2..=9).contains(&c.b));
        let sum = (c.a + c.b).to_string();
        assert!(c.accepts(&sum) && c.accepts(&format!(" {sum} ")));
        let plus = format!("+{sum}");
        for wrong in ["", "x", "-1", "100", &plus, &(c.a + c.b + 1).to_string()] {
            assert!(!c.accepts(wrong), "{wrong}");
        }
        assert!(c.question().contains(&c.a.to_string()));
    }
}

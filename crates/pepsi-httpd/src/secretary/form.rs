//! The pure part of the secretary's pages: where a challenge stands, the answer a form
//! posts, a held message's id in a path, the throttle's keys and windows, a count in words.
//! No I/O; tested as tables.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pepsi_secretary::store::ChallengeView;
use pepsi_secretary::token::Token;

/// The most fields the confirmation form may post.
const MAX_FIELDS: usize = 4;
/// The longest answer read, in bytes: a sum of two digits needs two.
pub const MAX_ANSWER: usize = 16;
/// Wrong answers are counted over this window ...
pub const WRONG_WINDOW: Duration = Duration::from_secs(600);
/// ... per client address: enough for a person's typos on a few challenges, not for a
/// script trying every sum of every link it holds;
pub const WRONG_PER_CLIENT: u32 = 20;
/// ... and per challenge, from wherever they come.
pub const WRONG_PER_TOKEN: u32 = 6;

/// Where a challenge stands, as its page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Waiting for the sender's answer.
    Open,
    /// Confirmed before (by the link, a reply or postage), whether or not it has expired
    /// since: the sender learns that the mail went through.
    Confirmed,
    /// Past its expiry unconfirmed: it confirms nothing any more.
    Expired,
}

/// Where `c` stands at `now`.
pub fn standing(c: &ChallengeView, now: DateTime<Utc>) -> Standing {
    if c.confirmed_at.is_some() {
        Standing::Confirmed
    } else if c.expires_at <= now {
        Standing::Expired
    } else {
        Standing::Open
    }
}

/// The answer the form posts (field `answer`), trimmed; an error says what to do.
pub fn answer(fields: &[(String, String)]) -> Result<&str, String> {
    if fields.len() > MAX_FIELDS {
        return Err(format!("the form has more than {MAX_FIELDS} fields"));
    }
    let a = fields
        .iter()
        .find(|(k, _)| k == "answer")
        .map(|(_, v)| v.trim())
        .unwrap_or_default();
    if a.is_empty() {
        return Err("Type the answer to the question, in digits.".into());
    }
    if a.len() > MAX_ANSWER {
        return Err("That is not the answer: it is a number of two digits at most.".into());
    }
    Ok(a)
}

/// A held message's id as a path names it: a positive whole number, digits only.
pub fn held_id(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok().filter(|n| *n > 0)
}

/// The throttle's key of a challenge: a part of its digest, so that no token stays in the
/// process's memory.
pub fn token_key(token: &Token) -> String {
    let d = token.digest();
    let mut key = String::from("token:");
    for b in &d[..12] {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

/// `n` messages, in words.
pub fn messages(n: i64) -> String {
    match n {
        1 => "1 message".to_owned(),
        n => format!("{n} messages"),
    }
}

/// How a challenge was confirmed, in words (`confirmed_by` of the store).
pub fn confirmed_how(by: Option<&str>) -> &'static str {
    match by {
        Some("link") => "on this page",
        Some("reply") => "by a reply to our message",
        Some("postage") => "by paying the postage",
        _ => "before",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn view(expires_in: i64, confirmed: bool) -> ChallengeView {
        let now = Utc::now();
        ChallengeView {
            mailbox: "boss@example.test".into(),
            sender: "someone@example.net".into(),
            expires_at: now + TimeDelta::seconds(expires_in),
            confirmed_at: confirmed.then_some(now),
            confirmed_by: confirmed.then(|| "link".to_owned()),
            amount: None,
            pay_uri: None,
            waiting: 2,
        }
    }

    #[test]
    fn a_challenge_stands_open_confirmed_or_expired() {
        let now = Utc::now();
        for (expires_in, confirmed, want) in [
            (3600, false, Standing::Open),
            (3600, true, Standing::Confirmed),
            (-1, true, Standing::Confirmed),
            (-1, false, Standing::Expired),
            (-3600, false, Standing::Expired),
        ] {
            assert_eq!(
                standing(&view(expires_in, confirmed), now),
                want,
                "{expires_in} {confirmed}"
            );
        }
    }

    #[test]
    fn the_answer_is_read_and_bounded() {
        let f = |v: &str| vec![("answer".to_owned(), v.to_owned())];
        assert_eq!(answer(&f(" 12 ")), Ok("12"));
        assert_eq!(answer(&f("twelve")), Ok("twelve"));
        for (fields, says) in [
            (f(""), "Type the answer"),
            (f("   "), "Type the answer"),
            (
                vec![("other".to_owned(), "12".to_owned())],
                "Type the answer",
            ),
            (f(&"1".repeat(MAX_ANSWER + 1)), "two digits at most"),
            (
                (0..5).map(|i| (format!("f{i}"), "1".to_owned())).collect(),
                "more than 4 fields",
            ),
        ] {
            let e = answer(&fields).unwrap_err();
            assert!(e.contains(says), "{fields:?}: {e}");
        }
    }

    #[test]
    fn held_ids_are_positive_digits() {
        for (text, want) in [
            ("1", Some(1)),
            ("4711", Some(4711)),
            ("0", None),
            ("-3", None),
            ("+3", None),
            ("3x", None),
            ("", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(held_id(text), want, "{text}");
        }
    }

    #[test]
    fn throttle_keys_and_words() {
        let t = Token::parse("AAAAAAAAAAAAAAAAAAAAAA").unwrap();
        let k = token_key(&t);
        assert_eq!(k.len(), "token:".len() + 24);
        assert!(!k.contains(t.as_str()));
        assert_ne!(
            k,
            token_key(&Token::parse("AAAAAAAAAAAAAAAAAAAAAB").unwrap())
        );
        assert_eq!(messages(1), "1 message");
        assert_eq!(messages(0), "0 messages");
        assert_eq!(messages(3), "3 messages");
        assert_eq!(confirmed_how(Some("reply")), "by a reply to our message");
        assert_eq!(confirmed_how(None), "before");
    }
}

//! The signature verdict recorded for a decrypted message: the library's status, judged
//! against the From address (a good signature by someone other than the author vouches
//! for nothing about the author). Pure.

use pepsi_crypto::{Scheme, SigStatus, Verification};

/// What is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `none`, `good`, `unverified`, `bad`, or `mismatch` (a good signature by a key that
    /// does not name the From address).
    pub word: &'static str,
    /// Who signed and why the word was chosen, for people.
    pub detail: Option<String>,
}

/// Judges a verification against the message's From address.
pub fn of(v: &Verification, from: Option<&str>) -> Verdict {
    let signer = v.signer.clone().unwrap_or_default();
    match &v.status {
        SigStatus::Unsigned => Verdict {
            word: "none",
            detail: None,
        },
        SigStatus::Good => {
            let names_author =
                from.is_some_and(|f| v.signer_addresses.iter().any(|a| a.eq_ignore_ascii_case(f)));
            if names_author {
                Verdict {
                    word: "good",
                    detail: Some(format!("signed by {signer} <{}>", from.unwrap_or(""))),
                }
            } else {
                Verdict {
                    word: "mismatch",
                    detail: Some(format!(
                        "a valid signature by {signer} ({}), which does not name the From address {}",
                        v.signer_addresses.join(", "),
                        from.unwrap_or("(none)")
                    )),
                }
            }
        }
        SigStatus::Unverified(why) => Verdict {
            word: "unverified",
            detail: Some(why.clone()),
        },
        SigStatus::Bad(why) => Verdict {
            word: "bad",
            detail: Some(why.clone()),
        },
    }
}

/// The result header's value: `openpgp; key=<fingerprint>; signature=good`, with the
/// signer when there is one. Only characters a header value may hold.
pub fn header_value(scheme: Scheme, key: &str, verdict: &Verdict) -> String {
    let mut out = format!("{}; key={key}; signature={}", scheme.as_str(), verdict.word);
    if let Some(detail) = &verdict.detail {
        // The detail carries what a certificate or key says of itself: only characters that
        // cannot close the comment or start another parameter pass.
        let clean: String = detail
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || " @.,:<>_+-/".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(300)
            .collect();
        out.push_str(&format!(" ({clean})"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(status: SigStatus, addresses: &[&str]) -> Verification {
        Verification {
            status,
            signer: Some("ABCD".into()),
            signer_addresses: addresses.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn verdicts_as_a_table() {
        let cases = [
            (
                v(SigStatus::Good, &["bob@x.test"]),
                Some("Bob@X.test"),
                "good",
            ),
            (
                v(SigStatus::Good, &["mallory@x.test"]),
                Some("bob@x.test"),
                "mismatch",
            ),
            (v(SigStatus::Good, &["bob@x.test"]), None, "mismatch"),
            (v(SigStatus::Unsigned, &[]), Some("bob@x.test"), "none"),
            (
                v(SigStatus::Unverified("no key".into()), &[]),
                Some("bob@x.test"),
                "unverified",
            ),
            (
                v(SigStatus::Bad("altered".into()), &["bob@x.test"]),
                Some("bob@x.test"),
                "bad",
            ),
        ];
        for (verification, from, word) in cases {
            assert_eq!(
                of(&verification, from).word,
                word,
                "{verification:?} {from:?}"
            );
        }
        let value = header_value(
            Scheme::Smime,
            "FF",
            &Verdict {
                word: "bad",
                detail: Some("line\r\nInjected: yes".into()),
            },
        );
        assert_eq!(value, "smime; key=FF; signature=bad (line__Injected: yes)");
        let forged = header_value(
            Scheme::Smime,
            "FF",
            &Verdict {
                word: "mismatch",
                detail: Some("x@y); signature=good; (".into()),
            },
        );
        assert_eq!(
            forged,
            "smime; key=FF; signature=mismatch (x@y__ signature_good_ _)"
        );
    }
}

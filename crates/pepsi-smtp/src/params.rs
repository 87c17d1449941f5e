//! The ESMTP parameters of MAIL and RCPT (SIZE, BODY, SMTPUTF8, RET, ENVID, AUTH, NOTIFY,
//! ORCPT), turned into typed values, and the encodings they use (xtext, base64). Pure.

use serde::Serialize;

use crate::command::Param;
use crate::reply::Reply;

/// `BODY=` of MAIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Body {
    #[serde(rename = "7BIT")]
    SevenBit,
    #[serde(rename = "8BITMIME")]
    EightBitMime,
}

/// `RET=` of MAIL (RFC 3461).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Ret {
    #[serde(rename = "FULL")]
    Full,
    #[serde(rename = "HDRS")]
    Hdrs,
}

/// What MAIL FROM declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailParams {
    pub size: Option<u64>,
    pub body: Option<Body>,
    pub smtputf8: bool,
    pub ret: Option<Ret>,
    /// ENVID, xtext-decoded.
    pub envid: Option<String>,
}

/// What RCPT TO declared (RFC 3461).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RcptParams {
    /// `["NEVER"]` or a subset of SUCCESS, FAILURE, DELAY; None when not given.
    pub notify: Option<Vec<String>>,
    /// `addr-type;address`, xtext-decoded.
    pub orcpt: Option<String>,
}

fn bad(param: &Param, why: &str) -> Reply {
    Reply::new(
        501,
        "5.5.4",
        format!(
            "invalid {}={}: {why}",
            param.key,
            param.value.as_deref().unwrap_or("")
        ),
    )
}

fn unknown(param: &Param) -> Reply {
    Reply::new(
        555,
        "5.5.4",
        format!("parameter {} is not recognised", param.key),
    )
}

fn value(param: &Param) -> Result<&str, Reply> {
    param
        .value
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| bad(param, "a value is required"))
}

fn once<T>(slot: &Option<T>, param: &Param) -> Result<(), Reply> {
    if slot.is_some() {
        Err(bad(param, "given twice"))
    } else {
        Ok(())
    }
}

/// Interprets MAIL parameters; `esmtp` is false after HELO, when none are allowed.
pub fn mail_params(params: &[Param], esmtp: bool) -> Result<MailParams, Reply> {
    let mut out = MailParams::default();
    for p in params {
        if !esmtp {
            return Err(Reply::new(
                555,
                "5.5.4",
                format!("parameter {} needs EHLO, not HELO", p.key),
            ));
        }
        match p.key.as_str() {
            "SIZE" => {
                once(&out.size, p)?;
                let v = value(p)?;
                out.size = Some(
                    v.parse()
                        .ok()
                        .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or_else(|| bad(p, "expected a number of octets"))?,
                );
            }
            "BODY" => {
                once(&out.body, p)?;
                out.body = Some(match value(p)?.to_ascii_uppercase().as_str() {
                    "7BIT" => Body::SevenBit,
                    "8BITMIME" => Body::EightBitMime,
                    _ => return Err(bad(p, "expected 7BIT or 8BITMIME")),
                });
            }
            "SMTPUTF8" => {
                if p.value.is_some() {
                    return Err(bad(p, "SMTPUTF8 takes no value"));
                }
                out.smtputf8 = true;
            }
            "RET" => {
                once(&out.ret, p)?;
                out.ret = Some(match value(p)?.to_ascii_uppercase().as_str() {
                    "FULL" => Ret::Full,
                    "HDRS" => Ret::Hdrs,
                    _ => return Err(bad(p, "expected FULL or HDRS")),
                });
            }
            "ENVID" => {
                once(&out.envid, p)?;
                let v = xtext_decode(value(p)?).ok_or_else(|| bad(p, "not valid xtext"))?;
                if v.len() > 100 {
                    return Err(bad(p, "longer than 100 characters"));
                }
                out.envid = Some(v);
            }
            // AUTH= names the original submitter (RFC 4954 §5); we do not trust it from a
            // client, so it is accepted and ignored.
            "AUTH" => {}
            _ => return Err(unknown(p)),
        }
    }
    Ok(out)
}

/// Interprets RCPT parameters.
pub fn rcpt_params(params: &[Param]) -> Result<RcptParams, Reply> {
    let mut out = RcptParams::default();
    for p in params {
        match p.key.as_str() {
            "NOTIFY" => {
                once(&out.notify, p)?;
                let mut list: Vec<String> = Vec::new();
                for item in value(p)?.split(',') {
                    let item = item.to_ascii_uppercase();
                    if !matches!(item.as_str(), "NEVER" | "SUCCESS" | "FAILURE" | "DELAY") {
                        return Err(bad(p, "expected NEVER or SUCCESS,FAILURE,DELAY"));
                    }
                    if list.contains(&item) {
                        return Err(bad(p, "a keyword is repeated"));
                    }
                    list.push(item);
                }
                if list.len() > 1 && list.iter().any(|i| i == "NEVER") {
                    return Err(bad(p, "NEVER cannot be combined"));
                }
                out.notify = Some(list);
            }
            "ORCPT" => {
                once(&out.orcpt, p)?;
                let v = value(p)?;
                if v.len() > 500 {
                    return Err(bad(p, "longer than 500 characters"));
                }
                let (kind, addr) = v
                    .split_once(';')
                    .filter(|(k, a)| !k.is_empty() && !a.is_empty())
                    .ok_or_else(|| bad(p, "expected addr-type;address"))?;
                if !kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                    return Err(bad(
                        p,
                        "the address type is not an atom (letters, digits, -)",
                    ));
                }
                let addr = xtext_decode(addr).ok_or_else(|| bad(p, "not valid xtext"))?;
                out.orcpt = Some(format!("{kind};{addr}"));
            }
            _ => return Err(unknown(p)),
        }
    }
    Ok(out)
}

/// The encodings these parameters and AUTH use, defined once in `encoding`.
pub use crate::encoding::{base64_decode, base64_encode, xtext_decode};

#[cfg(test)]
mod tests {
    use super::*;

    fn p(key: &str, value: Option<&str>) -> Param {
        Param {
            key: key.into(),
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn mail_params_table() {
        let got = mail_params(
            &[
                p("SIZE", Some("1000")),
                p("BODY", Some("8bitmime")),
                p("SMTPUTF8", None),
                p("RET", Some("HDRS")),
                p("ENVID", Some("QQ314159+2Bx")),
                p("AUTH", Some("<>")),
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            got,
            MailParams {
                size: Some(1000),
                body: Some(Body::EightBitMime),
                smtputf8: true,
                ret: Some(Ret::Hdrs),
                envid: Some("QQ314159+x".into()),
            }
        );
        let refused: &[(&[Param], bool, u16)] = &[
            (&[p("SIZE", Some("x"))], true, 501),
            (&[p("SIZE", Some("-1"))], true, 501),
            (&[p("SIZE", None)], true, 501),
            (&[p("BODY", Some("BINARYMIME"))], true, 501),
            (&[p("RET", Some("ALL"))], true, 501),
            (&[p("RET", Some("FULL")), p("RET", Some("HDRS"))], true, 501),
            (&[p("ENVID", Some("a=b"))], true, 501),
            (&[p("SMTPUTF8", Some("yes"))], true, 501),
            (&[p("XFOO", None)], true, 555),
            (&[p("SIZE", Some("1"))], false, 555),
        ];
        for (params, esmtp, code) in refused {
            let reply = mail_params(params, *esmtp).expect_err(&format!("{params:?}"));
            assert_eq!(reply.code, *code, "{params:?}");
        }
    }

    #[test]
    fn rcpt_params_table() {
        let got = rcpt_params(&[
            p("NOTIFY", Some("success,DELAY")),
            p("ORCPT", Some("rfc822;b+2Bfilter@example.test")),
        ])
        .unwrap();
        assert_eq!(got.notify, Some(vec!["SUCCESS".into(), "DELAY".into()]));
        assert_eq!(got.orcpt.as_deref(), Some("rfc822;b+filter@example.test"));
        let refused: &[&[Param]] = &[
            &[p("NOTIFY", Some("NEVER,SUCCESS"))],
            &[p("NOTIFY", Some("SOMETIMES"))],
            &[p("NOTIFY", Some("DELAY,DELAY"))],
            &[p("ORCPT", Some("rfc822"))],
            &[p("ORCPT", Some(";a@b"))],
            &[p("ORCPT", Some("rfc822;a+ZZ"))],
            &[p("ORCPT", Some("rfc822;a+0Ab@x"))],
            &[p("ORCPT", Some("rfc\n822;a@x"))],
            &[p("ORCPT", Some("rfc822\r;a@x"))],
        ];
        for params in refused {
            assert_eq!(
                rcpt_params(params).expect_err("refused").code,
                501,
                "{params:?}"
            );
        }
        assert_eq!(rcpt_params(&[p("SIZE", Some("1"))]).unwrap_err().code, 555);
    }

    #[test]
    fn encodings() {
        for (text, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("\0a\0b", "AGEAYg=="),
        ] {
            assert_eq!(base64_encode(text.as_bytes()), encoded);
            assert_eq!(base64_decode(encoded).as_deref(), Some(text.as_bytes()));
        }
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9v!", "===="] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
        assert_eq!(xtext_decode("a+2Bb").as_deref(), Some("a+b"));
        assert_eq!(xtext_decode("a+2b"), None);
        assert_eq!(xtext_decode("a+2"), None);
        assert_eq!(xtext_decode("a b"), None);
        assert_eq!(xtext_decode("a+0Ab"), None, "an escaped LF");
        assert_eq!(xtext_decode("a+0Db"), None, "an escaped CR");
        assert_eq!(xtext_decode("a+00b"), None, "an escaped NUL");
    }
}

//! The `_smtp._tls.<domain>` TXT record (RFC 8460 §3): where a domain wants its reports.
//! Pure.

/// One place reports go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rua {
    /// `mailto:` an address.
    Mailto(String),
    /// An `https:` URL to POST to.
    Https(String),
}

impl Rua {
    pub fn as_uri(&self) -> String {
        match self {
            Rua::Mailto(a) => format!("mailto:{a}"),
            Rua::Https(u) => u.clone(),
        }
    }
}

/// The most report URIs one record may name that are used.
pub const MAX_RUA: usize = 5;

/// Parses one TXT record: `v=TLSRPTv1; rua=mailto:a@b.example,https://r.example/x`. `v` must
/// come first; URIs other than mailto and https are skipped (§3: unknown schemes are
/// ignored); a record without a usable URI is refused.
pub fn parse(text: &str) -> Result<Vec<Rua>, String> {
    let mut fields = text.split(';').map(str::trim).filter(|f| !f.is_empty());
    if fields.next() != Some("v=TLSRPTv1") {
        return Err("the record does not begin with v=TLSRPTv1".into());
    }
    let mut out = Vec::new();
    for field in fields {
        let Some((key, value)) = field.split_once('=') else {
            return Err(format!("the field {field:?} has no '='"));
        };
        if key.trim() != "rua" {
            continue;
        }
        for uri in value.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let lower = uri.to_ascii_lowercase();
            if let Some(addr) = lower.strip_prefix("mailto:").map(|_| &uri[7..]) {
                let addr = percent_decode(addr);
                if is_mailbox(&addr) {
                    out.push(Rua::Mailto(addr));
                }
            } else if lower.starts_with("https://") && uri.len() <= 2000 {
                out.push(Rua::Https(uri.to_owned()));
            }
        }
    }
    out.truncate(MAX_RUA);
    if out.is_empty() {
        return Err("the record names no mailto: or https: report address".into());
    }
    Ok(out)
}

/// The one TLS-RPT record among a name's TXT answers (those beginning `v=TLSRPTv1`).
pub fn select(answers: &[String]) -> Result<Option<Vec<Rua>>, String> {
    let claims: Vec<&String> = answers
        .iter()
        .filter(|t| t.trim_start().starts_with("v=TLSRPTv1"))
        .collect();
    match claims.as_slice() {
        [] => Ok(None),
        [one] => parse(one).map(Some),
        many => Err(format!(
            "{} TXT records begin with v=TLSRPTv1, where one is allowed",
            many.len()
        )),
    }
}

/// A plain mailbox a report can go to: a dot-atom local part (RFC 5322 §3.2.3, no quoted
/// strings) and a domain name (`pepsi_conf::address`).
fn is_mailbox(text: &str) -> bool {
    let Ok(address) = pepsi_conf::address::Address::parse(text) else {
        return false;
    };
    let local = address.local();
    !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..")
        && local
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~.".contains(&b))
}

/// `%xx` escapes of a mailto address (RFC 6068).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records() {
        assert_eq!(
            parse("v=TLSRPTv1; rua=mailto:tls@b.example,https://r.example/tlsrpt"),
            Ok(vec![
                Rua::Mailto("tls@b.example".into()),
                Rua::Https("https://r.example/tlsrpt".into())
            ])
        );
        assert_eq!(
            parse("v=TLSRPTv1;rua=MAILTO:a%2Bb@b.example, ftp://x, http://y"),
            Ok(vec![Rua::Mailto("a+b@b.example".into())])
        );
        assert!(
            parse("rua=mailto:a@b; v=TLSRPTv1")
                .unwrap_err()
                .contains("begin")
        );
        assert!(
            parse("v=TLSRPTv1; rua=http://plain.example/")
                .unwrap_err()
                .contains("no mailto")
        );
        assert!(parse("v=TLSRPTv1; rua").unwrap_err().contains("no '='"));
        let many = format!(
            "v=TLSRPTv1; rua={}",
            (0..9)
                .map(|i| format!("mailto:r{i}@b.example"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(parse(&many).unwrap().len(), MAX_RUA);
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(select(&s(&["v=spf1 -all"])), Ok(None));
        assert!(
            select(&s(&[
                "v=TLSRPTv1; rua=mailto:a@b",
                "v=TLSRPTv1; rua=mailto:c@d"
            ]))
            .is_err()
        );
        assert_eq!(Rua::Mailto("a@b".into()).as_uri(), "mailto:a@b");
    }
}

//! Names the setup takes from an operator: DNS names, DKIM selectors, mail addresses.

/// A domain or host name as DNS takes it: at least two dotted labels of letters, digits and
/// hyphens, returned in lower case without a trailing dot. `what` names the field in the
/// message.
pub fn check_name(what: &str, name: &str) -> Result<String, String> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if lower.len() > 253 || !lower.contains('.') || !lower.split('.').all(label_ok) {
        return Err(format!(
            "{what} {name:?} is not a domain name (dotted labels of letters, digits and hyphens)"
        ));
    }
    Ok(lower)
}

/// A DKIM selector: one or more dotted labels (RFC 6376 §3.1), at most 63 bytes here.
pub fn check_selector(selector: &str) -> Result<String, String> {
    let ok = !selector.is_empty()
        && selector.len() <= 63
        && selector
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(selector.to_ascii_lowercase())
    } else {
        Err(format!(
            "DKIM selector {selector:?} is not one (letters, digits, hyphens and dots, at most 63)"
        ))
    }
}

/// A mail address with a domain name after the `@`, normalised as the rest of Pepsi keys
/// addresses (the domain in lower case).
pub fn check_address(what: &str, text: &str) -> Result<String, String> {
    let address = pepsi_conf::address::Address::parse(text)
        .map_err(|e| format!("{what} {text:?} is not a mail address: {e}"))?;
    check_name(&format!("the domain of {what}"), address.domain())?;
    Ok(address.key())
}

/// A host and port as `host:port` or `[ip]:port`, for the smarthost and LMTP server: a
/// DNS name or an IP address, and a port from 1 to 65535.
pub fn check_host_port(what: &str, text: &str) -> Result<(String, u16), String> {
    let bad =
        || format!("{what} {text:?} is not HOST:PORT (a host name or [IP address], and a port)");
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    let host = if let Some(ip) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        ip.parse::<std::net::IpAddr>().map_err(|_| bad())?;
        host.to_owned()
    } else if host.parse::<std::net::Ipv4Addr>().is_ok() {
        host.to_owned()
    } else {
        check_name(what, host)?
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_dns_takes_them() {
        let check = |input: &str, expected: Option<&str>| {
            assert_eq!(
                check_name("host", input).ok().as_deref(),
                expected,
                "{input}"
            );
        };
        check("Mail.Example.ORG.", Some("mail.example.org"));
        check("a-b.example", Some("a-b.example"));
        check("localhost", None);
        check("-a.example", None);
        check("a..example", None);
        check("a_b.example", None);
        check("ex ample.org", None);
        check(&format!("{}.org", "a".repeat(64)), None);
    }

    #[test]
    fn selectors_and_host_ports() {
        assert_eq!(check_selector("s202612").unwrap(), "s202612");
        assert_eq!(check_selector("mail.2026").unwrap(), "mail.2026");
        assert!(check_selector("a b").is_err());
        assert!(check_selector("").is_err());
        assert!(check_selector("x;y").is_err());
        assert_eq!(
            check_host_port("smarthost", "smtp.Example.com:587").unwrap(),
            ("smtp.example.com".to_owned(), 587)
        );
        assert_eq!(
            check_host_port("lmtp", "[::1]:24").unwrap(),
            ("[::1]".to_owned(), 24)
        );
        assert_eq!(
            check_host_port("lmtp", "127.0.0.1:24").unwrap(),
            ("127.0.0.1".to_owned(), 24)
        );
        assert!(check_host_port("smarthost", "smtp.example.com").is_err());
        assert!(check_host_port("smarthost", "smtp.example.com:0").is_err());
        assert!(check_host_port("smarthost", "smtp.example.com:99999").is_err());
        assert!(check_host_port("smarthost", "[nope]:25").is_err());
    }
}

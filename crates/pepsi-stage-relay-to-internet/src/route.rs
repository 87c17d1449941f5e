//! Where mail for a domain goes, decided from what the DNS said (RFC 5321 §5.1, RFC 7505):
//! the MX hosts in the order to try them, the implicit MX when there is none, the null MX,
//! and the answers that are no route at all. Pure: the DNS answers come in as values, the
//! randomness as a function, so every rule is a row in a table test.

use std::net::IpAddr;

use pepsi_outbound::delivery::Failure;
pub use pepsi_outbound::dns::{MxAnswer, MxRecord};

/// One host to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The MX host name (or the domain itself for the implicit MX, or the literal).
    pub name: String,
    pub preference: u16,
    /// The destination is an address literal (`user@[192.0.2.1]`): no DNS, no cache.
    pub literal: Option<IpAddr>,
    /// The MX answer named this host in a way that cannot be used; why.
    pub unusable: Option<String>,
}

impl Hop {
    fn named(name: &str, preference: u16) -> Hop {
        let unusable = name.parse::<IpAddr>().ok().map(|_| {
            format!(
                "the MX record names {name}, an IP address, where RFC 5321 §5.1 requires a host name"
            )
        });
        Hop {
            name: name.to_owned(),
            preference,
            literal: None,
            unusable,
        }
    }
}

/// Why there is no route: these are permanent, a bounce tells the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRoute {
    /// NXDOMAIN for the recipient's domain (5.1.2).
    NoDomain,
    /// A null MX (RFC 7505): the domain says it accepts no mail (5.1.10).
    NullMx,
    /// This host is the most preferred MX: delivering would loop (5.4.6).
    LoopsBack(String),
    /// The recipient address has no usable domain (5.1.3).
    BadAddress,
}

impl NoRoute {
    pub fn failure(&self, domain: &str) -> Failure {
        let (text, status) = match self {
            NoRoute::NoDomain => (
                format!("the domain {domain} does not exist (NXDOMAIN)"),
                "5.1.2",
            ),
            NoRoute::NullMx => (
                format!("the domain {domain} does not accept mail (null MX, RFC 7505)"),
                "5.1.10",
            ),
            NoRoute::LoopsBack(me) => (
                format!("mail for {domain} loops back to this host: {me} is its best MX"),
                "5.4.6",
            ),
            NoRoute::BadAddress => (
                format!("{domain:?} is not a domain mail can be sent to"),
                "5.1.3",
            ),
        };
        let mut f = Failure::new(text, status);
        f.phase = Some("routing".into());
        f
    }
}

/// The destination of an address literal domain (`[192.0.2.1]`, `[IPv6:2001:db8::1]`);
/// `Ok(None)` for a domain name.
pub fn literal(domain: &str) -> Result<Option<IpAddr>, NoRoute> {
    let Some(inner) = domain.strip_prefix('[').and_then(|d| d.strip_suffix(']')) else {
        return Ok(None);
    };
    let text = match inner.get(..5) {
        Some(tag) if tag.eq_ignore_ascii_case("ipv6:") => &inner[5..],
        _ => inner,
    };
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) if text.len() == inner.len() => Err(NoRoute::BadAddress),
        Ok(ip) => Ok(Some(ip)),
        Err(_) => Err(NoRoute::BadAddress),
    }
}

pub use pepsi_outbound::dns::internal_range;

/// The hosts to try for mail to `domain`, most preferred first, hosts of equal preference
/// in random order (`random` gives the shuffle its numbers).
///
/// - No MX records: the domain itself is the only host (the implicit MX).
/// - A single MX whose exchange is the root (`0 .`), or only root exchanges: a null MX.
///   A root exchange among real ones is skipped.
/// - When `me` (this host's name) is among the MX hosts, only the hosts more preferred than
///   it are kept (RFC 5321 §5.1); none left is a loop.
/// - An MX naming an IP address is kept, marked unusable, so the attempt reports it.
pub fn hops(
    domain: &str,
    answer: MxAnswer,
    me: &str,
    mut random: impl FnMut() -> u64,
) -> Result<Vec<Hop>, NoRoute> {
    let mut records = match answer {
        MxAnswer::NoDomain => return Err(NoRoute::NoDomain),
        MxAnswer::NoRecords => return Ok(vec![Hop::named(domain, 0)]),
        MxAnswer::Records(records) => records,
    };
    if records.iter().all(|r| r.exchange.is_empty()) {
        return Err(NoRoute::NullMx);
    }
    records.retain(|r| !r.exchange.is_empty());
    records.sort_by(|a, b| {
        a.preference
            .cmp(&b.preference)
            .then_with(|| a.exchange.cmp(&b.exchange))
    });
    let mut seen = std::collections::HashSet::new();
    records.retain(|r| seen.insert(r.exchange.clone()));
    let me = me.trim_end_matches('.').to_ascii_lowercase();
    if let Some(mine) = records.iter().find(|r| r.exchange == me) {
        let limit = mine.preference;
        records.retain(|r| r.preference < limit);
        if records.is_empty() {
            return Err(NoRoute::LoopsBack(me));
        }
    }
    // Fisher-Yates within each run of equal preference.
    let mut start = 0;
    while start < records.len() {
        let pref = records[start].preference;
        let end = start
            + records[start..]
                .iter()
                .take_while(|r| r.preference == pref)
                .count();
        for i in (start + 1..end).rev() {
            let j = start + (random() % ((i - start + 1) as u64)) as usize;
            records.swap(i, j);
        }
        start = end;
    }
    Ok(records
        .iter()
        .map(|r| Hop::named(&r.exchange, r.preference))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_ranges_table() {
        let cases = [
            ("127.0.0.1", Some("loopback")),
            ("127.8.9.10", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("0.0.0.0", Some("unspecified")),
            (
                "100.64.0.1",
                Some("shared address space (carrier-grade NAT)"),
            ),
            ("224.0.0.1", Some("multicast or reserved")),
            ("255.255.255.255", Some("multicast or reserved")),
            ("192.0.2.1", None),
            ("8.8.8.8", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("fd00::1", Some("private (unique local)")),
            ("fe80::1", Some("link-local")),
            ("::ffff:10.0.0.1", Some("private")),
            ("::ffff:192.0.2.1", None),
            ("ff02::1", Some("multicast or reserved")),
            ("2001:db8::1", None),
        ];
        for (ip, want) in cases {
            assert_eq!(internal_range(ip.parse().unwrap()), want, "{ip}");
        }
    }

    fn mx(list: &[(u16, &str)]) -> MxAnswer {
        MxAnswer::Records(
            list.iter()
                .map(|(p, e)| MxRecord {
                    preference: *p,
                    exchange: e.to_string(),
                })
                .collect(),
        )
    }

    /// `answer` → the host names in order, or the reason there is no route.
    fn check(answer: MxAnswer, me: &str, expected: Result<&[&str], NoRoute>) {
        let got = hops("d.example", answer.clone(), me, || 0)
            .map(|h| h.into_iter().map(|h| h.name).collect::<Vec<_>>());
        let expected = expected.map(|v| v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(got, expected, "{answer:?}");
    }

    #[test]
    fn route_table() {
        check(
            mx(&[(20, "b.example"), (10, "a.example"), (30, "c.example")]),
            "me.example",
            Ok(&["a.example", "b.example", "c.example"]),
        );
        check(MxAnswer::NoRecords, "me.example", Ok(&["d.example"]));
        check(MxAnswer::NoDomain, "me.example", Err(NoRoute::NoDomain));
        check(mx(&[(0, "")]), "me.example", Err(NoRoute::NullMx));
        // a null MX published with preference other than 0 is still a null MX
        check(mx(&[(10, "")]), "me.example", Err(NoRoute::NullMx));
        // a root exchange among real ones is ignored
        check(
            mx(&[(0, ""), (10, "a.example")]),
            "me.example",
            Ok(&["a.example"]),
        );
        // the same host twice is tried once, at its best preference
        check(
            mx(&[(20, "a.example"), (10, "a.example"), (15, "b.example")]),
            "me.example",
            Ok(&["a.example", "b.example"]),
        );
        // this host among the MX hosts: only the better ones
        check(
            mx(&[(10, "a.example"), (20, "me.example"), (30, "c.example")]),
            "ME.example.",
            Ok(&["a.example"]),
        );
        check(
            mx(&[(10, "me.example"), (20, "c.example")]),
            "me.example",
            Err(NoRoute::LoopsBack("me.example".into())),
        );
    }

    #[test]
    fn an_mx_naming_an_ip_address_is_kept_and_marked_unusable() {
        let hops = hops(
            "d.example",
            mx(&[(10, "192.0.2.7"), (20, "b.example")]),
            "me",
            || 0,
        )
        .unwrap();
        let why = hops[0].unusable.as_deref().unwrap();
        assert!(
            why.contains("192.0.2.7") && why.contains("host name"),
            "{why}"
        );
        assert_eq!(hops[1].unusable, None);
    }

    #[test]
    fn equal_preferences_are_shuffled_and_never_mixed_with_others() {
        let answer = mx(&[
            (10, "a1.example"),
            (10, "a2.example"),
            (10, "a3.example"),
            (20, "b1.example"),
            (20, "b2.example"),
            (5, "first.example"),
        ]);
        let mut seen = std::collections::BTreeSet::new();
        let mut n = 0u64;
        for _ in 0..200 {
            let order: Vec<String> = hops("d.example", answer.clone(), "me", || {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                n >> 33
            })
            .unwrap()
            .into_iter()
            .map(|h| h.name)
            .collect();
            assert_eq!(order[0], "first.example");
            let mut a: Vec<&str> = order[1..4].iter().map(String::as_str).collect();
            seen.insert(a.join(","));
            a.sort();
            assert_eq!(a, ["a1.example", "a2.example", "a3.example"]);
            let mut b: Vec<&str> = order[4..].iter().map(String::as_str).collect();
            b.sort();
            assert_eq!(b, ["b1.example", "b2.example"]);
        }
        assert_eq!(
            seen.len(),
            6,
            "every order of three equal hosts occurs: {seen:?}"
        );
    }

    #[test]
    fn address_literals() {
        assert_eq!(literal("example.org"), Ok(None));
        assert_eq!(
            literal("[192.0.2.1]"),
            Ok(Some("192.0.2.1".parse().unwrap()))
        );
        assert_eq!(
            literal("[ipv6:2001:db8::1]"),
            Ok(Some("2001:db8::1".parse().unwrap()))
        );
        // RFC 5321 §4.1.3: an IPv6 literal carries its tag
        assert_eq!(literal("[2001:db8::1]"), Err(NoRoute::BadAddress));
        assert_eq!(literal("[mx.example]"), Err(NoRoute::BadAddress));
    }

    #[test]
    fn no_route_failures_carry_their_status() {
        let cases = [
            (NoRoute::NoDomain, "5.1.2", "does not exist"),
            (NoRoute::NullMx, "5.1.10", "does not accept mail"),
            (NoRoute::LoopsBack("me".into()), "5.4.6", "loops back"),
            (NoRoute::BadAddress, "5.1.3", "not a domain"),
        ];
        for (r, status, text) in cases {
            let f = r.failure("d.example");
            assert_eq!(f.enhanced_status.as_deref(), Some(status));
            assert!(
                f.diagnostic.contains(text) && f.diagnostic.contains("d.example"),
                "{}",
                f.diagnostic
            );
        }
    }
}

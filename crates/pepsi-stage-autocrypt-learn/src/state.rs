//! Autocrypt Level 1 peer state (autocrypt.org/level1.html §2.3): how one incoming
//! message changes what we know of its sender. Pure; tested as a table.

use chrono::{DateTime, Utc};

/// What is stored of a peer (the `peer_key` row of source `autocrypt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub last_seen: DateTime<Utc>,
    pub autocrypt_timestamp: DateTime<Utc>,
    pub keydata: Vec<u8>,
    pub prefer_mutual: bool,
}

/// A valid Autocrypt header of the message, for its From address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub keydata: Vec<u8>,
    pub prefer_mutual: bool,
}

/// The peer's new state after a message with effective date `date` (its Date, or now when
/// that lies in the future) and the header `header`; None when nothing is to be stored
/// (no header and no peer yet).
pub fn update(peer: Option<&Peer>, date: DateTime<Utc>, header: Option<&Seen>) -> Option<Peer> {
    match (peer, header) {
        (None, None) => None,
        (None, Some(h)) => Some(Peer {
            last_seen: date,
            autocrypt_timestamp: date,
            keydata: h.keydata.clone(),
            prefer_mutual: h.prefer_mutual,
        }),
        // Older than what we learnt from a header: tells us nothing new.
        (Some(p), _) if date <= p.autocrypt_timestamp => Some(p.clone()),
        (Some(p), None) => Some(Peer {
            last_seen: p.last_seen.max(date),
            ..p.clone()
        }),
        (Some(p), Some(h)) => Some(Peer {
            last_seen: p.last_seen.max(date),
            autocrypt_timestamp: date,
            keydata: h.keydata.clone(),
            prefer_mutual: h.prefer_mutual,
        }),
    }
}

/// The effective date of a message: its Date, unless that is missing or in the future.
pub fn effective_date(date: Option<DateTime<Utc>>, now: DateTime<Utc>) -> DateTime<Utc> {
    date.map_or(now, |d| d.min(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn peer_state_updates_as_a_table() {
        let k1 = Seen {
            keydata: vec![1],
            prefer_mutual: true,
        };
        let k2 = Seen {
            keydata: vec![2],
            prefer_mutual: false,
        };
        let p = Peer {
            last_seen: t(100),
            autocrypt_timestamp: t(100),
            keydata: vec![1],
            prefer_mutual: true,
        };
        assert_eq!(update(None, t(0), None), None);
        assert_eq!(
            update(None, t(5), Some(&k1)).unwrap().autocrypt_timestamp,
            t(5)
        );
        // A newer message without a header: last seen moves, the key stays.
        let q = update(Some(&p), t(200), None).unwrap();
        assert_eq!(
            (q.last_seen, q.autocrypt_timestamp, q.keydata.clone()),
            (t(200), t(100), vec![1])
        );
        // A newer header replaces the key and the preference.
        let r = update(Some(&q), t(300), Some(&k2)).unwrap();
        assert_eq!(
            (
                r.last_seen,
                r.autocrypt_timestamp,
                r.keydata.clone(),
                r.prefer_mutual
            ),
            (t(300), t(300), vec![2], false)
        );
        // An older message (out of order delivery) changes nothing.
        assert_eq!(update(Some(&r), t(250), Some(&k1)).unwrap(), r);
        assert_eq!(update(Some(&r), t(300), Some(&k1)).unwrap(), r);
        assert_eq!(effective_date(Some(t(50)), t(10)), t(10));
        assert_eq!(effective_date(None, t(10)), t(10));
        assert_eq!(effective_date(Some(t(5)), t(10)), t(5));
    }
}

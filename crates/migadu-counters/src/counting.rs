//! Counting rules: which keys a validated request increments, with which limits, and which
//! increment crossed a limit. Pure: lookups come in as a function, Redis results as values.

use std::sync::Arc;

use chrono::NaiveDate;

use crate::address::{domain_part, local_part};
use crate::domains::{DomainRecord, Flow, Level};
use crate::validate::{CountRequest, Route};

/// Counters live 31 days so the web app can show a month.
pub const KEY_TTL_SECONDS: i64 = 2_678_400;

/// `cnt/<A|D|O>/<id>/d/<YYYY-MM-DD>/<i|o>`, the web app's key format.
pub fn counter_key(level: Level, id: &str, date: NaiveDate, flow: Flow) -> String {
    use chrono::Datelike;
    // Built in one allocation, without the formatting machinery: three keys per side of every
    // request (chrono's strftime parsed its pattern for each).
    let mut key = String::with_capacity(id.len() + 19);
    key.push_str("cnt/");
    key.push_str(level.as_str());
    key.push('/');
    key.push_str(id);
    key.push_str("/d/");
    let year = date.year();
    if (0..=9999).contains(&year) {
        let (y, m, d) = (year as u32, date.month(), date.day());
        let digit = |n: u32| b'0' + (n % 10) as u8;
        let text = [
            digit(y / 1000),
            digit(y / 100),
            digit(y / 10),
            digit(y),
            b'-',
            digit(m / 10),
            digit(m),
            b'-',
            digit(d / 10),
            digit(d),
        ];
        key.push_str(std::str::from_utf8(&text).expect("ASCII digits"));
    } else {
        key.push_str(&format!(
            "{:04}-{:02}-{:02}",
            year,
            date.month(),
            date.day()
        ));
    }
    key.push('/');
    key.push_str(flow.as_str());
    key
}

/// The crossing rule: this increment by one moved the counter from below `limit` to at least
/// `limit`, i.e. `new − 1 < L ≤ new`. Exactly one increment can satisfy it, whoever made it.
pub fn crossed(new: i64, limit: Option<u64>) -> bool {
    match limit {
        Some(l) => {
            let l = i128::from(l);
            let new = i128::from(new);
            new - 1 < l && l <= new
        }
        None => false,
    }
}

/// Which side of a request a domain was looked up for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Sender,
    Recipient,
}

/// One line of the counting transaction log, before it is rendered as text or JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Request {
        auth_user: Option<String>,
        recipient: String,
        mail_from: String,
        junk: Option<bool>,
    },
    LocalDomain {
        domain: String,
        org_id: u64,
    },
    DomainLimits {
        domain: String,
        limits: String,
    },
    DeterminedLimit {
        level: Level,
        flow: Flow,
        key: String,
        limit: Option<u64>,
    },
    NotInDb {
        side: Side,
        domain: String,
    },
    SkippedExempt {
        address: String,
    },
    SkippedJunk,
    Tracked {
        level: Level,
        flow: Flow,
        id: String,
        key: String,
        count: i64,
        limit: Option<u64>,
        reached: bool,
    },
    KeyFailed {
        level: Level,
        flow: Flow,
        key: String,
        error: String,
    },
    LimitReached {
        level: Level,
        flow: Flow,
        id: String,
        by: String,
        url_name: &'static str,
        url_set: bool,
    },
    RedisError {
        error: String,
    },
    NotificationSent {
        url: String,
    },
    NotificationFailed {
        url: String,
        attempts: u32,
        error: String,
    },
}

/// One key to increment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Increment {
    pub level: Level,
    pub flow: Flow,
    pub id: String,
    pub key: String,
    pub limit: Option<u64>,
    /// The address that caused it: the sender for outgoing, the recipient for incoming.
    pub by: String,
}

/// What a request will do, decided before any Redis call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub events: Vec<Event>,
    pub increments: Vec<Increment>,
}

/// The settings the rules depend on.
pub struct Rules<'a> {
    pub exempt: &'a [String],
    pub count_junk: bool,
    /// Whether to write down the counting log's events; without a counting log, a plan is its
    /// increments alone.
    pub events: bool,
}

impl Plan {
    /// Adds a counting log event when there is a log to write it to; the event is only built
    /// then.
    fn note(&mut self, on: bool, event: impl FnOnce() -> Event) {
        if on {
            self.events.push(event());
        }
    }
}

fn side_block(
    plan: &mut Plan,
    (side, flow): (Side, Flow),
    addr: &str,
    date: NaiveDate,
    lookup: &dyn Fn(&str) -> Option<Arc<DomainRecord>>,
    events: bool,
) {
    let domain = domain_part(addr);
    let Some(rec) = lookup(domain) else {
        plan.note(events, || Event::NotInDb {
            side,
            domain: domain.to_string(),
        });
        return;
    };
    plan.note(events, || Event::LocalDomain {
        domain: domain.to_string(),
        org_id: rec.org_id,
    });
    plan.note(events, || Event::DomainLimits {
        domain: domain.to_string(),
        limits: rec.limits_map().to_string(),
    });
    let org = rec.org_id.to_string();
    let local = local_part(addr);
    for (level, id) in [
        (Level::A, addr),
        (Level::D, domain),
        (Level::O, org.as_str()),
    ] {
        let key = counter_key(level, id, date, flow);
        let limit = rec.limit(level, flow, local);
        plan.note(events, || Event::DeterminedLimit {
            level,
            flow,
            key: key.clone(),
            limit,
        });
        plan.increments.push(Increment {
            level,
            flow,
            id: id.to_string(),
            key,
            limit,
            by: addr.to_string(),
        });
    }
}

/// Decides the increments of one request: exempt and junk skips, unknown domains skipped,
/// `/out` counts the sender's outgoing and a hosted recipient's incoming.
pub fn plan(
    req: &CountRequest,
    rules: &Rules<'_>,
    date: NaiveDate,
    lookup: &dyn Fn(&str) -> Option<Arc<DomainRecord>>,
) -> Plan {
    let mut plan = Plan::default();
    let events = rules.events;
    plan.note(events, || Event::Request {
        auth_user: req.auth_user.clone(),
        recipient: req.recipient.clone(),
        mail_from: req.mail_from.clone(),
        junk: (req.route == Route::In).then_some(req.junk),
    });
    let parties = [
        req.auth_user.as_deref(),
        Some(req.mail_from.as_str()),
        Some(req.recipient.as_str()),
    ];
    if let Some(addr) = parties
        .into_iter()
        .flatten()
        .find(|a| !a.is_empty() && rules.exempt.iter().any(|e| e == a))
    {
        plan.note(events, || Event::SkippedExempt {
            address: addr.to_string(),
        });
        return plan;
    }
    if req.route == Route::In && req.junk && !rules.count_junk {
        plan.note(events, || Event::SkippedJunk);
        return plan;
    }
    if let Some(sender) = req.auth_user.as_deref() {
        side_block(
            &mut plan,
            (Side::Sender, Flow::Out),
            sender,
            date,
            lookup,
            events,
        );
    }
    side_block(
        &mut plan,
        (Side::Recipient, Flow::In),
        &req.recipient,
        date,
        lookup,
        events,
    );
    plan
}

/// What Redis said about one key of the transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyResult {
    /// EXEC returned the new value.
    Counted(i64),
    /// EXEC returned an error for this key alone.
    Failed(String),
    /// The value read back after a lost reply, when a later transaction of the same batch also
    /// lost its reply and holds the same key: shown, but that later one alone may cross.
    Seen(i64),
}

/// A notification to send after a crossing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub level: Level,
    pub flow: Flow,
    pub id: String,
    pub by: String,
    pub count: i64,
    pub limit: u64,
}

/// Turns the per-key results into log events and the crossings to notify.
/// The events are left out when `log` is false (no counting log); the crossings never are.
pub fn outcome(
    increments: &[Increment],
    results: &[KeyResult],
    url_set: &dyn Fn(Level) -> bool,
    log: bool,
) -> (Vec<Event>, Vec<Crossing>) {
    let mut events = Vec::new();
    let mut crossings = Vec::new();
    for (inc, res) in increments.iter().zip(results) {
        match res {
            KeyResult::Counted(n) | KeyResult::Seen(n) => {
                let reached = matches!(res, KeyResult::Counted(_)) && crossed(*n, inc.limit);
                if log {
                    events.push(Event::Tracked {
                        level: inc.level,
                        flow: inc.flow,
                        id: inc.id.clone(),
                        key: inc.key.clone(),
                        count: *n,
                        limit: inc.limit,
                        reached,
                    });
                }
                if let (true, Some(limit)) = (reached, inc.limit) {
                    crossings.push(Crossing {
                        level: inc.level,
                        flow: inc.flow,
                        id: inc.id.clone(),
                        by: inc.by.clone(),
                        count: *n,
                        limit,
                    });
                }
            }
            KeyResult::Failed(e) if log => events.push(Event::KeyFailed {
                level: inc.level,
                flow: inc.flow,
                key: inc.key.clone(),
                error: e.clone(),
            }),
            KeyResult::Failed(_) => {}
        }
    }
    if log {
        for c in &crossings {
            events.push(Event::LimitReached {
                level: c.level,
                flow: c.flow,
                id: c.id.clone(),
                by: c.by.clone(),
                url_name: url_name(c.level),
                url_set: url_set(c.level),
            });
        }
    }
    (events, crossings)
}

/// The config key of a level's notification URL.
pub fn url_name(level: Level) -> &'static str {
    match level {
        Level::A => "address_url",
        Level::D => "domain_url",
        Level::O => "org_url",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn date() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 10, 6).unwrap()
    }

    #[test]
    fn crossing_rule() {
        let cases: &[(i64, Option<u64>, bool)] = &[
            (2, Some(3), false),
            (3, Some(3), true),
            (4, Some(3), false),
            (1, Some(1), true),
            (0, Some(0), true),
            (1, Some(0), false),
            (5, None, false),
            (i64::MAX, Some(u64::MAX), false),
        ];
        for (new, limit, want) in cases {
            assert_eq!(crossed(*new, *limit), *want, "new={new} limit={limit:?}");
        }
    }

    #[test]
    fn key_format() {
        assert_eq!(
            counter_key(Level::A, "x@example.com", date(), Flow::Out),
            "cnt/A/x@example.com/d/2026-10-06/o"
        );
        assert_eq!(
            counter_key(Level::D, "example.com", date(), Flow::In),
            "cnt/D/example.com/d/2026-10-06/i"
        );
        assert_eq!(
            counter_key(Level::O, "1234", date(), Flow::In),
            "cnt/O/1234/d/2026-10-06/i"
        );
    }

    fn db() -> HashMap<&'static str, Arc<DomainRecord>> {
        let mut m = HashMap::new();
        m.insert(
            "example.com",
            Arc::new(crate::domains::parse_record("1234|A/o=100,O/o=2200,bob@/i=5").unwrap()),
        );
        m.insert(
            "other.org",
            Arc::new(crate::domains::parse_record("99|D/i=10").unwrap()),
        );
        m
    }

    fn keys_of(
        route: Route,
        auth: Option<&str>,
        from: &str,
        rcpt: &str,
        junk: bool,
        count_junk: bool,
    ) -> Vec<String> {
        let db = db();
        let exempt = vec!["support@migadu.com".to_string()];
        let req = CountRequest {
            route,
            trace_id: "t".into(),
            auth_user: auth.map(str::to_string),
            mail_from: from.into(),
            recipient: rcpt.into(),
            junk,
        };
        let lookup = |d: &str| db.get(d).cloned();
        plan(
            &req,
            &Rules {
                exempt: &exempt,
                count_junk,
                events: true,
            },
            date(),
            &lookup,
        )
        .increments
        .into_iter()
        .map(|i| format!("{} {:?}", i.key, i.limit))
        .collect()
    }

    #[test]
    fn counting_table() {
        use Route::*;
        let out_local = keys_of(
            Out,
            Some("x@example.com"),
            "x@example.com",
            "bob@example.com",
            false,
            false,
        );
        assert_eq!(
            out_local,
            vec![
                "cnt/A/x@example.com/d/2026-10-06/o Some(100)",
                "cnt/D/example.com/d/2026-10-06/o None",
                "cnt/O/1234/d/2026-10-06/o Some(2200)",
                "cnt/A/bob@example.com/d/2026-10-06/i Some(5)",
                "cnt/D/example.com/d/2026-10-06/i None",
                "cnt/O/1234/d/2026-10-06/i None",
            ]
        );
        // external recipient: sender side only
        assert_eq!(
            keys_of(Out, Some("x@example.com"), "", "s@gmail.com", false, false).len(),
            3
        );
        // sender domain unknown: recipient side only, with its own row's limits
        assert_eq!(
            keys_of(Out, Some("x@gmail.com"), "", "y@other.org", false, false),
            vec![
                "cnt/A/y@other.org/d/2026-10-06/i None",
                "cnt/D/other.org/d/2026-10-06/i Some(10)",
                "cnt/O/99/d/2026-10-06/i None",
            ]
        );
        // exempt sender, exempt mail_from, exempt recipient
        assert!(
            keys_of(
                Out,
                Some("support@migadu.com"),
                "",
                "y@other.org",
                false,
                false
            )
            .is_empty()
        );
        assert!(keys_of(In, None, "support@migadu.com", "y@other.org", false, false).is_empty());
        assert!(
            keys_of(
                Out,
                Some("x@example.com"),
                "",
                "support@migadu.com",
                false,
                false
            )
            .is_empty()
        );
        // /in: local, unknown, junk
        assert_eq!(
            keys_of(In, None, "s@gmail.com", "y@other.org", false, false).len(),
            3
        );
        assert!(keys_of(In, None, "s@gmail.com", "y@gmail.com", false, false).is_empty());
        assert!(keys_of(In, None, "s@gmail.com", "y@other.org", true, false).is_empty());
        assert_eq!(
            keys_of(In, None, "s@gmail.com", "y@other.org", true, true).len(),
            3
        );
    }

    #[test]
    fn outcome_reports_crossings_and_key_failures() {
        let incs: Vec<Increment> = [(Level::A, Some(3)), (Level::D, None), (Level::O, Some(3))]
            .into_iter()
            .map(|(level, limit)| Increment {
                level,
                flow: Flow::Out,
                id: "id".into(),
                key: format!("k{}", level.as_str()),
                limit,
                by: "x@example.com".into(),
            })
            .collect();
        let results = [
            KeyResult::Counted(3),
            KeyResult::Counted(3),
            KeyResult::Failed("WRONGTYPE".into()),
        ];
        // a value seen on a re-read is tracked but never a crossing
        let seen = [
            KeyResult::Seen(3),
            KeyResult::Counted(3),
            KeyResult::Counted(3),
        ];
        let (events, crossings) = outcome(&incs, &seen, &|_| true, true);
        assert_eq!(crossings.len(), 1);
        assert_eq!(crossings[0].level, Level::O);
        assert!(matches!(
            events[0],
            Event::Tracked {
                count: 3,
                reached: false,
                ..
            }
        ));
        let (events, crossings) = outcome(&incs, &results, &|l| l != Level::D, true);
        assert_eq!(crossings.len(), 1);
        assert_eq!(crossings[0].level, Level::A);
        assert!(matches!(events[2], Event::KeyFailed { .. }));
        assert!(matches!(
            events[3],
            Event::LimitReached {
                url_set: true,
                url_name: "address_url",
                ..
            }
        ));
    }

    /// Without a counting log a request makes the same increments and crossings, and no events.
    #[test]
    fn without_a_log_the_same_increments_and_crossings_and_no_events() {
        let rec = Arc::new(crate::domains::parse_record("1234|A/o=3,A/i=5,O/o=9").unwrap());
        let lookup = |d: &str| (d == "example.com").then(|| rec.clone());
        let req = CountRequest {
            route: Route::Out,
            trace_id: "t".into(),
            auth_user: Some("x@example.com".into()),
            mail_from: "x@example.com".into(),
            recipient: "y@example.com".into(),
            junk: false,
        };
        let run = |events: bool| {
            let rules = Rules {
                exempt: &[],
                count_junk: false,
                events,
            };
            let p = plan(&req, &rules, date(), &lookup);
            let results: Vec<KeyResult> = [3, 1, 9, 5, 1, 2].map(KeyResult::Counted).to_vec();
            let (evs, cs) = outcome(&p.increments, &results, &|_| true, events);
            (p, evs, cs)
        };
        let (logged, logged_events, logged_crossings) = run(true);
        let (bare, bare_events, bare_crossings) = run(false);
        assert_eq!(bare.increments, logged.increments);
        assert_eq!(bare_crossings, logged_crossings);
        assert_eq!(bare_crossings.len(), 3);
        assert!(bare.events.is_empty() && bare_events.is_empty());
        assert!(!logged.events.is_empty() && !logged_events.is_empty());
    }

    /// The key's date is `{:04}-{:02}-{:02}` of the date's parts, for every date.
    #[test]
    fn counter_key_dates() {
        use chrono::Datelike;
        for (y, m, d) in [
            (2026, 10, 6),
            (2026, 1, 31),
            (999, 12, 1),
            (0, 1, 1),
            (12345, 2, 3),
            (-7, 3, 4),
        ] {
            let date = NaiveDate::from_ymd_opt(y, m, d).unwrap();
            assert_eq!(
                counter_key(Level::D, "example.com", date, Flow::In),
                format!(
                    "cnt/D/example.com/d/{:04}-{:02}-{:02}/i",
                    date.year(),
                    date.month(),
                    date.day()
                ),
                "{date:?}"
            );
        }
        assert_eq!(
            counter_key(Level::A, "x@example.com", date(), Flow::Out),
            "cnt/A/x@example.com/d/2026-10-06/o"
        );
    }
}

//! The hosted-domains CDB (`domain` → `<org_id>|<pairs>`): record parsing and limit resolution
//! (pure), plus the open file with its bounded cache of parsed records.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Counting level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    A,
    D,
    O,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::A => "A",
            Level::D => "D",
            Level::O => "O",
        }
    }
}

/// Direction of a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flow {
    In,
    Out,
}

impl Flow {
    pub fn as_str(self) -> &'static str {
        match self {
            Flow::In => "i",
            Flow::Out => "o",
        }
    }
}

/// One parsed CDB row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRecord {
    pub org_id: u64,
    /// Keys lowercased (`a/o`, `alice@/o`), values parsed; malformed pairs are not here.
    pub limits: BTreeMap<String, u64>,
    /// `limits_map()`, written once: the counting log shows it for every counted side.
    limits_text: String,
    /// Whether some `<local>@/<flow>` key exists, so an address without one costs no lookup.
    overrides: bool,
}

/// Parses `<org_id>|O/i=..,A/o=..,alice@/o=..`; `None` when the org id is not a number.
pub fn parse_record(value: &str) -> Option<DomainRecord> {
    let (org, pairs) = value.split_once('|').unwrap_or((value, ""));
    let org_id = org.trim().parse::<u64>().ok()?;
    let mut limits = BTreeMap::new();
    for pair in pairs.split(',') {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let key = k.trim().to_lowercase();
        let Ok(n) = v.trim().parse::<u64>() else {
            continue;
        };
        let Some((scope, flow)) = key.split_once('/') else {
            continue;
        };
        let scope_ok = matches!(scope, "a" | "d" | "o")
            || (scope.len() > 1 && scope.ends_with('@') && scope.matches('@').count() == 1);
        if scope_ok && matches!(flow, "i" | "o") {
            limits.insert(key, n);
        }
    }
    let limits_text = limits_text(&limits);
    let overrides = limits.keys().any(|k| k.contains('@'));
    Some(DomainRecord {
        org_id,
        limits,
        limits_text,
        overrides,
    })
}

/// `{A/i=500, A/o=100, ..}` as the counting log writes it: level keys upper-case again.
fn limits_text(limits: &BTreeMap<String, u64>) -> String {
    let items: Vec<String> = limits
        .iter()
        .map(|(k, v)| {
            let key = match k.split_once('/') {
                Some((s, f)) if s.len() == 1 => format!("{}/{f}", s.to_uppercase()),
                _ => k.clone(),
            };
            format!("{key}={v}")
        })
        .collect();
    format!("{{{}}}", items.join(", "))
}

impl DomainRecord {
    /// The limit for a level and flow; for `A`, `<local>@/<flow>` overrides `A/<flow>`.
    /// `None` = unlimited.
    pub fn limit(&self, level: Level, flow: Flow, local: &str) -> Option<u64> {
        if level == Level::A && self.overrides {
            let mut key = local.to_lowercase();
            key.push_str("@/");
            key.push_str(flow.as_str());
            if let Some(v) = self.limits.get(&key) {
                return Some(*v);
            }
        }
        let key = match (level, flow) {
            (Level::A, Flow::In) => "a/i",
            (Level::A, Flow::Out) => "a/o",
            (Level::D, Flow::In) => "d/i",
            (Level::D, Flow::Out) => "d/o",
            (Level::O, Flow::In) => "o/i",
            (Level::O, Flow::Out) => "o/o",
        };
        self.limits.get(key).copied()
    }

    /// `{A/i=500, A/o=100, ..}` as the counting log writes it: level keys upper-case again.
    pub fn limits_map(&self) -> &str {
        &self.limits_text
    }
}

/// Why a CDB could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot read domains cdb {path}: {source}")]
pub struct OpenError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// An open CDB with a bounded cache of parsed records (positive and negative).
pub struct Domains {
    /// `None` for a CDB without records, which the reader crate refuses to open.
    cdb: Option<cdb::CDB>,
    path: PathBuf,
    count: usize,
    cache: Mutex<HashMap<String, Option<Arc<DomainRecord>>>>,
    max_cached: usize,
}

impl Domains {
    /// Opens and scans the file once, so a corrupt file is refused here and not at lookup time.
    pub fn open(path: &Path, max_cached: usize) -> Result<Domains, OpenError> {
        let err = |source| OpenError {
            path: path.to_path_buf(),
            source,
        };
        // A record-less CDB is just its 2048-byte table of contents.
        const EMPTY_CDB_LEN: u64 = 2048;
        let len = std::fs::metadata(path).map_err(err)?.len();
        let mut count = 0;
        let cdb = if len == EMPTY_CDB_LEN {
            None
        } else {
            let cdb = cdb::CDB::open(path).map_err(err)?;
            for item in cdb.iter() {
                item.map_err(err)?;
                count += 1;
            }
            Some(cdb)
        };
        Ok(Domains {
            cdb,
            path: path.to_path_buf(),
            count,
            cache: Mutex::new(HashMap::new()),
            max_cached,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of records in the file.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The record of a hosted domain; `None` when the domain is unknown or its row malformed.
    pub fn lookup(&self, domain: &str) -> Option<Arc<DomainRecord>> {
        if let Some(hit) = self.cache.lock().expect("cache lock").get(domain) {
            return hit.clone();
        }
        let rec = match self.cdb.as_ref().and_then(|c| c.get(domain.as_bytes())) {
            Some(Ok(v)) => {
                let parsed = parse_record(&String::from_utf8_lossy(&v));
                if parsed.is_none() {
                    tracing::warn!(domain, "malformed domains cdb row skipped");
                }
                parsed.map(Arc::new)
            }
            Some(Err(e)) => {
                tracing::error!(domain, error = %e, "domains cdb read failed");
                return None;
            }
            None => None,
        };
        let mut cache = self.cache.lock().expect("cache lock");
        if self.max_cached > 0 {
            if cache.len() >= self.max_cached {
                // Any entry will do: hot domains come straight back on their next lookup.
                if let Some(k) = cache.keys().next().cloned() {
                    cache.remove(&k);
                }
            }
            cache.insert(domain.to_string(), rec.clone());
        }
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(s: &str) -> DomainRecord {
        parse_record(s).unwrap()
    }

    #[test]
    fn parse_and_resolve() {
        let r = rec("1234|O/i=5000,O/o=1000,D/i=1000,D/o=400,A/i=500,A/o=200,Alice@/o=7");
        assert_eq!(r.org_id, 1234);
        let cases: &[(Level, Flow, &str, Option<u64>)] = &[
            (Level::A, Flow::Out, "me", Some(200)),
            (Level::A, Flow::Out, "alice", Some(7)),
            (Level::A, Flow::Out, "ALICE", Some(7)),
            (Level::A, Flow::In, "alice", Some(500)),
            (Level::D, Flow::In, "alice", Some(1000)),
            (Level::D, Flow::Out, "x", Some(400)),
            (Level::O, Flow::In, "x", Some(5000)),
            (Level::O, Flow::Out, "x", Some(1000)),
        ];
        for (level, flow, local, want) in cases {
            assert_eq!(
                r.limit(*level, *flow, local),
                *want,
                "{level:?} {flow:?} {local}"
            );
        }
    }

    #[test]
    fn unlimited_and_malformed() {
        let cases: &[(&str, Option<(u64, usize)>)] = &[
            ("1|", Some((1, 0))),
            ("1", Some((1, 0))),
            (
                "7|A/o=x,D/i=,=5,O/q=3,A/o=-1,garbage,B/o=3,A/o=10",
                Some((7, 1)),
            ),
            ("7|a@b@/o=3,@/o=4", Some((7, 0))),
            ("x|A/o=1", None),
            ("", None),
        ];
        for (input, want) in cases {
            let got = parse_record(input).map(|r| (r.org_id, r.limits.len()));
            assert_eq!(got, *want, "{input}");
        }
        let r = rec("7|D/o=3");
        assert_eq!(r.limit(Level::A, Flow::Out, "a"), None);
        assert_eq!(r.limit(Level::O, Flow::In, "a"), None);
    }

    #[test]
    fn limits_map_format() {
        let r = rec("1|o/i=10,A/o=100,a/i=500,bob@/o=3");
        assert_eq!(r.limits_map(), "{A/i=500, A/o=100, bob@/o=3, O/i=10}");
    }

    #[test]
    fn lookup_through_a_real_cdb() {
        let dir = std::env::temp_dir().join(format!("mc-domains-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.cdb");
        migadu_counters_testkit::write_cdb(
            &path,
            &[("example.com", "1234|A/o=2"), ("bad.example", "nope|A/o=1")],
        );
        let d = Domains::open(&path, 1).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.lookup("example.com").unwrap().org_id, 1234);
        assert!(d.lookup("gmail.com").is_none());
        assert!(d.lookup("bad.example").is_none());
        // again, through the one-entry cache that evicts
        assert_eq!(
            d.lookup("example.com")
                .unwrap()
                .limit(Level::A, Flow::Out, "x"),
            Some(2)
        );
        migadu_counters_testkit::write_cdb(&dir.join("empty.cdb"), &[]);
        let empty = Domains::open(&dir.join("empty.cdb"), 10).unwrap();
        assert!(empty.is_empty() && empty.lookup("example.com").is_none());
        std::fs::write(dir.join("broken.cdb"), b"short").unwrap();
        assert!(Domains::open(&dir.join("broken.cdb"), 10).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The dispatcher's settings: `[pepsi-dispatch]` and one pool per `[stage-*]` section that
//! names a PROGRAM. Read once per configuration load; pure, no I/O.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pepsi_conf::config::{Config, ConfigError};

/// `HOLD_FORWARD` when the file does not set it: a Maildir pool's capacity as shipped.
pub const DEFAULT_HOLD_FORWARD: usize = 32;

/// The most `HOLD_FORWARD` may be: the held rows are ids in the dispatcher's memory, and a
/// stage that far behind is served better from the queue, in its claim order.
pub const MAX_HOLD_FORWARD: usize = 10_000;

/// `[pepsi-dispatch]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchOptions {
    /// Safety-net heartbeat: claim even without a notification this often.
    pub poll_interval: Duration,
    /// How fast a sender's lead over the least-served sender halves.
    pub fair_half_life: Duration,
    /// Share of claimed slots that stay oldest-first, so no row starves.
    pub fair_fifo_percent: u32,
    /// At most this many distinct senders are ranked per stage and claim.
    pub fair_max_senders: u32,
    /// Statistics are flushed at least this often while work flows.
    pub stats_interval: Duration,
    /// When the pipeline goes idle, statistics are flushed, but not sooner than this after
    /// the last flush: at a light, steady load the workers fall idle after nearly every
    /// message, and a flush each time would be a transaction per message.
    pub stats_idle_interval: Duration,
    /// A stage whose PROGRAM cannot start is not tried again before this.
    pub spawn_cooldown: Duration,
    /// How long shutdown waits for workers to finish the messages they hold.
    pub shutdown_grace: Duration,
    /// How often orphaned bodies and old clone tokens are swept.
    pub gc_interval: Duration,
    /// A running row no worker holds and unchanged this long is returned to pending (checked
    /// on every heartbeat): a hand-back or a failure report that could not be written, a
    /// claim whose reply was lost across a PostgreSQL restart.
    pub orphan_grace: Duration,
    /// How often the queue tables are vacuumed while rows move (zero: never, autovacuum
    /// alone). Every claim, advance and finish leaves a dead row version behind, and the
    /// claim's index probes walk them until a VACUUM removes them.
    pub vacuum_interval: Duration,
    /// The heartbeat on the session holding the dispatcher lock (and how often a standby
    /// tries the lock); a lost session (a PostgreSQL restart, a killed backend) is taken
    /// again or, when another dispatcher has the lock meanwhile, this one kills its workers
    /// and exits. At most a quarter of `lock_session_timeout`.
    pub lock_check_interval: Duration,
    /// The server ends the lock session after this long without a heartbeat (a dispatcher
    /// hung, stopped or cut off), which frees the lock for a standby; the dispatcher itself
    /// kills its workers and exits once its heartbeat has failed for this long.
    pub lock_session_timeout: Duration,
    /// A second dispatcher waits for the lock and takes over (yes), or exits at once naming
    /// the one that holds it (no). MODE single only.
    pub standby: bool,
    /// single: one active dispatcher per database, others stand by; shared: one per host,
    /// all claiming (docs/ha.md).
    pub mode: Mode,
    /// MODE shared: whether a pool's PARALLELISM counts per host or across all live
    /// dispatchers (each then runs its share, rounded up).
    pub parallelism_scope: Scope,
    /// Rows an earlier dispatcher claimed wait its longest MAX_RUNTIME plus this before a
    /// dispatcher that took over returns them to pending (unless that one is known dead on
    /// this host: then at once). At least 5s.
    pub takeover_margin: Duration,
    /// Where relative PROGRAM names are looked for first (default: the dispatcher's own
    /// directory, then PATH).
    pub libexec_dir: Option<PathBuf>,
    /// Workers leave an advanced row running at its next stage and name the stage on their
    /// status line; the dispatcher hands it to that stage's pool without a claim.
    pub hand_forward: bool,
    /// Rows handed forward to a stage without room wait in the dispatcher, at most this many
    /// a stage, for the next worker of that stage with room, while none waits there as
    /// pending; beyond it (and with 0) they go back to pending.
    pub hold_forward: usize,
    /// `[pepsi] MAIL_LOG_RETENTION`: mail log rows older than this are deleted at each
    /// garbage collection (default 30 days, at least an hour).
    pub mail_log_retention: Duration,
}

impl DispatchOptions {
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        let s = cfg.section("pepsi-dispatch");
        let lock_session_timeout = s
            .parse_opt("LOCK_SESSION_TIMEOUT", |v| {
                pepsi_conf::config::parse_duration(v)
                    .ok()
                    .filter(|d| *d >= Duration::from_secs(1) && *d <= Duration::from_secs(3600))
                    .ok_or_else(|| "a duration from 1s to 1h".to_owned())
            })?
            .unwrap_or(Duration::from_secs(5));
        Ok(Self {
            poll_interval: s
                .duration_opt("POLL_INTERVAL")?
                .unwrap_or(Duration::from_secs(5)),
            fair_half_life: s
                .duration_opt("FAIR_HALF_LIFE")?
                .unwrap_or(Duration::from_secs(60)),
            fair_fifo_percent: s
                .number_opt::<u32>("FAIR_FIFO_PERCENT")?
                .unwrap_or(20)
                .min(100),
            fair_max_senders: s.number_opt("FAIR_MAX_SENDERS")?.unwrap_or(256),
            stats_idle_interval: s
                .duration_opt("STATS_IDLE_INTERVAL")?
                .unwrap_or(Duration::from_secs(1)),
            stats_interval: s
                .duration_opt("STATS_INTERVAL")?
                .unwrap_or(Duration::from_secs(5)),
            spawn_cooldown: s
                .duration_opt("SPAWN_COOLDOWN")?
                .unwrap_or(Duration::from_secs(10)),
            shutdown_grace: s
                .duration_opt("SHUTDOWN_GRACE")?
                .unwrap_or(Duration::from_secs(10)),
            gc_interval: s
                .duration_opt("GC_INTERVAL")?
                .unwrap_or(Duration::from_secs(300)),
            orphan_grace: s
                .duration_opt("ORPHAN_GRACE")?
                .unwrap_or(Duration::from_secs(60)),
            vacuum_interval: s
                .duration_opt("VACUUM_INTERVAL")?
                .unwrap_or(Duration::from_secs(10)),
            lock_session_timeout,
            lock_check_interval: s
                .parse_opt("LOCK_CHECK_INTERVAL", |v| {
                    pepsi_conf::config::parse_duration(v)
                        .ok()
                        .filter(|d| {
                            *d >= Duration::from_millis(50) && *d * 4 <= lock_session_timeout
                        })
                        .ok_or_else(|| {
                            format!(
                                "a duration from 50ms to a quarter of LOCK_SESSION_TIMEOUT ({lock_session_timeout:?})"
                            )
                        })
                })?
                .unwrap_or_else(|| Duration::from_millis(250).min(lock_session_timeout / 4)),
            standby: s.bool_opt("STANDBY")?.unwrap_or(true),
            mode: match s.choice_opt("MODE", &["single", "shared"])?.as_deref() {
                Some("shared") => Mode::Shared,
                _ => Mode::Single,
            },
            parallelism_scope: match s.choice_opt("PARALLELISM_SCOPE", &["host", "global"])?.as_deref() {
                Some("global") => Scope::Global,
                _ => Scope::Host,
            },
            takeover_margin: s
                .parse_opt("TAKEOVER_MARGIN", |v| {
                    pepsi_conf::config::parse_duration(v)
                        .ok()
                        .filter(|d| *d >= Duration::from_secs(5))
                        .ok_or_else(|| "a duration of at least 5s".to_owned())
                })?
                .unwrap_or(Duration::from_secs(30)),
            libexec_dir: s.path_opt("LIBEXEC_DIR")?,
            hand_forward: s.bool_opt("HAND_FORWARD")?.unwrap_or(true),
            hold_forward: s
                .parse_opt("HOLD_FORWARD", |v| {
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n <= MAX_HOLD_FORWARD)
                        .ok_or_else(|| format!("a whole number of rows from 0 to {MAX_HOLD_FORWARD}"))
                })?
                .unwrap_or(DEFAULT_HOLD_FORWARD),
            mail_log_retention: cfg
                .section("pepsi")
                .parse_opt("MAIL_LOG_RETENTION", |v| {
                    pepsi_conf::config::parse_duration(v)
                        .ok()
                        .filter(|d| *d >= Duration::from_secs(3600))
                        .ok_or_else(|| "a duration of at least 1h (30d, 720h)".to_owned())
                })?
                .unwrap_or(Duration::from_secs(30 * 86400)),
        })
    }
}

/// How dispatchers share a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One active; a takeover fences the one before.
    Single,
    /// One per host, all claiming disjoint rows; a leader does the maintenance.
    Shared,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Shared => "shared",
        }
    }
}

/// What PARALLELISM counts in MODE shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Workers of this host.
    Host,
    /// Workers of all live dispatchers together.
    Global,
}

/// A pool's PARALLELISM on this host: all of it, or (scope global) its share among
/// `members` live dispatchers, this one being the `rank`-th to have registered: an equal
/// part each, the remainder one apiece to the earliest. The parts add up to PARALLELISM
/// (a host may get none).
pub fn local_parallelism(
    parallelism: usize,
    scope: Scope,
    (members, rank): (usize, usize),
) -> usize {
    match scope {
        Scope::Host => parallelism,
        Scope::Global => {
            let members = members.max(1);
            parallelism / members + usize::from(rank < parallelism % members)
        }
    }
}

/// One stage's pool settings, from `[stage-<name>]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOptions {
    pub stage: String,
    /// The PROGRAM option as written.
    pub program: String,
    /// Most worker processes at once.
    pub parallelism: usize,
    /// Ids pipelined to one worker at once.
    pub queue_limit: usize,
    /// A worker is replaced after handling this many messages (0: never).
    pub max_messages: u64,
    /// A worker without work for this long is stopped.
    pub idle_timeout: Duration,
    /// A message a worker has not answered within this is failed as `timeout`.
    pub max_runtime: Duration,
}

impl PoolOptions {
    pub fn from_config(cfg: &Config, stage: &str) -> Result<Self, ConfigError> {
        let s = cfg.stage_section_named(stage);
        Ok(Self {
            stage: stage.to_owned(),
            program: s.string("PROGRAM")?,
            parallelism: s.number_opt::<usize>("PARALLELISM")?.unwrap_or(1).max(1),
            queue_limit: s.number_opt::<usize>("QUEUE_LIMIT")?.unwrap_or(1).max(1),
            max_messages: s.number_opt("MAX_MESSAGES")?.unwrap_or(10_000),
            idle_timeout: s
                .duration_opt("WORKER_IDLE_TIMEOUT")?
                .unwrap_or(Duration::from_secs(60)),
            max_runtime: s
                .duration_opt("MAX_RUNTIME")?
                .unwrap_or(pepsi_contract::stage::DEFAULT_MAX_RUNTIME),
        })
    }

    /// Every stage section of `cfg` that names a PROGRAM.
    pub fn all(cfg: &Config) -> Result<Vec<Self>, ConfigError> {
        let mut pools = Vec::new();
        for stage in cfg.stage_names() {
            if cfg.stage_section(&stage).has("PROGRAM") {
                pools.push(Self::from_config(cfg, &stage.to_ascii_lowercase())?);
            }
        }
        pools.sort_by(|a, b| a.stage.cmp(&b.stage));
        Ok(pools)
    }
}

/// Resolves a PROGRAM to an executable path: absolute paths as they are; a bare name in
/// `libexec_dir`, then beside the dispatcher's own executable, then on PATH.
pub fn resolve_program(
    program: &str,
    libexec_dir: Option<&Path>,
    own_dir: Option<&Path>,
) -> PathBuf {
    let path = Path::new(program);
    if path.is_absolute() || program.contains('/') {
        return path.to_path_buf();
    }
    for dir in [libexec_dir, own_dir].into_iter().flatten() {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return candidate;
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "dispatch.conf").unwrap()
    }

    #[test]
    fn a_global_parallelism_is_shared_among_the_live_dispatchers() {
        let cases = [
            (6, Scope::Host, (3, 2), 6),
            (6, Scope::Global, (3, 0), 2),
            (6, Scope::Global, (3, 2), 2),
            (7, Scope::Global, (3, 0), 3),
            (7, Scope::Global, (3, 1), 2),
            (7, Scope::Global, (3, 2), 2),
            (1, Scope::Global, (3, 0), 1),
            (1, Scope::Global, (3, 1), 0),
            (4, Scope::Global, (0, 0), 4),
            (4, Scope::Global, (1, 0), 4),
        ];
        for (parallelism, scope, members, want) in cases {
            assert_eq!(
                local_parallelism(parallelism, scope, members),
                want,
                "{parallelism} {scope:?} {members:?}"
            );
        }
        // However many members, the parts add up to the whole.
        for members in 1..6 {
            for parallelism in 0..12 {
                let sum: usize = (0..members)
                    .map(|rank| local_parallelism(parallelism, Scope::Global, (members, rank)))
                    .sum();
                assert_eq!(sum, parallelism, "{parallelism} over {members}");
            }
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let c = cfg("[stage-init]\nPROGRAM = pepsi-stage-discard\n\
                     [stage-b]\nPROGRAM = x\nPARALLELISM = 3\nQUEUE_LIMIT = 8\nMAX_MESSAGES = 0\n\
                     WORKER_IDLE_TIMEOUT = 2s\nMAX_RUNTIME = 1m\n[stage-nothing]\nNEXT_STAGE = b\n\
                     [pepsi-dispatch]\nPOLL_INTERVAL = 250ms\nFAIR_FIFO_PERCENT = 150\n");
        let pools = PoolOptions::all(&c).unwrap();
        assert_eq!(
            pools.iter().map(|p| p.stage.as_str()).collect::<Vec<_>>(),
            ["b", "init"]
        );
        assert_eq!(
            pools[0],
            PoolOptions {
                stage: "b".into(),
                program: "x".into(),
                parallelism: 3,
                queue_limit: 8,
                max_messages: 0,
                idle_timeout: Duration::from_secs(2),
                max_runtime: Duration::from_secs(60),
            }
        );
        assert_eq!(
            (
                pools[1].parallelism,
                pools[1].queue_limit,
                pools[1].max_messages
            ),
            (1, 1, 10_000)
        );
        let d = DispatchOptions::from_config(&c).unwrap();
        assert_eq!(d.poll_interval, Duration::from_millis(250));
        assert_eq!(d.fair_fifo_percent, 100, "clamped");
    }

    #[test]
    fn hold_forward_takes_a_bounded_count_of_rows() {
        let cases: [(&str, Result<usize, &str>); 6] = [
            ("", Ok(DEFAULT_HOLD_FORWARD)),
            ("HOLD_FORWARD = 0\n", Ok(0)),
            ("HOLD_FORWARD = 10000\n", Ok(10_000)),
            ("HOLD_FORWARD = 10001\n", Err("10001")),
            ("HOLD_FORWARD = -1\n", Err("-1")),
            ("HOLD_FORWARD = some\n", Err("some")),
        ];
        for (line, want) in cases {
            let c = cfg(&format!(
                "[stage-init]\nPROGRAM = x\n[pepsi-dispatch]\n{line}"
            ));
            match (DispatchOptions::from_config(&c), want) {
                (Ok(d), Ok(n)) => assert_eq!(d.hold_forward, n, "{line}"),
                (Err(e), Err(bad)) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("HOLD_FORWARD") && e.contains(bad) && e.contains("0 to 10000"),
                        "{line}: {e}"
                    );
                }
                (got, want) => panic!("{line}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_bad_value_names_the_stage_section() {
        let c = cfg("[stage-a]\nPROGRAM = x\nPARALLELISM = lots\n");
        let e = PoolOptions::all(&c).unwrap_err().to_string();
        assert!(
            e.contains("[stage-a] PARALLELISM") && e.contains("lots"),
            "{e}"
        );
    }

    #[test]
    fn programs_resolve_beside_the_dispatcher_then_on_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pepsi-stage-x"), "").unwrap();
        let own = Some(dir.path());
        assert_eq!(
            resolve_program("pepsi-stage-x", None, own),
            dir.path().join("pepsi-stage-x")
        );
        assert_eq!(
            resolve_program("pepsi-stage-y", None, own),
            PathBuf::from("pepsi-stage-y")
        );
        assert_eq!(
            resolve_program("/opt/p", None, own),
            PathBuf::from("/opt/p")
        );
        assert_eq!(
            resolve_program("pepsi-stage-x", Some(Path::new("/nonexistent")), own),
            dir.path().join("pepsi-stage-x")
        );
    }
}

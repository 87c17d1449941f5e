//! pepsi-stage-dot-forward: sends mail for system accounts where their `~/.forward` says.
//!
//! Reads: the envelope, the header block (`Load::Headers`: its `Delivered-To` fields are the
//! loop guard), `state.dsn` and `state.dot_forward`, and the `.forward` of each recipient in
//! `DOMAINS`
//! through `pepsi-helper-dot-forward`, the setuid-root co-process that reads it as the
//! account (this program is setgid to the one group that may run it). Writes: the header
//! block (one `Delivered-To: <recipient>` in front), `rcpt_to`, `state.dsn` (each new
//! recipient's ORCPT names the original one) and `state.dot_forward`. Terminal helpers:
//! `advance` when nobody forwards; `split_off_each` first when several recipients share a
//! row and some forward (each forwarding one gets a row of its own, as its `Delivered-To`
//! must be in its copies only); `reroute_recipients` to `FORWARD_STAGE` for a forward;
//! `reroute` to `BOUNCE_STAGE` with 5.4.6 for a loop (the recipient's account is already in
//! a `Delivered-To`) or a message forwarded `MAX_HOPS` times.
//!
//! The file's grammar is `forward_file`'s and the decision `plan`'s, both pure; this file is
//! the I/O around them. The forwarded copy keeps its envelope sender; the `remote` stage of
//! the graph rewrites it with SRS on the way out, like any forward.

pub mod forward_file;
pub mod helper;
pub mod plan;

use std::process::ExitCode;
use std::time::Duration;

use pepsi_conf::address::{Address, normalize_domain};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::message;
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Bounce, BounceKind, DotForward, Dsn, KeptCopy};
use pepsi_helper_dot_forward::protocol::{Reply, valid_account};
use serde_json::Map;

use forward_file::Forward;
use helper::{CoProcess, HelperArgs};
use plan::Plan;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-dot-forward",
        exec: "pepsi-stage-dot-forward",
    };
    pub const PROGRAM: &str = "pepsi-stage-dot-forward";
    /// The reader, found beside this program unless `HELPER` names another.
    pub const DEFAULT_HELPER: &str = "pepsi-helper-dot-forward";
}

/// Where forwarded addresses start unless `FORWARD_STAGE` says otherwise: alias expansion,
/// then routing, so a target may be an alias, a local mailbox or a remote address.
pub const DEFAULT_FORWARD_STAGE: &str = "aliases";
/// How many targets and kept copies one `.forward` may name unless `MAX_ADDRESSES` says.
pub const DEFAULT_MAX_ADDRESSES: usize = 64;
/// How many forwards (`Delivered-To` fields) a message may take unless `MAX_HOPS` says.
pub const DEFAULT_MAX_HOPS: usize = 20;

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `FORWARD_STAGE`: where the forwarded copy starts.
    pub forward_stage: String,
    /// `MAX_ADDRESSES`: targets and kept copies per file.
    pub max_addresses: usize,
    /// `MAX_HOPS`: a message with this many `Delivered-To` fields is not forwarded again.
    pub max_hops: usize,
    /// `DOMAINS` (required): the domains whose addresses are system accounts.
    pub domains: Vec<String>,
    /// `HELPER`, `MIN_UID`.
    pub helper: HelperArgs,
    /// `HELPER_TIMEOUT`.
    pub helper_timeout: Duration,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let forward_stage = cfg
            .stage_target(stage, "FORWARD_STAGE", Some(DEFAULT_FORWARD_STAGE))?
            .unwrap_or_default();
        let max_addresses = s
            .parse_opt("MAX_ADDRESSES", |v| match v.trim().parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err("a whole number from 1 to 1000".to_owned()),
            })?
            .unwrap_or(DEFAULT_MAX_ADDRESSES);
        let max_hops = s
            .parse_opt("MAX_HOPS", |v| match v.trim().parse::<usize>() {
                Ok(n) if (1..=100).contains(&n) => Ok(n),
                _ => Err("a whole number from 1 to 100".to_owned()),
            })?
            .unwrap_or(DEFAULT_MAX_HOPS);
        // Required: on a host with several domains a system account must not receive (and
        // forward) the mail of every one of them by default.
        let domains = s
            .list_opt("DOMAINS")?
            .filter(|l| !l.is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: [stage-{stage}] DOMAINS is missing: the domains whose addresses are \
                     system accounts (e.g. DOMAINS = example.org)",
                    cfg.file().display()
                )
            })?
            .iter()
            .map(|d| {
                normalize_domain(d).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: [stage-{stage}] DOMAINS: {d:?} is not a domain name",
                        cfg.file().display()
                    )
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let min_uid = s
            .parse_opt("MIN_UID", |v| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| "a uid (a whole number)".to_owned())
            })?
            .unwrap_or(pepsi_helper_dot_forward::reader::DEFAULT_MIN_UID);
        let program = s
            .string_opt("HELPER")?
            .unwrap_or_else(|| constants::DEFAULT_HELPER.into());
        Ok(Options {
            forward_stage,
            max_addresses,
            max_hops,
            domains,
            helper: HelperArgs {
                program: pepsi_conf::cli::locate_program(&program),
                min_uid,
            },
            helper_timeout: s
                .duration_opt("HELPER_TIMEOUT")?
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_secs(1)),
        })
    }
}

/// The stage: the local domains, and the reader shared by its passes.
pub struct DotForwardStage {
    local: LocalRecipients,
    helper: tokio::sync::Mutex<Option<CoProcess>>,
}

impl DotForwardStage {
    /// The system account `address` reaches: its local part, extension removed and lower
    /// case, when its domain is one of `DOMAINS` and the name is one the reader takes.
    fn account(&self, s: &Options, address: &str) -> Option<String> {
        let (user, domain) = Address::parse(&self.local.mailbox_key(address))
            .ok()?
            .into_parts();
        (s.domains.contains(&domain) && valid_account(&user)).then_some(user)
    }

    /// What loops are found by: the account an address reaches, else its mailbox (an
    /// account name has no `@`, so the two never meet).
    fn key(&self, s: &Options, address: &str) -> String {
        let address = address.trim().trim_start_matches('<').trim_end_matches('>');
        self.account(s, address)
            .unwrap_or_else(|| self.local.mailbox_key(address))
    }

    /// `account`'s `.forward`, as stored; `None` when there is none to use.
    async fn read(&self, s: &Options, account: &str) -> Result<Option<Vec<u8>>, StageError> {
        let mut slot = self.helper.lock().await;
        if slot.as_ref().is_some_and(|h| h.args != s.helper)
            && let Some(h) = slot.take()
        {
            h.kill().await;
        }
        if slot.is_none() {
            *slot = Some(
                CoProcess::start(s.helper.clone())
                    .map_err(|e| StageError::Temporary(format!(".forward reader: {e}")))?,
            );
        }
        let h = slot.as_mut().expect("started above");
        match h.forward(account, s.helper_timeout).await {
            Ok(Reply::File(bytes)) => Ok(Some(bytes)),
            Ok(Reply::None(why)) => {
                tracing::debug!(%account, "no .forward: {why}");
                Ok(None)
            }
            Ok(Reply::Unsafe(why)) => {
                tracing::warn!(%account, ".forward ignored: {why}");
                Ok(None)
            }
            Ok(Reply::Temp { status, text }) => Err(StageError::Temporary(format!(
                ".forward of {account}: {status} {text}"
            ))),
            Err(e) => {
                let program = h.args.program.display().to_string();
                if let Some(h) = slot.take() {
                    h.kill().await;
                }
                tracing::error!(".forward reader {program} failed: {e}; it will be restarted");
                Err(StageError::Temporary(format!(
                    ".forward reader {program} failed: {e}"
                )))
            }
        }
    }

    /// Each recipient's effective `.forward`: `None` for a recipient that is no account here,
    /// has none (or one that changes nothing), or is a copy an earlier `\name` kept that has
    /// not been forwarded on since (`hops`: the message's `Delivered-To` count now).
    async fn forwards(
        &self,
        s: &Options,
        ctx: &StageContext<'_>,
        kept: &[KeptCopy],
        hops: usize,
    ) -> Result<Vec<Option<Forward>>, StageError> {
        let rcpts = ctx.rcpt_to();
        let mut out = Vec::with_capacity(rcpts.len());
        for r in rcpts {
            let Some(account) = self.account(s, r) else {
                out.push(None);
                continue;
            };
            if kept
                .iter()
                .any(|k| k.hops == hops && self.key(s, &k.address) == account)
            {
                out.push(None);
                continue;
            }
            let Some(bytes) = self.read(s, &account).await? else {
                out.push(None);
                continue;
            };
            let f = forward_file::parse(&bytes, r, s.max_addresses);
            for (entry, why) in &f.ignored {
                tracing::warn!(id = ctx.id(), %account, %entry, ".forward entry ignored: {why}");
            }
            out.push(plan::effective(f, &account, &|a| self.key(s, a)));
        }
        Ok(out)
    }

    /// Returns the message to its sender through BOUNCE_STAGE with 5.4.6 and `diagnostic`.
    fn bounce(ctx: &StageContext<'_>, diagnostic: String) -> Result<Terminal, StageError> {
        let target = ctx
            .options()
            .bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(ctx.options().name.to_string()))?;
        tracing::warn!(id = ctx.id(), rcpt = ?ctx.rcpt_to(), "{diagnostic}: returned to sender");
        let mut merge = Map::new();
        Bounce {
            diagnostic: Some(diagnostic),
            enhanced_status: Some("5.4.6".into()),
            ..Bounce::new(BounceKind::Permanent).stage(&ctx.options().name)
        }
        .insert_into(&mut merge);
        ctx.reroute(&target, merge)
    }
}

impl Stage for DotForwardStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // A pass is a local file read through the reader, milliseconds: a worker batches the ids
    // waiting for it (one SELECT, one commit for the round).
    const BATCH: bool = true;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
            helper: tokio::sync::Mutex::new(None),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE for what is delivered here, and FORWARD_STAGE (default `aliases`) where a
    /// forwarded copy starts.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        let forward = d
            .option("FORWARD_STAGE")
            .unwrap_or_else(|| DEFAULT_FORWARD_STAGE.to_owned());
        d.branch("FORWARD_STAGE", forward, "forward");
    }

    async fn process(
        &self,
        s: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let mut record = DotForward::from_state(ctx.state())?.unwrap_or_default();
        let delivered: Vec<String> = message::field_values(ctx.headers()?, "Delivered-To")
            .iter()
            .map(|d| self.key(s, d))
            .collect();
        let hops = delivered.len();
        let mut forwards = self.forwards(s, ctx, &record.kept, hops).await?;
        let keys = |ctx: &StageContext<'_>| -> Vec<String> {
            ctx.rcpt_to().iter().map(|r| self.key(s, r)).collect()
        };
        let mut decision = plan::plan(&keys(ctx), &forwards, &delivered, s.max_hops);
        if let Plan::Split { alone } = &decision {
            let ids = ctx.split_off_each(alone).await?;
            tracing::info!(id = ctx.id(), rows = ?ids, "forwarding recipients moved to rows of their own");
            forwards = (0..forwards.len())
                .filter(|i| !alone.contains(i))
                .map(|i| forwards[i].take())
                .collect();
            decision = plan::plan(&keys(ctx), &forwards, &delivered, s.max_hops);
        }
        match decision {
            Plan::Advance => ctx.advance(),
            Plan::Split { .. } => Err(StageError::Invalid(
                "a row split for .forward was split again".into(),
            )),
            Plan::Loop => {
                let rcpt = ctx.rcpt_to()[0].clone();
                Self::bounce(ctx, format!("mail forwarding loop for {rcpt}"))
            }
            Plan::TooManyHops => Self::bounce(
                ctx,
                format!("too many forwarding hops ({hops}, MAX_HOPS {})", s.max_hops),
            ),
            Plan::Forward { rcpt_to, kept } => {
                let source = ctx.rcpt_to()[0].clone();
                let dsn =
                    plan::forwarded_dsn(Dsn::from_state(ctx.state())?, &source, rcpt_to.len());
                let headers = plan::with_delivered_to(ctx.headers()?, &source);
                ctx.set_headers(headers);
                record.forwarded.push(source.clone());
                // The copy now has one Delivered-To more: that is the count a kept copy
                // comes back with while nobody forwarded it on.
                record.kept.extend(kept.into_iter().map(|address| KeptCopy {
                    address,
                    hops: hops + 1,
                }));
                let mut merge = Map::new();
                dsn.insert_into(&mut merge);
                record.insert_into(&mut merge);
                tracing::info!(id = ctx.id(), from = %source, to = ?rcpt_to, "forwarded by .forward");
                ctx.reroute_recipients(&s.forward_stage, rcpt_to, merge)
            }
        }
    }
}

const ABOUT: &str = "\
Pepsi stage that forwards mail for system accounts as their ~/.forward says

For each recipient in one of DOMAINS whose local part, extension removed, is a system account \
with a uid of at least MIN_UID, the stage asks pepsi-helper-dot-forward (its \
setuid-root co-process, which reads the file as the account and ignores one that is a \
symbolic link, not a regular file, owned by someone else or writable by others) for \
~/.forward. Entries are separated by commas or line breaks, `#` starts a comment line: an \
address (a bare name means that name in the recipient's domain) receives the message; \
`\\name` keeps a copy for that address here, not forwarded again. `|command`, `/file` and \
`:include:` entries are not carried out and are logged as ignored. A file with nothing to do \
leaves the recipient as it is.

A forwarded copy gets `Delivered-To: <recipient>` in front of its header and starts again at \
FORWARD_STAGE with the new recipients (each new recipient's DSN ORCPT names the original \
one); its envelope sender is kept, and the graph's remote stage rewrites it with SRS on its \
way out. A recipient whose account is already named in a Delivered-To field (with any \
extension, in any of DOMAINS) is a forwarding loop, and a message with MAX_HOPS Delivered-To \
fields goes no further: either is returned to its sender through BOUNCE_STAGE with 5.4.6. A \
file naming its own account (alice+lists, say) keeps a copy rather than forwarding to \
itself. Several recipients of one message, some forwarding, are first split onto rows of \
their own.

Options of [stage-<name>]:
  DOMAINS         (required) the domains whose addresses are system accounts
  FORWARD_STAGE   aliases   where forwarded copies start (must be a stage)
  MIN_UID         1000      accounts below it have no .forward (root never has); the
                            reader's system configuration may only raise it
  MAX_ADDRESSES   64        targets and kept copies one file may name (1-1000)
  MAX_HOPS        20        forwards one message may take (1-100)
  HELPER          pepsi-helper-dot-forward, beside this program
  HELPER_TIMEOUT  10s       how long one answer of the reader may take
  NEXT_STAGE, BOUNCE_STAGE  as for every stage

See docs/dot-forward.md.";

/// The command line of `pepsi-stage-dot-forward`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-dot-forward` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<DotForwardStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: &str) -> Config {
        Config::from_str_named(t, "f.conf").unwrap()
    }

    #[test]
    fn settings_table() {
        let s = Options::from_config(
            &cfg("[stage-aliases]\nPROGRAM = x\n[stage-fwd]\nDOMAINS = example.test\n"),
            "fwd",
        )
        .unwrap();
        assert_eq!(s.forward_stage, "aliases");
        assert_eq!(s.max_addresses, DEFAULT_MAX_ADDRESSES);
        assert_eq!(s.max_hops, DEFAULT_MAX_HOPS);
        assert_eq!(s.domains, ["example.test"]);
        assert_eq!(s.helper.min_uid, 1000);
        assert_eq!(s.helper_timeout, Duration::from_secs(10));
        let s = Options::from_config(
            // A quoted target with spaces is the stage the graph draws (`Declare::option` trims).
            &cfg(
                "[stage-in]\nPROGRAM = x\n[stage-fwd]\nFORWARD_STAGE = \" in \"\n\
                  DOMAINS = Example.TEST, b.test\nMIN_UID = 500\nMAX_ADDRESSES = 3\n\
                  MAX_HOPS = 5\nHELPER = /opt/reader\n",
            ),
            "fwd",
        )
        .unwrap();
        assert_eq!(s.forward_stage, "in");
        assert_eq!(s.domains, ["example.test", "b.test"]);
        assert_eq!(s.helper.min_uid, 500);
        assert_eq!((s.max_addresses, s.max_hops), (3, 5));
        assert_eq!(s.helper.program, std::path::PathBuf::from("/opt/reader"));
        for (bad, says) in [
            ("FORWARD_STAGE = nowhere\n", "no [stage-nowhere]"),
            ("MAX_ADDRESSES = 0\n", "MAX_ADDRESSES"),
            ("MAX_HOPS = 101\n", "MAX_HOPS"),
            ("MIN_UID = -1\n", "MIN_UID"),
            ("DOMAINS = \n", "DOMAINS is missing"),
        ] {
            let domains = if bad.starts_with("DOMAINS") {
                ""
            } else {
                "DOMAINS = example.test\n"
            };
            let e = Options::from_config(
                &cfg(&format!(
                    "[stage-aliases]\nPROGRAM = x\n[stage-fwd]\n{domains}{bad}"
                )),
                "fwd",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(says) && e.contains("f.conf"), "{bad}: {e}");
        }
    }

    /// Loops are found per account: an extension, another of DOMAINS or angle brackets
    /// change nothing; an address outside DOMAINS is its mailbox.
    #[test]
    fn keys_name_the_account() {
        let stage = DotForwardStage::build(&cfg(
            "[pepsi]\nLOCAL_DOMAINS = a.test, b.test, c.test\nRECIPIENT_DELIMITER = +\n",
        ))
        .unwrap();
        let s = Options::from_config(
            &cfg("[stage-aliases]\nPROGRAM = x\n[stage-fwd]\nDOMAINS = a.test, b.test\n"),
            "fwd",
        )
        .unwrap();
        for (address, key) in [
            ("alice@a.test", "alice"),
            ("Alice+lists@A.TEST", "alice"),
            ("<alice@b.test>", "alice"),
            (" alice+x@b.test ", "alice"),
            ("alice@c.test", "alice@c.test"),
            ("Bob+x@example.org", "bob@example.org"),
            ("-rf@a.test", "-rf@a.test"),
        ] {
            assert_eq!(stage.key(&s, address), key, "{address}");
        }
        assert_eq!(
            stage.account(&s, "alice+x@a.test").as_deref(),
            Some("alice")
        );
        assert_eq!(stage.account(&s, "alice@c.test"), None);
    }
}

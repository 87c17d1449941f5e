//! pepsi-stage-dot-forward: sends mail for system accounts where their `~/.forward` says.
//!
//! Reads: the envelope, the header block (`Load::Headers`: its `Delivered-To` fields are the
//! loop guard), `state.dsn` and `state.dot_forward`, and each local recipient's `.forward`
//! through `pepsi-helper-dot-forward`, the setuid-root co-process that reads it as the
//! account (this program is setgid to the one group that may run it). Writes: the header
//! block (one `Delivered-To: <recipient>` in front), `rcpt_to`, `state.dsn` (each new
//! recipient's ORCPT names the original one) and `state.dot_forward`. Terminal helpers:
//! `advance` when nobody forwards; `fan_out` first when several recipients share a row and
//! some forward (each forwarding one gets a row of its own, as its `Delivered-To` must be
//! in its copies only); `reroute_recipients` to `FORWARD_STAGE` for a forward; `reroute` to
//! `BOUNCE_STAGE` with 5.4.6 for a loop (the recipient is already in a `Delivered-To`).
//!
//! The file's grammar is `forward_file`'s and the decision `plan`'s, both pure; this file is
//! the I/O around them. The forwarded copy keeps its envelope sender; the `remote` stage of
//! the graph rewrites it with SRS on the way out, like any forward.

pub mod forward_file;
pub mod helper;
pub mod plan;

use std::process::ExitCode;
use std::time::Duration;

use pepsi_common::config::Config;
use pepsi_common::local::{LocalRecipients, address_key, normalize_domain, split_address};
use pepsi_common::message;
use pepsi_common::stage::{
    FanGroup, FanRecipients, Load, Stage, StageContext, StageError, Terminal,
};
use pepsi_common::state::{Bounce, BounceKind, DotForward, Dsn};
use pepsi_helper_dot_forward::protocol::{Reply, valid_account};
use serde_json::Map;

use forward_file::Forward;
use helper::{CoProcess, HelperArgs};
use plan::Plan;

pub mod constants {
    use pepsi_common::config::ConfigSource;

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

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `FORWARD_STAGE`: where the forwarded copy starts.
    pub forward_stage: String,
    /// `MAX_ADDRESSES`: targets and kept copies per file.
    pub max_addresses: usize,
    /// `DOMAINS`: the local domains whose addresses are system accounts; `None`: every
    /// local domain.
    pub domains: Option<Vec<String>>,
    /// `HELPER`, `MIN_UID`.
    pub helper: HelperArgs,
    /// `HELPER_TIMEOUT`.
    pub helper_timeout: Duration,
}

impl Settings {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Settings> {
        let s = cfg.section(&format!("stage-{stage}"));
        let forward_stage = s
            .string_opt("FORWARD_STAGE")?
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_FORWARD_STAGE.to_owned());
        if !cfg.has_section(&format!("stage-{forward_stage}")) {
            anyhow::bail!(
                "{}: [stage-{stage}] FORWARD_STAGE = {forward_stage}: there is no [stage-{forward_stage}]",
                cfg.file().display()
            );
        }
        let max_addresses = s
            .parse_opt("MAX_ADDRESSES", |v| match v.trim().parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err("a whole number from 1 to 1000".to_owned()),
            })?
            .unwrap_or(DEFAULT_MAX_ADDRESSES);
        let domains = match s.list_opt("DOMAINS")? {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|d| {
                        normalize_domain(d).ok_or_else(|| {
                            anyhow::anyhow!(
                                "{}: [stage-{stage}] DOMAINS: {d:?} is not a domain name",
                                cfg.file().display()
                            )
                        })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?,
            ),
        };
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
        Ok(Settings {
            forward_stage,
            max_addresses,
            domains,
            helper: HelperArgs {
                program: pepsi_common::cli::locate_program(&program),
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
    /// Each recipient's account name, or `None` when its address is not a system account
    /// here (not local, not in `DOMAINS`, or not a name the reader takes).
    async fn accounts(
        &self,
        s: &Settings,
        pool: &sqlx::PgPool,
        rcpts: &[String],
    ) -> Result<Vec<Option<String>>, StageError> {
        let local = self
            .local
            .recipients_local(pool, rcpts)
            .await
            .map_err(StageError::Database)?;
        Ok(rcpts
            .iter()
            .zip(local)
            .map(|(r, is_local)| {
                let (user, domain) = split_address(&self.local.mailbox_key(r))?;
                let wanted =
                    is_local && s.domains.as_ref().is_none_or(|list| list.contains(&domain));
                (wanted && valid_account(&user)).then_some(user)
            })
            .collect())
    }

    /// `account`'s `.forward`, as stored; `None` when there is none to use.
    async fn read(&self, s: &Settings, account: &str) -> Result<Option<Vec<u8>>, StageError> {
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

    /// Each recipient's effective `.forward`: `None` for a recipient that is no account, has
    /// none, or was kept here by an earlier `\name`.
    async fn forwards(
        &self,
        s: &Settings,
        ctx: &StageContext<'_>,
        kept: &[String],
    ) -> Result<Vec<Option<Forward>>, StageError> {
        let rcpts = ctx.rcpt_to();
        let accounts = self.accounts(s, ctx.pool(), rcpts).await?;
        let mut out = Vec::with_capacity(rcpts.len());
        for (r, account) in rcpts.iter().zip(accounts) {
            let Some(account) = account else {
                out.push(None);
                continue;
            };
            if kept.iter().any(|k| address_key(k) == address_key(r)) {
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
            out.push((!f.is_noop(r)).then_some(f));
        }
        Ok(out)
    }
}

impl Stage for DotForwardStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // A pass is a local file read through the reader, milliseconds: a worker batches the ids
    // waiting for it (one SELECT, one commit for the round).
    const BATCH: bool = true;
    type Section = Settings;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
            helper: tokio::sync::Mutex::new(None),
        })
    }

    fn section(&self, cfg: &Config, name: &str) -> anyhow::Result<Settings> {
        Settings::from_config(cfg, name)
    }

    async fn process(
        &self,
        s: &Settings,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let mut record = DotForward::from_state(ctx.state())?.unwrap_or_default();
        let mut forwards = self.forwards(s, ctx, &record.kept).await?;
        let delivered_to = message::field_values(ctx.headers()?, "Delivered-To");
        let mut decision = plan::plan(ctx.rcpt_to(), &forwards, &delivered_to);
        if let Plan::Split { keep, alone } = &decision {
            let stage = ctx.stage().to_owned();
            let groups: Vec<FanGroup> = alone
                .iter()
                .map(|&i| FanGroup::new(FanRecipients::Indices(vec![i]), stage.clone()))
                .collect();
            let ids = ctx.fan_out(keep, &groups).await?;
            tracing::info!(id = ctx.id(), rows = ?ids, "forwarding recipients moved to rows of their own");
            forwards = keep.iter().map(|&i| forwards[i].take()).collect();
            decision = plan::plan(ctx.rcpt_to(), &forwards, &delivered_to);
        }
        match decision {
            Plan::Advance => ctx.advance(),
            Plan::Split { .. } => Err(StageError::Invalid(
                "a row split for .forward was split again".into(),
            )),
            Plan::Loop => {
                let rcpt = ctx.rcpt_to()[0].clone();
                let target = ctx
                    .settings()
                    .bounce_stage
                    .clone()
                    .ok_or_else(|| StageError::NoBounceStage(ctx.settings().name.clone()))?;
                tracing::warn!(id = ctx.id(), %rcpt, "mail forwarding loop: returned to sender");
                let mut merge = Map::new();
                Bounce {
                    diagnostic: Some(format!("mail forwarding loop for {rcpt}")),
                    enhanced_status: Some("5.4.6".into()),
                    ..Bounce::new(BounceKind::Permanent).stage(&ctx.settings().name)
                }
                .insert_into(&mut merge);
                ctx.reroute(&target, merge)
            }
            Plan::Forward { rcpt_to, kept } => {
                let source = ctx.rcpt_to()[0].clone();
                let dsn =
                    plan::forwarded_dsn(Dsn::from_state(ctx.state())?, &source, rcpt_to.len());
                let headers = plan::with_delivered_to(ctx.headers()?, &source);
                ctx.set_headers(headers);
                record.forwarded.push(source.clone());
                for k in kept {
                    if !record
                        .kept
                        .iter()
                        .any(|x| address_key(x) == address_key(&k))
                    {
                        record.kept.push(k);
                    }
                }
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

For each recipient in a local domain (or in DOMAINS) whose local part, extension removed, is \
a system account with a uid of at least MIN_UID, the stage asks pepsi-helper-dot-forward (its \
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
way out. A recipient already named in a Delivered-To field is a forwarding loop: the \
message is returned to its sender through BOUNCE_STAGE with 5.4.6. Several recipients of \
one message, some forwarding, are first split onto rows of their own.

Options of [stage-<name>]:
  FORWARD_STAGE   aliases   where forwarded copies start (must be a stage)
  DOMAINS         (all local domains) the domains whose addresses are system accounts
  MIN_UID         1000      accounts below it have no .forward (root never has); the
                            reader's system configuration may only raise it
  MAX_ADDRESSES   64        targets and kept copies one file may name (1-1000)
  HELPER          pepsi-helper-dot-forward, beside this program
  HELPER_TIMEOUT  10s       how long one answer of the reader may take
  NEXT_STAGE, BOUNCE_STAGE  as for every stage

See docs/dot-forward.md.";

/// The command line of `pepsi-stage-dot-forward`: its `--help` and its manual page.
pub fn command() -> pepsi_common::cli::Command {
    pepsi_common::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-dot-forward` binary.
pub fn run() -> ExitCode {
    pepsi_common::stage::main::<DotForwardStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_table() {
        let cfg = |t: &str| Config::from_str_named(t, "f.conf").unwrap();
        let s = Settings::from_config(&cfg("[stage-aliases]\nPROGRAM = x\n[stage-fwd]\n"), "fwd")
            .unwrap();
        assert_eq!(s.forward_stage, "aliases");
        assert_eq!(s.max_addresses, DEFAULT_MAX_ADDRESSES);
        assert_eq!(s.domains, None);
        assert_eq!(s.helper.min_uid, 1000);
        assert_eq!(s.helper_timeout, Duration::from_secs(10));
        let s = Settings::from_config(
            &cfg("[stage-in]\nPROGRAM = x\n[stage-fwd]\nFORWARD_STAGE = in\nDOMAINS = Example.TEST, b.test\nMIN_UID = 500\nMAX_ADDRESSES = 3\nHELPER = /opt/reader\n"),
            "fwd",
        )
        .unwrap();
        assert_eq!(s.forward_stage, "in");
        assert_eq!(
            s.domains,
            Some(vec!["example.test".into(), "b.test".into()])
        );
        assert_eq!(s.helper.min_uid, 500);
        assert_eq!(s.max_addresses, 3);
        assert_eq!(s.helper.program, std::path::PathBuf::from("/opt/reader"));
        for (bad, says) in [
            ("FORWARD_STAGE = nowhere\n", "no [stage-nowhere]"),
            ("MAX_ADDRESSES = 0\n", "MAX_ADDRESSES"),
            ("MIN_UID = -1\n", "MIN_UID"),
        ] {
            let e = Settings::from_config(
                &cfg(&format!("[stage-aliases]\nPROGRAM = x\n[stage-fwd]\n{bad}")),
                "fwd",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(says) && e.contains("f.conf"), "{bad}: {e}");
        }
    }
}

//! pepsi-stage-check-whitelist: per-mailbox trusted senders. On arrival it records, for the
//! message's recipients, which of them trust the sender the message shows (its `From:`
//! address, or that address's domain); on authenticated mail it learns: the login that sent
//! it (never the envelope sender) comes to trust each address it writes to.
//!
//! Reads: the envelope, `auth_user`, the header block (`Load::Headers`) and
//! `pepsi.whitelist` (one query per message that has a `From:` address and pairs of mailbox
//! and sender the round has not looked up yet). Writes:
//! `state.whitelist` (`docs/state.md`): `sender` (the `From:` address checked, lower case),
//! `trusted` (the recipients' mailboxes whose list holds it: extension removed, lower case), `all` (every recipient does, and there
//! is one), and on learning `learned` (how many addresses the sender's list gained or
//! confirmed). Side effect: the learning upsert, committed before the pass's own commit (a
//! pass run again confirms the same entries). Terminal helper: `advance`, always: the
//! verdict is for `if` and later stages to branch on.
//!
//! The decisions (what is checked, what is learnt, the verdict) are [`plan`]'s, pure; this
//! file's stage is the I/O around them.

use std::cell::RefCell;
use std::process::ExitCode;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::message;
use pepsi_contract::stage::{Load, RoundMemo, Stage, StageContext, StageError, Terminal};
use serde_json::Map;

pub mod plan;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-check-whitelist",
        exec: "pepsi-stage-check-whitelist",
    };
    pub const PROGRAM: &str = "pepsi-stage-check-whitelist";
}

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `LEARN` (default yes): authenticated mail teaches the sending mailbox its recipients.
    pub learn: bool,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        Ok(Options {
            learn: s.bool_opt("LEARN")?.unwrap_or(true),
        })
    }
}

const LOOKUP: &str = "SELECT mailbox, sender FROM pepsi.whitelist \
     WHERE mailbox = ANY($1) AND sender = ANY($2)";

// Learning confirms an entry of either origin and never turns an owner's into a learnt one.
const LEARN: &str = "INSERT INTO pepsi.whitelist (mailbox, sender, origin) \
     SELECT $1, s, 'sent' FROM unnest($2::text[]) AS s \
     ON CONFLICT (mailbox, sender) DO UPDATE SET seen_at = now()";

/// The stage: the extension delimiters that make a recipient's mailbox (`[pepsi]
/// RECIPIENT_DELIMITER`), and what the round's passes have looked up.
#[derive(Debug)]
pub struct WhitelistStage {
    local: LocalRecipients,
    /// Whether each (mailbox, sender key) pair looked up since the last commit is listed: a
    /// round of messages between the same people looks each pair up once. Forgotten at every
    /// commit (`before_commit`), after `RoundMemo::MEMORY` in any case, and when a pass learns.
    round: RefCell<Round>,
}

/// Whether each (mailbox, sender key) pair is listed, as the round looked it up.
type Round = RoundMemo<(String, String), bool>;

/// The listed pairs among `mailboxes` × `keys`, or `None` when the round does not know one
/// of them.
fn answer(
    round: &mut Round,
    mailboxes: &[String],
    keys: &[String],
) -> Option<Vec<(String, String)>> {
    let mut found = Vec::new();
    for m in mailboxes {
        for k in keys {
            let pair = (m.clone(), k.clone());
            if *round.get(&pair)? {
                found.push(pair);
            }
        }
    }
    Some(found)
}

/// Records the answer of a lookup of `mailboxes` × `keys` that found `found`.
fn remember(round: &mut Round, mailboxes: &[String], keys: &[String], found: &[(String, String)]) {
    for m in mailboxes {
        for k in keys {
            let listed = found.iter().any(|(fm, fk)| fm == m && fk == k);
            round.insert((m.clone(), k.clone()), listed);
        }
    }
}

impl Stage for WhitelistStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // Local work (one lookup, one upsert): its passes batch.
    const BATCH: bool = true;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
            round: RefCell::default(),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let from = message::from_addresses(ctx.headers()?);
        let mailboxes = plan::mailboxes(ctx.rcpt_to(), &self.local);
        let mut record = pepsi_contract::state::Whitelist::default();
        if options.learn
            && let Some(learning) =
                plan::learning(ctx.auth_user(), ctx.mail_from(), ctx.rcpt_to(), &self.local)
        {
            sqlx::query(LEARN)
                .bind(&learning.mailbox)
                .bind(&learning.senders)
                .execute(ctx.pool())
                .await?;
            record.learned = Some(learning.senders.len());
            // What the round knew may have changed.
            self.round.borrow_mut().clear();
        }
        if let Some(check) = plan::check(from.first().map(String::as_str)) {
            let keys = check.keys();
            let known = {
                let mut round = self.round.borrow_mut();
                round.expire();
                answer(&mut round, &mailboxes, &keys)
            };
            let found = match known {
                Some(found) => found,
                None => {
                    let found: Vec<(String, String)> = sqlx::query_as(LOOKUP)
                        .bind(&mailboxes)
                        .bind(&keys)
                        .fetch_all(ctx.pool())
                        .await?;
                    remember(&mut self.round.borrow_mut(), &mailboxes, &keys, &found);
                    found
                }
            };
            let verdict = plan::verdict(&mailboxes, &found);
            record.sender = Some(check.address);
            record.trusted = Some(verdict.trusted);
            record.all = Some(verdict.all);
        }
        let mut merge = Map::new();
        record.insert_into(&mut merge);
        ctx.merge_state(merge);
        ctx.advance()
    }

    /// The round's answers are forgotten: the next round reads the lists afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str = "Record which recipients trust the message's sender (its From: address or \
domain, in pepsi.whitelist) in state.whitelist, and teach an authenticated sender's mailbox \
the addresses it writes to. Options of [stage-NAME]: NEXT_STAGE, LEARN (yes). See \
docs/whitelist.md.";

/// The command line of `pepsi-stage-check-whitelist`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-check-whitelist` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<WhitelistStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_answers_only_what_it_looked_up() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut r = Round::default();
        let (a, b) = (v(&["a@x.test"]), v(&["a@x.test", "b@x.test"]));
        let keys = v(&["bob@y.org", "@y.org"]);
        assert_eq!(answer(&mut r, &a, &keys), None);
        remember(&mut r, &a, &keys, &[("a@x.test".into(), "@y.org".into())]);
        assert_eq!(
            answer(&mut r, &a, &keys),
            Some(vec![("a@x.test".into(), "@y.org".into())])
        );
        // b was never asked about: not known, so the pass looks it up.
        assert_eq!(answer(&mut r, &b, &keys), None);
        remember(&mut r, &b, &keys, &[]);
        assert_eq!(answer(&mut r, &a, &keys), Some(vec![]));
        r.clear();
        assert_eq!(answer(&mut r, &a, &keys), None);
    }

    #[test]
    fn settings_table() {
        let cfg = |t: &str| Config::from_str_named(t, "w.conf").unwrap();
        for (text, learn) in [
            ("[stage-w]\n", Some(true)),
            ("[stage-w]\nLEARN = no\n", Some(false)),
            ("[stage-w]\nLEARN = maybe\n", None),
        ] {
            let got = Options::from_config(&cfg(text), "w").ok().map(|s| s.learn);
            assert_eq!(got, learn, "{text}");
        }
        let e = Options::from_config(&cfg("[stage-w]\nLEARN = maybe\n"), "w")
            .unwrap_err()
            .to_string();
        assert!(e.contains("LEARN"), "{e}");
    }
}

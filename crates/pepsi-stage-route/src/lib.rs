//! pepsi-stage-route: sends each recipient on the route of its domain, splitting a message
//! whose recipients go different ways into one row per route.
//!
//! Routes, most specific first: `ROUTES` (`domain:stage` items; `.example.org` matches the
//! subdomains of example.org), then `ROUTE_LOCAL` for recipients in local domains
//! (`pepsi_contract::local`), then `ROUTE_REMOTE`; both default to `NEXT_STAGE`.
//!
//! Reads: the envelope (`Load::Metadata`) and the local domains. Writes: nothing but the
//! split. Terminal helper: `advance_to` the route of the first recipient; the recipients of
//! each other route go first to a sibling row with `split_off_recipients` (which subsets
//! `state.dsn.rcpt` in lockstep and keeps the message's `received_at`).

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::bail;
use pepsi_conf::address::{Address, normalize_domain};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::stage::edges::{Declare, NEXT_STAGE};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-route",
        exec: "pepsi-stage-route",
    };
    pub const PROGRAM: &str = "pepsi-stage-route";
}

/// One `[stage-<name>]` section's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    /// Exact domains (normalized) → stage.
    pub domains: HashMap<String, String>,
    /// Parent domains whose subdomains route to a stage (`.example.org` → `example.org`).
    pub subdomains: Vec<(String, String)>,
    pub local: String,
    pub remote: String,
}

/// Parses `ROUTES`: `domain:stage` items (the list is split at commas and spaces).
pub fn parse_routes(items: &[String]) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|item| {
            let (domain, stage) = item
                .rsplit_once(':')
                .filter(|(d, s)| !d.is_empty() && !s.is_empty())
                .ok_or_else(|| format!("`domain:stage` items; {item:?} is not one"))?;
            let sub = domain.starts_with('.');
            let d = normalize_domain(domain.trim_start_matches('.'))
                .ok_or_else(|| format!("`domain:stage` items; {domain:?} is not a domain"))?;
            Ok((if sub { format!(".{d}") } else { d }, stage.to_owned()))
        })
        .collect()
}

impl Routes {
    /// Reads `ROUTES`, `ROUTE_LOCAL` and `ROUTE_REMOTE` of `[stage-<stage>]`; every stage
    /// named must have a section.
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Self> {
        let s = cfg.stage_section_named(stage);
        let next = s.string_opt("NEXT_STAGE")?.filter(|v| !v.is_empty());
        let pick = |option: &str| -> anyhow::Result<String> {
            match s
                .string_opt(option)?
                .filter(|v| !v.is_empty())
                .or(next.clone())
            {
                Some(v) => Ok(v),
                None => bail!("[stage-{stage}] needs {option} or NEXT_STAGE"),
            }
        };
        let local = pick("ROUTE_LOCAL")?;
        let remote = pick("ROUTE_REMOTE")?;
        let items = s
            .parse_opt("ROUTES", |v| parse_routes(&split_list(v)))?
            .unwrap_or_default();
        let mut routes = Routes {
            domains: HashMap::new(),
            subdomains: Vec::new(),
            local,
            remote,
        };
        for (domain, target) in items {
            match domain.strip_prefix('.') {
                Some(parent) => routes.subdomains.push((parent.to_owned(), target)),
                None => {
                    routes.domains.insert(domain, target);
                }
            }
        }
        // The longest parent first, so a.b.example wins over b.example.
        routes
            .subdomains
            .sort_by_key(|(d, _)| std::cmp::Reverse(d.len()));
        let targets = routes
            .domains
            .values()
            .chain(routes.subdomains.iter().map(|(_, t)| t))
            .chain([&routes.local, &routes.remote]);
        for target in targets {
            if cfg.stage(target).is_none() {
                bail!(
                    "[stage-{stage}] routes to {target:?}, which has no [stage-{target}] section"
                );
            }
        }
        Ok(routes)
    }

    /// The per-domain route of `domain` (normalized), if any.
    pub fn domain_route(&self, domain: &str) -> Option<&str> {
        if let Some(stage) = self.domains.get(domain) {
            return Some(stage);
        }
        self.subdomains
            .iter()
            .find(|(parent, _)| {
                domain.len() > parent.len()
                    && domain.ends_with(parent.as_str())
                    && domain.as_bytes()[domain.len() - parent.len() - 1] == b'.'
            })
            .map(|(_, stage)| stage.as_str())
    }

    /// The stage for a recipient in `domain` (None: not an address), local or not.
    pub fn route(&self, domain: Option<&str>, local: bool) -> &str {
        if let Some(stage) = domain.and_then(|d| self.domain_route(d)) {
            return stage;
        }
        if local { &self.local } else { &self.remote }
    }
}

fn split_list(v: &str) -> Vec<String> {
    v.split([',', ' ', '\t'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Recipients grouped by stage, in the order each stage first appears: (stage, indices).
pub fn group(stages: &[&str]) -> Vec<(String, Vec<usize>)> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, stage) in stages.iter().enumerate() {
        match groups.iter_mut().find(|(s, _)| s == stage) {
            Some((_, idx)) => idx.push(i),
            None => groups.push(((*stage).to_owned(), vec![i])),
        }
    }
    groups
}

/// The route program: the local domains (each stage's `Routes` is its section).
#[derive(Debug, Clone)]
pub struct Route {
    pub local: LocalRecipients,
}

impl Stage for Route {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = Routes;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Routes> {
        Routes::from_config(cfg, name)
    }

    /// ROUTE_LOCAL and ROUTE_REMOTE (NEXT_STAGE where one is unset), and the stage of each
    /// ROUTES item, labelled by its domain.
    fn edges(d: &mut Declare<'_>) {
        let next = d.option(NEXT_STAGE);
        for (option, label) in [("ROUTE_LOCAL", "local"), ("ROUTE_REMOTE", "remote")] {
            match d.option(option) {
                Some(t) => d.branch(option, t, label),
                None => match &next {
                    Some(t) => d.branch(NEXT_STAGE, t.clone(), label),
                    None => d.problem(format_args!("needs {option} or NEXT_STAGE")),
                },
            }
        }
        let routes = d.option("ROUTES");
        for item in routes.as_deref().map(split_list).unwrap_or_default() {
            match item.rsplit_once(':') {
                Some((domain, target)) if !domain.is_empty() && !target.is_empty() => {
                    d.branch("ROUTES", target, &domain.to_ascii_lowercase())
                }
                _ => d.problem(format_args!(
                    "ROUTES: {item:?} is not a `domain:stage` item"
                )),
            }
        }
    }

    async fn process(
        &self,
        routes: &Routes,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let rcpts = ctx.rcpt_to().to_vec();
        let domains: Vec<Option<String>> = rcpts
            .iter()
            .map(|r| Address::parse(r).ok().map(|a| a.domain().to_owned()))
            .collect();
        // Locality is asked only for recipients no per-domain route claims.
        let unclaimed: Vec<String> = domains
            .iter()
            .flatten()
            .filter(|d| routes.domain_route(d).is_none())
            .cloned()
            .collect();
        let local = self
            .local
            .local_domains_among(ctx.pool(), &unclaimed)
            .await
            .map_err(StageError::Database)?;
        let stages: Vec<&str> = domains
            .iter()
            .map(|d| routes.route(d.as_deref(), d.as_ref().is_some_and(|d| local.contains(d))))
            .collect();
        let groups = group(&stages);
        // Split off every group but the first; `remaining` maps the row's current
        // positions back to the original indices.
        let mut remaining: Vec<usize> = (0..rcpts.len()).collect();
        for (stage, indices) in &groups[1..] {
            let positions: Vec<usize> = remaining
                .iter()
                .enumerate()
                .filter(|(_, orig)| indices.contains(orig))
                .map(|(pos, _)| pos)
                .collect();
            let sibling = ctx.split_off_recipients(&positions, stage).await?;
            remaining.retain(|orig| !indices.contains(orig));
            tracing::info!(id = ctx.id(), sibling, to = %stage, rcpt = ?indices.iter().map(|&i| &rcpts[i]).collect::<Vec<_>>(), "recipients routed");
        }
        let first = groups.first().map(|(s, _)| s.clone()).ok_or_else(|| {
            StageError::Permanent(format!("row {} has no recipients to route", ctx.id()))
        })?;
        ctx.advance_to(&first)
    }
}

const ABOUT: &str = "Pepsi stage that routes recipients by domain (local, remote, per-domain), splitting the message";

/// The command line of `pepsi-stage-route`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-route` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Route>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "test.conf").unwrap()
    }

    const BASE: &str = "[stage-local]\nPROGRAM = x\n[stage-remote]\nPROGRAM = x\n[stage-vip]\nPROGRAM = x\n[stage-sub]\nPROGRAM = x\n";

    #[test]
    fn route_table() {
        let r = Routes::from_config(
            &cfg(&format!(
                "{BASE}[stage-r]\nPROGRAM = pepsi-stage-route\nROUTE_LOCAL = local\nNEXT_STAGE = remote\n\
                 ROUTES = VIP.example:vip, .sub.example:sub .a.sub.example:vip\n"
            )),
            "r",
        )
        .unwrap();
        let cases = [
            (Some("vip.example"), false, "vip"),
            (Some("vip.example"), true, "vip"),
            (Some("x.sub.example"), false, "sub"),
            (Some("b.a.sub.example"), false, "vip"),
            (Some("sub.example"), true, "local"),
            (Some("notsub.example"), false, "remote"),
            (Some("example.test"), true, "local"),
            (Some("example.org"), false, "remote"),
            (None, false, "remote"),
        ];
        for (domain, local, expected) in cases {
            assert_eq!(r.route(domain, local), expected, "{domain:?} {local}");
        }
    }

    #[test]
    fn grouping_keeps_first_appearance_order() {
        assert_eq!(
            group(&["remote", "local", "remote", "vip"]),
            vec![
                ("remote".to_owned(), vec![0, 2]),
                ("local".to_owned(), vec![1]),
                ("vip".to_owned(), vec![3]),
            ]
        );
        assert_eq!(group(&["a", "a"]), vec![("a".to_owned(), vec![0, 1])]);
    }

    #[test]
    fn configuration_errors() {
        let check = |section: &str, needle: &str| {
            let err =
                Routes::from_config(&cfg(&format!("{BASE}[stage-r]\n{section}")), "r").unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{section}: {err:#}");
        };
        check("ROUTE_LOCAL = local\n", "needs ROUTE_REMOTE or NEXT_STAGE");
        check(
            "NEXT_STAGE = remote\nROUTE_LOCAL = nowhere\n",
            "routes to \"nowhere\", which has no [stage-nowhere] section",
        );
        check(
            "NEXT_STAGE = remote\nROUTES = example.org\n",
            "test.conf:11: [stage-r] ROUTES = \"example.org\": expected `domain:stage` items",
        );
    }
}

//! The `features` task, decided without I/O: each optional feature is a run of stages
//! (vacation, whitelist, language detection and blocking, a milter, encryption) switched into
//! the path or out of it by editing `NEXT_STAGE`, never by deleting a section, so that
//! switching a feature off and on again gives back the same file.
//!
//! The rule. A run is in the path when a stage outside it names its first stage in
//! `NEXT_STAGE`. Off: every such stage's `NEXT_STAGE` becomes the run's last stage's
//! `NEXT_STAGE`; the run's sections stay as they are, and their `NEXT_STAGE` remembers where
//! the run goes back. On: the one stage outside the run whose `NEXT_STAGE` is the run's last
//! `NEXT_STAGE` (among several, the one mail can reach) names the run's first stage again. A feature whose stages do not exist yet
//! is added where it belongs (the language run after the lists stage, the milter after the
//! entry stage, encryption in front of DKIM signing) with the options it needs. Nothing is
//! guessed: with no such stage or several, a run only partly there, a stage of the run named
//! by another option (a route's branch, a reply stage), or a section name already taken, the
//! task fails naming them.

use pepsi_conf::config::Config;
use pepsi_conf::config::edit::Edit;
use pepsi_setup_model::task::Features;

use super::programs::{
    BLOCK_LANGUAGE_PROGRAM, DETECT_LANGUAGE_PROGRAM, DKIM_PROGRAM, ENCRYPT_PROGRAM, LIST_PROGRAM,
    MILTER_PROGRAM, VACATION_PROGRAM, WHITELIST_PROGRAM,
};

/// The stage new mail starts at (the ingress's and pepsi-sendmail's).
const ENTRY_STAGE: &str = "init";
/// Where a stage the setup adds sends what it refuses, when the graph has it.
const BOUNCE_STAGE: &str = "bounce";

/// A `[stage-<name>]` section's PROGRAM and NEXT_STAGE, and every word of its other options:
/// a stage named there is reached some other way than NEXT_STAGE, and is not switched here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageLinks {
    /// The section, as written (`stage-whitelist`).
    pub section: String,
    /// The stage's name, lower-cased (`whitelist`).
    pub name: String,
    pub program: Option<String>,
    /// NEXT_STAGE, lower-cased.
    pub next: Option<String>,
    pub other_words: Vec<String>,
}

impl StageLinks {
    /// Every stage section of `cfg`, as the file writes it.
    pub fn of(cfg: &Config) -> Vec<StageLinks> {
        cfg.sections()
            .filter_map(|section| {
                let prefix = section.get(..6)?;
                if !prefix.eq_ignore_ascii_case("stage-") {
                    return None;
                }
                let other_words = cfg
                    .section(section)
                    .options()
                    .filter(|o| {
                        !o.eq_ignore_ascii_case("PROGRAM") && !o.eq_ignore_ascii_case("NEXT_STAGE")
                    })
                    .filter_map(|o| cfg.raw_value(section, o))
                    .flat_map(|v| {
                        v.split(|c: char| c.is_whitespace() || ",:;=".contains(c))
                            .filter(|w| !w.is_empty())
                            .map(str::to_ascii_lowercase)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                Some(StageLinks {
                    section: section.to_owned(),
                    name: section[6..].to_ascii_lowercase(),
                    program: cfg
                        .raw_value(section, "PROGRAM")
                        .map(|p| p.trim().to_owned()),
                    next: cfg
                        .raw_value(section, "NEXT_STAGE")
                        .map(|v| v.trim().to_ascii_lowercase()),
                    other_words,
                })
            })
            .collect()
    }
}

/// A stage a feature adds the first time it is switched on.
struct NewStage {
    name: &'static str,
    program: &'static str,
    /// Its options besides PROGRAM, NEXT_STAGE and BOUNCE_STAGE.
    options: Vec<(&'static str, String)>,
}

/// Where a feature's stages go when they are added.
enum Place {
    /// After the one stage running this program.
    After(&'static str),
    /// After the entry stage.
    AfterEntry,
    /// In front of the one stage running this program, after the one stage leading to it.
    Before(&'static str),
}

/// The edits of a `features` task over the graph `stages` (the file as it stands), each
/// feature in turn against the graph the ones before it left.
pub fn edits(stages: &[StageLinks], f: &Features) -> Result<Vec<Edit>, String> {
    let mut graph = Graph {
        stages: stages.to_vec(),
        edits: Vec::new(),
    };
    graph.switch("vacation", &[VACATION_PROGRAM], f.vacation)?;
    graph.switch("whitelist", &[WHITELIST_PROGRAM], f.whitelist)?;
    graph.feature(
        "language",
        vec![
            NewStage {
                name: "language",
                program: DETECT_LANGUAGE_PROGRAM,
                options: Vec::new(),
            },
            NewStage {
                name: "language-block",
                program: BLOCK_LANGUAGE_PROGRAM,
                options: Vec::new(),
            },
        ],
        Place::After(LIST_PROGRAM),
        f.language,
    )?;
    let milter = f.milter.clone().unwrap_or_default();
    let milter_there = graph.find("milter", MILTER_PROGRAM)?.is_some();
    graph.feature(
        "milter",
        vec![NewStage {
            name: "milter",
            program: MILTER_PROGRAM,
            options: vec![
                ("MILTER", milter.clone()),
                ("DOWN_ACTION", "tempfail".into()),
            ],
        }],
        Place::AfterEntry,
        f.milter.is_some(),
    )?;
    if f.milter.is_some() && milter_there {
        // Switched on again, possibly at another address.
        let section = graph.only("milter", MILTER_PROGRAM)?.section.clone();
        graph.edits.push(Edit::set(&section, "MILTER", milter));
    }
    graph.feature(
        "encryption",
        vec![NewStage {
            name: "encrypt",
            program: ENCRYPT_PROGRAM,
            // Signing needs the key-encryption key, which the setup does not make.
            options: vec![("SIGN", "no".into())],
        }],
        Place::Before(DKIM_PROGRAM),
        f.encryption,
    )?;
    Ok(graph.edits)
}

/// The stage graph as the edits so far leave it, and those edits.
struct Graph {
    stages: Vec<StageLinks>,
    edits: Vec<Edit>,
}

impl Graph {
    /// The one stage running `program`, if any.
    fn find(&self, feature: &str, program: &str) -> Result<Option<&StageLinks>, String> {
        let found: Vec<&StageLinks> = self
            .stages
            .iter()
            .filter(|s| s.program.as_deref() == Some(program))
            .collect();
        match found.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            many => Err(format!(
                "{feature}: more than one stage section runs {program} ({}): switch them by hand",
                sections(many)
            )),
        }
    }

    fn only(&self, feature: &str, program: &str) -> Result<&StageLinks, String> {
        self.find(feature, program)?.ok_or_else(|| {
            format!("{feature}: no stage section runs {program}; add one to pepsi.conf (docs/routing.md)")
        })
    }

    fn set_next(&mut self, index: usize, next: &str) {
        let stage = &mut self.stages[index];
        stage.next = Some(next.to_owned());
        self.edits
            .push(Edit::set(&stage.section, "NEXT_STAGE", next));
    }

    /// A feature that may have to be added: switched as [`Graph::switch`] when its stages
    /// exist, added at `place` when none does and it is to be on.
    fn feature(
        &mut self,
        feature: &str,
        stages: Vec<NewStage>,
        place: Place,
        on: bool,
    ) -> Result<(), String> {
        let programs: Vec<&str> = stages.iter().map(|s| s.program).collect();
        let mut present = Vec::new();
        for program in &programs {
            present.push(self.find(feature, program)?.is_some());
        }
        if present.iter().any(|p| *p) || !on {
            return self.switch(feature, &programs, on);
        }
        // Added: after `before`, in front of what `before` led to.
        let before = match place {
            Place::After(program) => self.only(feature, program)?.name.clone(),
            Place::AfterEntry => {
                if !self.stages.iter().any(|s| s.name == ENTRY_STAGE) {
                    return Err(format!(
                        "{feature}: there is no [stage-{ENTRY_STAGE}] to put it after"
                    ));
                }
                ENTRY_STAGE.to_owned()
            }
            Place::Before(program) => {
                let target = self.only(feature, program)?.name.clone();
                let leading: Vec<&StageLinks> = self
                    .stages
                    .iter()
                    .filter(|s| s.next.as_deref() == Some(target.as_str()))
                    .collect();
                match leading.as_slice() {
                    [one] => one.name.clone(),
                    [] => {
                        return Err(format!(
                            "{feature}: no stage's NEXT_STAGE is {target}, so there is no place in front of it"
                        ));
                    }
                    many => {
                        return Err(format!(
                            "{feature}: {target} is reached from each of {}: add it by hand",
                            sections(many)
                        ));
                    }
                }
            }
        };
        let index = self.stages.iter().position(|s| s.name == before).unwrap();
        let Some(after) = self.stages[index].next.clone() else {
            return Err(format!(
                "{feature}: [{}] has no NEXT_STAGE to put it in front of",
                self.stages[index].section
            ));
        };
        for stage in &stages {
            if let Some(taken) = self.stages.iter().find(|s| s.name == stage.name) {
                return Err(format!(
                    "{feature}: [{}] exists and runs {}: add the feature by hand",
                    taken.section,
                    taken.program.as_deref().unwrap_or("no program")
                ));
            }
        }
        let bounce = self.stages.iter().any(|s| s.name == BOUNCE_STAGE);
        for (i, stage) in stages.iter().enumerate() {
            let section = format!("stage-{}", stage.name);
            let next = stages.get(i + 1).map_or(after.as_str(), |s| s.name);
            self.edits
                .push(Edit::set(&section, "PROGRAM", stage.program));
            for (option, value) in &stage.options {
                self.edits.push(Edit::set(&section, option, value.clone()));
            }
            self.edits.push(Edit::set(&section, "NEXT_STAGE", next));
            if bounce {
                self.edits
                    .push(Edit::set(&section, "BOUNCE_STAGE", BOUNCE_STAGE));
            }
            self.stages.push(StageLinks {
                section,
                name: stage.name.to_owned(),
                program: Some(stage.program.to_owned()),
                next: Some(next.to_owned()),
                other_words: Vec::new(),
            });
        }
        self.set_next(index, stages[0].name);
        Ok(())
    }

    /// Switches the run of stages running `programs` (in path order) on or off by the rule
    /// of this module. None of them at all and off: nothing to do.
    fn switch(&mut self, feature: &str, programs: &[&str], on: bool) -> Result<(), String> {
        let mut run = Vec::new();
        let mut missing = Vec::new();
        for program in programs {
            match self.find(feature, program)? {
                Some(stage) => run.push(stage.name.clone()),
                None => missing.push(*program),
            }
        }
        match (run.is_empty(), missing.first()) {
            (_, None) => {}
            (true, Some(_)) if !on => return Ok(()),
            (true, Some(program)) => {
                return Err(format!(
                    "{feature}: no stage section runs {program}; add one to pepsi.conf (docs/routing.md)"
                ));
            }
            (false, Some(_)) => {
                return Err(format!(
                    "{feature}: only part of it is in pepsi.conf (no stage section runs {}): finish or remove it by hand",
                    missing.join(", ")
                ));
            }
        }
        for name in &run {
            if let Some(other) = self
                .stages
                .iter()
                .filter(|s| !run.contains(&s.name))
                .find(|s| s.other_words.iter().any(|w| w == name))
            {
                return Err(format!(
                    "{feature}: [stage-{name}] is also named by an option of [{}]: switch it by hand",
                    other.section
                ));
            }
        }
        let (first, last) = (&run[0], &run[run.len() - 1]);
        let last_stage = self.stages.iter().find(|s| &s.name == last).unwrap();
        let Some(next) = last_stage.next.clone() else {
            return Err(format!(
                "{feature}: [{}] has no NEXT_STAGE to send mail on to",
                last_stage.section
            ));
        };
        if !self.stages.iter().any(|s| s.name == next) {
            return Err(format!(
                "{feature}: [{}] NEXT_STAGE = {next} names no stage section",
                last_stage.section
            ));
        }
        let outside = |wanted: &str| -> Vec<usize> {
            self.stages
                .iter()
                .enumerate()
                .filter(|(_, s)| !run.contains(&s.name) && s.next.as_deref() == Some(wanted))
                .map(|(i, _)| i)
                .collect()
        };
        let leading_in = outside(first);
        if !on {
            for i in leading_in {
                self.set_next(i, &next);
            }
            return Ok(());
        }
        if !leading_in.is_empty() {
            return Ok(());
        }
        // Among several, a stage out of the path itself (another feature switched off) is no
        // place to go back after.
        let mut candidates = outside(&next);
        if candidates.len() > 1 {
            let reached: Vec<usize> = candidates
                .iter()
                .copied()
                .filter(|i| self.referenced(&self.stages[*i].name))
                .collect();
            if !reached.is_empty() {
                candidates = reached;
            }
        }
        match candidates.as_slice() {
            [one] => {
                let first = first.clone();
                self.set_next(*one, &first);
                Ok(())
            }
            [] => Err(format!(
                "{feature}: no stage's NEXT_STAGE is {next}, so there is no place to put [stage-{first}] back"
            )),
            many => {
                let many: Vec<&StageLinks> = many.iter().map(|i| &self.stages[*i]).collect();
                Err(format!(
                    "{feature}: [stage-{first}] could go back after any of {}: switch it in by hand",
                    sections(&many)
                ))
            }
        }
    }
}

impl Graph {
    /// Whether mail can reach the stage `name`: it is the entry stage, or another stage names
    /// it (in NEXT_STAGE, a branch, a reply stage).
    fn referenced(&self, name: &str) -> bool {
        name == ENTRY_STAGE
            || self.stages.iter().any(|s| {
                s.name != name
                    && (s.next.as_deref() == Some(name) || s.other_words.iter().any(|w| w == name))
            })
    }
}

fn sections(stages: &[&StageLinks]) -> String {
    stages
        .iter()
        .map(|s| format!("[{}]", s.section))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_conf::config::edit;

    fn features(vacation: bool, whitelist: bool) -> Features {
        Features {
            vacation,
            whitelist,
            language: false,
            milter: None,
            encryption: false,
        }
    }

    /// A graph's text and the features → the edits, or the start of why not.
    fn switched(text: &str, f: &Features) -> Result<Vec<String>, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        edits(&StageLinks::of(&cfg), f).map(|edits| edits.iter().map(|e| e.to_string()).collect())
    }

    /// `text` with `f`'s edits applied.
    fn applied(text: &str, f: &Features) -> String {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        edit::apply(text, &edits(&StageLinks::of(&cfg), f).unwrap()).unwrap()
    }

    const W: &str = "[stage-w]\nPROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = r\n";
    const R: &str = "[stage-r]\nPROGRAM = pepsi-stage-route\n";

    #[test]
    fn a_feature_stage_is_switched_by_its_predecessors_next_stage() {
        let on = format!("[stage-a]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = w\n{W}{R}");
        let off = format!("[stage-a]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = R\n{W}{R}");
        let cases: &[(&str, bool, &[&str])] = &[
            (&on, false, &["[stage-a] NEXT_STAGE = r"]),
            (&on, true, &[]),
            (&off, true, &["[stage-a] NEXT_STAGE = w"]),
            (&off, false, &[]),
            // No whitelist stage at all: off already.
            (R, false, &[]),
        ];
        for (text, whitelist, want) in cases {
            assert_eq!(
                switched(text, &features(false, *whitelist)).unwrap(),
                *want,
                "{text}"
            );
        }
        // Off with two before it: both skip it; then neither is guessed to take it back.
        let two = format!(
            "[stage-a]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = w\n\
             [stage-b]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = w\n{W}{R}"
        );
        assert_eq!(
            switched(&two, &features(false, false)).unwrap(),
            ["[stage-a] NEXT_STAGE = r", "[stage-b] NEXT_STAGE = r"]
        );
        let refused: &[(String, &str)] = &[
            (
                two.replace("NEXT_STAGE = w", "NEXT_STAGE = r"),
                "[stage-w] could go back after any of [stage-a], [stage-b]",
            ),
            (
                format!("{W}{R}"),
                "no stage's NEXT_STAGE is r, so there is no place to put [stage-w] back",
            ),
            (
                format!("{on}[stage-x]\nPROGRAM = pepsi-stage-route\nROUTES = local:w\n"),
                "[stage-w] is also named by an option of [stage-x]",
            ),
            (
                R.to_owned(),
                "no stage section runs pepsi-stage-check-whitelist; add one",
            ),
            (
                format!("{on}[stage-w2]\nPROGRAM = pepsi-stage-check-whitelist\n"),
                "more than one stage section runs pepsi-stage-check-whitelist ([stage-w], [stage-w2])",
            ),
            (
                "[stage-w]\nPROGRAM = pepsi-stage-check-whitelist\n".into(),
                "[stage-w] has no NEXT_STAGE",
            ),
            (
                "[stage-w]\nPROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = gone\n".into(),
                "[stage-w] NEXT_STAGE = gone names no stage section",
            ),
        ];
        for (text, want) in refused {
            let reason = switched(text, &features(false, true)).unwrap_err();
            assert!(reason.contains(want), "{text}: {reason}");
        }
    }

    /// A graph with a lists stage, an entry stage and DKIM signing, as the shipped one.
    const GRAPH: &str = "[stage-init]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = aliases\n\
        [stage-aliases]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = lists\n\
        [stage-lists]\nPROGRAM = pepsi-stage-list\nNEXT_STAGE = local\n\
        [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\n\
        [stage-remote]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = dkim\n\
        [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
        [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\n\
        [stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = init\n";

    #[test]
    fn language_milter_and_encryption_are_added_where_they_belong_then_switched() {
        let all = Features {
            vacation: false,
            whitelist: false,
            language: true,
            milter: Some("inet:127.0.0.1:11332".into()),
            encryption: true,
        };
        assert_eq!(
            switched(GRAPH, &all).unwrap(),
            [
                "[stage-language] PROGRAM = pepsi-stage-detect-language",
                "[stage-language] NEXT_STAGE = language-block",
                "[stage-language] BOUNCE_STAGE = bounce",
                "[stage-language-block] PROGRAM = pepsi-stage-block-language",
                "[stage-language-block] NEXT_STAGE = local",
                "[stage-language-block] BOUNCE_STAGE = bounce",
                "[stage-lists] NEXT_STAGE = language",
                "[stage-milter] PROGRAM = pepsi-stage-milter",
                "[stage-milter] MILTER = inet:127.0.0.1:11332",
                "[stage-milter] DOWN_ACTION = tempfail",
                "[stage-milter] NEXT_STAGE = aliases",
                "[stage-milter] BOUNCE_STAGE = bounce",
                "[stage-init] NEXT_STAGE = milter",
                "[stage-encrypt] PROGRAM = pepsi-stage-encrypt",
                "[stage-encrypt] SIGN = no",
                "[stage-encrypt] NEXT_STAGE = dkim",
                "[stage-encrypt] BOUNCE_STAGE = bounce",
                "[stage-remote] NEXT_STAGE = encrypt",
            ]
        );
        // Added, then off: each run leaves the path whole, its sections kept; on again: the
        // same file as when they were added, and a second time nothing changes.
        let added = applied(GRAPH, &all);
        let none = Features {
            language: false,
            milter: None,
            encryption: false,
            ..all.clone()
        };
        let off = applied(&added, &none);
        assert_eq!(
            switched(&off, &none).unwrap(),
            Vec::<String>::new(),
            "{off}"
        );
        let cfg = Config::from_str_named(&off, "t.conf").unwrap();
        let next = |stage: &str| {
            cfg.raw_value(&format!("stage-{stage}"), "NEXT_STAGE")
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            [
                next("lists"),
                next("init"),
                next("remote"),
                next("language")
            ],
            ["local", "aliases", "dkim", "language-block"]
        );
        let again = applied(&off, &all);
        assert_eq!(again, added);
        assert_eq!(
            switched(&again, &all).unwrap(),
            ["[stage-milter] MILTER = inet:127.0.0.1:11332"]
        );
        // Vacation and language off, then language on again: vacation, out of the path,
        // leads to local too but is no place to go back after.
        let with_vacation = format!(
            "{}[stage-vacation]\nPROGRAM = pepsi-stage-vacation\nNEXT_STAGE = local\n",
            GRAPH.replace(
                "[stage-lists]\nPROGRAM = pepsi-stage-list\nNEXT_STAGE = local",
                "[stage-lists]\nPROGRAM = pepsi-stage-list\nNEXT_STAGE = vacation"
            )
        );
        let both = applied(
            &with_vacation,
            &Features {
                vacation: true,
                ..all.clone()
            },
        );
        let neither = applied(
            &both,
            &Features {
                vacation: false,
                ..none.clone()
            },
        );
        let back = applied(
            &neither,
            &Features {
                vacation: false,
                ..all.clone()
            },
        );
        let cfg = Config::from_str_named(&back, "t.conf").unwrap();
        let next = |stage: &str| {
            cfg.raw_value(&format!("stage-{stage}"), "NEXT_STAGE")
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            [
                next("lists"),
                next("language"),
                next("language-block"),
                next("vacation")
            ],
            ["language", "language-block", "local", "local"]
        );
        // A milter at another address: the same stage, its MILTER changed.
        let moved = Features {
            milter: Some("unix:/run/rspamd/milter.sock".into()),
            ..all.clone()
        };
        assert_eq!(
            switched(&again, &moved).unwrap(),
            ["[stage-milter] MILTER = unix:/run/rspamd/milter.sock"]
        );
    }

    #[test]
    fn a_feature_that_cannot_be_placed_is_refused_naming_why() {
        let language = Features {
            language: true,
            ..features(false, false)
        };
        let encryption = Features {
            encryption: true,
            ..features(false, false)
        };
        let cases: &[(String, &Features, &str)] = &[
            (
                GRAPH.replace("pepsi-stage-list\n", "pepsi-stage-aliases\n"),
                &language,
                "language: no stage section runs pepsi-stage-list",
            ),
            (
                format!("{GRAPH}[stage-language]\nPROGRAM = pepsi-stage-route\n"),
                &language,
                "language: [stage-language] exists and runs pepsi-stage-route",
            ),
            (
                format!(
                    "{GRAPH}[stage-b]\nPROGRAM = pepsi-stage-block-language\nNEXT_STAGE = local\n"
                ),
                &language,
                "language: only part of it is in pepsi.conf",
            ),
            (
                format!("{GRAPH}[stage-other]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = dkim\n"),
                &encryption,
                "encryption: dkim is reached from each of [stage-other], [stage-remote]",
            ),
        ];
        for (text, f, want) in cases {
            let reason = switched(text, f).unwrap_err();
            assert!(reason.contains(want), "{want}: {reason}");
        }
    }

    #[test]
    fn the_shipped_graph_switches_vacation_and_whitelist_off_and_back_exactly() {
        let shipped = include_str!("../../../../etc/pepsi.conf");
        assert_eq!(
            switched(shipped, &features(true, true)).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            switched(shipped, &features(false, false)).unwrap(),
            [
                "[stage-lists] NEXT_STAGE = local",
                "[stage-aliases] NEXT_STAGE = route"
            ]
        );
        let off = applied(shipped, &features(false, false));
        assert_eq!(applied(&off, &features(true, true)), shipped);
    }
}

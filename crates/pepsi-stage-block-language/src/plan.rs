//! The language block's decisions, apart from the database: what becomes of each recipient's
//! copy of a message in a given language. Pure.

use pepsi_contract::settings::block_languages::{BlockAction, LanguageBlock};

/// What becomes of one recipient's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Goes on (not blocked, trusted, or no language known).
    Pass,
    /// To the Junk folder.
    Junk,
    /// Returned to the sender.
    Refuse,
}

/// The verdict for each recipient, in order. `code` is the detected language (`None`: no
/// language, nothing is blocked); `mailboxes` the recipients' mailboxes; `trusted` the
/// mailboxes whose whitelist trusts the sender (never blocked); `block` a mailbox's setting.
pub fn decide(
    code: Option<&str>,
    mailboxes: &[String],
    trusted: &[String],
    block: &dyn Fn(&str) -> Option<LanguageBlock>,
) -> Vec<Verdict> {
    mailboxes
        .iter()
        .map(|m| {
            let Some(code) = code else {
                return Verdict::Pass;
            };
            if trusted.iter().any(|t| t.eq_ignore_ascii_case(m)) {
                return Verdict::Pass;
            }
            match block(m) {
                Some(b) if blocks(&b, code) => match b.action {
                    BlockAction::Refuse => Verdict::Refuse,
                    BlockAction::Junk => Verdict::Junk,
                },
                _ => Verdict::Pass,
            }
        })
        .collect()
}

/// True when `block` blocks mail in `code` (ISO 639-1, any letter case).
fn blocks(block: &LanguageBlock, code: &str) -> bool {
    block.languages.iter().any(|l| l.eq_ignore_ascii_case(code))
}

/// The recipients' indices by verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    pub pass: Vec<usize>,
    pub junk: Vec<usize>,
    pub refuse: Vec<usize>,
}

/// Groups the verdicts. Without a junk stage, a copy for the Junk folder goes on as it is
/// (refusing it instead would return mail its recipient chose to keep).
pub fn group(verdicts: &[Verdict], has_junk_stage: bool) -> Groups {
    let mut g = Groups::default();
    for (i, v) in verdicts.iter().enumerate() {
        match v {
            Verdict::Junk if has_junk_stage => g.junk.push(i),
            Verdict::Refuse => g.refuse.push(i),
            _ => g.pass.push(i),
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    fn block(langs: &[&str], action: BlockAction) -> LanguageBlock {
        LanguageBlock {
            languages: langs.iter().map(|s| s.to_string()).collect(),
            action,
        }
    }

    #[test]
    fn verdicts_table() {
        let boxes: Vec<String> = ["a@x.test", "b@x.test", "c@x.test", "d@x.test"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let settings = |m: &str| match m {
            "a@x.test" => Some(block(&["ru"], BlockAction::Refuse)),
            "b@x.test" => Some(block(&["ru", "zh"], BlockAction::Junk)),
            "c@x.test" => Some(block(&["de"], BlockAction::Refuse)),
            _ => None,
        };
        for (code, trusted, want) in [
            (Some("ru"), vec![], vec![Refuse, Junk, Pass, Pass]),
            (Some("RU"), vec![], vec![Refuse, Junk, Pass, Pass]),
            (
                Some("ru"),
                vec!["A@x.test".to_string()],
                vec![Pass, Junk, Pass, Pass],
            ),
            (Some("de"), vec![], vec![Pass, Pass, Refuse, Pass]),
            (Some("en"), vec![], vec![Pass, Pass, Pass, Pass]),
            (None, vec![], vec![Pass, Pass, Pass, Pass]),
        ] {
            assert_eq!(
                decide(code, &boxes, &trusted, &settings),
                want,
                "{code:?} {trusted:?}"
            );
        }
    }

    #[test]
    fn groups_table() {
        let v = [Refuse, Junk, Pass, Junk];
        assert_eq!(
            group(&v, true),
            Groups {
                pass: vec![2],
                junk: vec![1, 3],
                refuse: vec![0]
            }
        );
        assert_eq!(
            group(&v, false),
            Groups {
                pass: vec![1, 2, 3],
                junk: vec![],
                refuse: vec![0]
            }
        );
    }
}

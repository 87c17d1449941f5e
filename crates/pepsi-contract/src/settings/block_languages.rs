//! The `block_languages` setting (`pepsi.settings`): which languages an address (or every
//! address of a domain) refuses, and what becomes of such mail. Its shape and its check only:
//! validated where it enters (`admin::setting_value`) and by `pepsi-stage-block-language`
//! when it reads it, which alone decides what the setting blocks; `BlockAction` is also what
//! `state.language_block` records.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The settings name.
pub const BLOCK_SETTING: &str = "block_languages";
/// The most languages one setting lists.
pub const MAX_LANGUAGES: usize = 100;

/// What becomes of a message in a blocked language.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockAction {
    /// Returned to its sender with a DSN (5.7.1).
    #[default]
    Refuse,
    /// Delivered, to the recipient's Junk folder (the stage's JUNK_STAGE).
    Junk,
}

impl BlockAction {
    pub fn name(self) -> &'static str {
        match self {
            BlockAction::Refuse => "refuse",
            BlockAction::Junk => "junk",
        }
    }
}

/// A `block_languages` value: `{"languages": ["ru", "zh"], "action": "junk"}` (`action`
/// defaults to `refuse`; unknown fields are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageBlock {
    /// ISO 639-1 codes, lower case.
    pub languages: Vec<String>,
    #[serde(default)]
    pub action: BlockAction,
}

impl LanguageBlock {
    /// Parses and checks a stored or entered value; codes come back lower case, each once.
    pub fn from_value(value: &Value) -> Result<LanguageBlock, String> {
        let mut block: LanguageBlock = serde_json::from_value(value.clone()).map_err(|e| {
            format!(
                "{BLOCK_SETTING} is a JSON object such as \
                 {{\"languages\": [\"ru\", \"zh\"], \"action\": \"refuse\"}} (action: refuse or junk): {e}"
            )
        })?;
        if block.languages.is_empty() || block.languages.len() > MAX_LANGUAGES {
            return Err(format!(
                "{BLOCK_SETTING}: from 1 to {MAX_LANGUAGES} languages, not {}",
                block.languages.len()
            ));
        }
        let mut codes: Vec<String> = Vec::with_capacity(block.languages.len());
        for code in &block.languages {
            let c = code.trim().to_ascii_lowercase();
            if c.len() != 2 || !c.bytes().all(|b| b.is_ascii_lowercase()) {
                return Err(format!(
                    "{BLOCK_SETTING}: {code:?} is not an ISO 639-1 code (two letters, as `de`)"
                ));
            }
            if !codes.contains(&c) {
                codes.push(c);
            }
        }
        block.languages = codes;
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_table() {
        for (value, want) in [
            (
                json!({"languages": ["RU", "zh", "ru"]}),
                Ok((vec!["ru", "zh"], BlockAction::Refuse)),
            ),
            (
                json!({"languages": ["de"], "action": "junk"}),
                Ok((vec!["de"], BlockAction::Junk)),
            ),
            (json!({"languages": []}), Err("from 1 to 100")),
            (json!({"languages": ["deu"]}), Err("not an ISO 639-1 code")),
            (json!({"languages": ["d1"]}), Err("not an ISO 639-1 code")),
            (
                json!({"languages": ["de"], "action": "drop"}),
                Err("action: refuse or junk"),
            ),
            (
                json!({"languages": ["de"], "colour": 1}),
                Err("unknown field"),
            ),
            (json!(["de"]), Err("a JSON object")),
        ] {
            match (LanguageBlock::from_value(&value), want) {
                (Ok(b), Ok((langs, action))) => {
                    assert_eq!(
                        (b.languages.clone(), b.action),
                        (langs.iter().map(|s| s.to_string()).collect(), action),
                        "{value}"
                    );
                }
                (Err(e), Err(why)) => assert!(e.contains(why), "{value}: {e}"),
                (got, want) => panic!("{value}: {got:?}, wanted {want:?}"),
            }
        }
    }
}

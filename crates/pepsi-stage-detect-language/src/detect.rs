//! The detector: lingua's, built once per process for the languages configured, and what it
//! says about a text.

use lingua::{IsoCode639_1, Language, LanguageDetector, LanguageDetectorBuilder};
use serde::Serialize;

/// How lingua judges: `Low` reads trigrams only (less memory, fast, good on the paragraphs
/// mail has), `High` all n-grams from one to five (better on short texts, several times the
/// memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accuracy {
    Low,
    High,
}

impl Accuracy {
    pub fn parse(text: &str) -> Result<Accuracy, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "low" => Ok(Accuracy::Low),
            "high" => Ok(Accuracy::High),
            other => Err(format!("{other:?} is not low or high")),
        }
    }
}

/// The languages given as ISO 639-1 codes (`de, en`), each known to this build, each once:
/// none (every language of the build) or at least two, since a detector of one language
/// would call every text that language. The error names what is wrong.
pub fn languages(codes: &[String]) -> Result<Vec<Language>, String> {
    let mut out: Vec<Language> = Vec::new();
    for c in codes {
        let language = c
            .trim()
            .parse::<IsoCode639_1>()
            .map(|iso| Language::from_iso_code_639_1(&iso))
            .map_err(|_| {
                format!("{c:?} is not an ISO 639-1 code of a language this build detects")
            })?;
        if !out.contains(&language) {
            out.push(language);
        }
    }
    if out.len() == 1 {
        return Err(format!(
            "one language ({}) would make every text that language: name at least two, or none \
             for all",
            codes.join(", ")
        ));
    }
    Ok(out)
}

/// What the detector says about one text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    /// ISO 639-1 code of the most likely language; `None` when the text has too few
    /// letters, or no language is likely enough.
    pub code: Option<String>,
    /// Its English name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// lingua's confidence in the most likely language, 0 to 1 (rounded to two places), also
    /// when it is below the minimum and so no code is given; 0 when the text was too short.
    pub confidence: f64,
    /// The letters of the text judged.
    pub letters: usize,
}

/// A built detector and the thresholds applied to its answers.
pub struct Detector {
    inner: LanguageDetector,
    min_letters: usize,
    min_confidence: f64,
}

impl Detector {
    /// Detects among `languages` (all this build knows when empty). Models load on first
    /// use, once per process.
    pub fn new(
        languages: &[Language],
        accuracy: Accuracy,
        min_letters: usize,
        min_confidence: f64,
    ) -> Detector {
        let mut builder = if !languages.is_empty() {
            LanguageDetectorBuilder::from_languages(languages)
        } else {
            LanguageDetectorBuilder::from_all_languages()
        };
        if accuracy == Accuracy::Low {
            builder.with_low_accuracy_mode();
        }
        Detector {
            inner: builder.build(),
            min_letters,
            min_confidence,
        }
    }

    /// What the detector says about `text`.
    pub fn detect(&self, text: &str) -> Detection {
        let letters = crate::text::letters(text);
        let none = Detection {
            code: None,
            name: None,
            confidence: 0.0,
            letters,
        };
        if letters < self.min_letters {
            return none;
        }
        let Some((language, confidence)) = self
            .inner
            .compute_language_confidence_values(text)
            .into_iter()
            .next()
        else {
            return none;
        };
        // lingua answers 0 for every language when it cannot decide, in no useful order.
        if confidence <= 0.0 || confidence < self.min_confidence {
            return Detection {
                confidence: round(confidence),
                ..none
            };
        }
        Detection {
            code: Some(language.iso_code_639_1().to_string().to_lowercase()),
            name: Some(language.to_string()),
            confidence: round(confidence),
            letters,
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

//! pepsi-stage-detect-language: the language of a message's text, with lingua's confidence,
//! recorded in `state.language` for `if` and `pepsi-stage-block-language` to act on. The
//! same executable is also the `pepsi-detect-language(1)` command, which reads a message on
//! standard input and prints what the stage would record: a two-program multi-call binary,
//! standalone because it links the language models nothing else uses (spec 22.2).
//!
//! Reads: the whole message (`Load::Full`). Writes: `state.language` (`docs/state.md`):
//! `code` (ISO 639-1, or null), `name`, `confidence` (0–1), `letters` (how much text was
//! judged). Terminal helper: `advance`, always.
//!
//! What text is judged is [`text`]'s (pure); the judging is [`detect`]'s.

pub mod detect;
pub mod text;

use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use clap::builder::TypedValueParser as _;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use serde_json::Map;

use detect::{Accuracy, Detector};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-detect-language",
        exec: "pepsi-stage-detect-language",
    };
    pub const PROGRAM: &str = "pepsi-stage-detect-language";
    /// The name that makes the executable the command rather than the stage.
    pub const COMMAND: &str = "pepsi-detect-language";
}

/// The defaults of the options, shared by the stage and the command.
const DEFAULT_MAX_CHARS: usize = 2_000;
const DEFAULT_MIN_LETTERS: usize = 20;
const DEFAULT_MIN_CONFIDENCE: f64 = 0.5;
/// The largest message the command reads.
const COMMAND_MAX_BYTES: u64 = 64 << 20;

/// One `[stage-<name>]` section, read at start. The detector is built on the first message
/// (so a configuration check links no model), then kept.
pub struct Options {
    pub languages: Vec<lingua::Language>,
    pub accuracy: Accuracy,
    pub max_chars: usize,
    pub min_letters: usize,
    pub min_confidence: f64,
    detector: std::sync::OnceLock<Detector>,
}

impl Options {
    fn detector(&self) -> &Detector {
        self.detector.get_or_init(|| {
            Detector::new(
                &self.languages,
                self.accuracy,
                self.min_letters,
                self.min_confidence,
            )
        })
    }
}

impl Options {
    /// Reads `[stage-<stage>]`.
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let languages = detect::languages(&s.list_opt("LANGUAGES")?.unwrap_or_default())
            .map_err(|e| anyhow::anyhow!("[stage-{stage}] LANGUAGES: {e}"))?;
        let accuracy = s
            .parse_opt("ACCURACY", Accuracy::parse)?
            .unwrap_or(Accuracy::Low);
        let max_chars = s
            .number_opt("MAX_CHARS")?
            .unwrap_or(DEFAULT_MAX_CHARS as u64);
        if !(100..=100_000).contains(&max_chars) {
            anyhow::bail!("[stage-{stage}] MAX_CHARS: from 100 to 100000, not {max_chars}");
        }
        let min_letters = s
            .number_opt("MIN_LETTERS")?
            .unwrap_or(DEFAULT_MIN_LETTERS as u64);
        let min_confidence = s
            .parse_opt("MIN_CONFIDENCE", |t| match t.trim().parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
                _ => Err(format!("{t:?} is not a number from 0 to 1")),
            })?
            .unwrap_or(DEFAULT_MIN_CONFIDENCE);
        Ok(Options {
            languages,
            accuracy,
            max_chars: max_chars as usize,
            min_letters: min_letters as usize,
            min_confidence,
            detector: std::sync::OnceLock::new(),
        })
    }
}

/// The stage; it keeps nothing between passes (the models stay loaded).
#[derive(Debug, Default)]
pub struct DetectLanguage;

impl Stage for DetectLanguage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    // Local work (CPU only, bounded by MAX_PARSED bytes parsed and MAX_CHARS judged): its
    // passes batch.
    const BATCH: bool = true;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let text = text::judged_text(&ctx.raw_message()?, options.max_chars, options.min_letters);
        let detection = options.detector().detect(&text);
        tracing::debug!(id = ctx.id(), ?detection, "language");
        let mut merge = Map::new();
        pepsi_contract::state::Language {
            code: detection.code,
            name: detection.name,
            confidence: detection.confidence,
            letters: detection.letters,
        }
        .insert_into(&mut merge);
        ctx.merge_state(merge);
        ctx.advance()
    }
}

const ABOUT: &str = "Record the language of the message's text, with its confidence, in \
state.language (lingua's models). Options of [stage-NAME]: NEXT_STAGE, LANGUAGES (ISO 639-1 \
codes; default every language of the build), ACCURACY (low), MAX_CHARS (2000), MIN_LETTERS \
(20), MIN_CONFIDENCE (0.5). The same executable run as pepsi-detect-language is a command \
that judges a message on standard input. See docs/language.md.";

/// The command line of `pepsi-stage-detect-language` as a stage: its `--help` and manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

const COMMAND_LONG_ABOUT: &str = "\
Reads one message (headers, an empty line, the body) on standard input and prints the \
language of its text, as Pepsi's language stage records it in state.language: the text \
parts (an HTML part converted to text when there is no plain one), decoded, without quoted \
lines and without the signature, at most --max-chars characters.

Output: `<code> <confidence> <name>` (ISO 639-1 code, lingua's confidence from 0 to 1, the \
English name), or `und <confidence>` when the text has fewer than --min-letters letters or \
no language reaches --min-confidence; with --json, the object the stage records.

The models load on first use: the first message of a run takes longer than the next.

Exit status: 0 when a language was found, 1 when none was (`und`), 2 on a usage error or \
input that cannot be read (or is larger than 64 MiB).";

/// `pepsi-detect-language`: the language of a message on standard input.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-detect-language",
    version,
    about = "Print the language of a message's text (Pepsi's language detection)",
    long_about = COMMAND_LONG_ABOUT
)]
struct CommandCli {
    /// Consider only these languages (ISO 639-1 codes, comma-separated; default: all)
    #[arg(long, value_delimiter = ',', value_name = "CODES")]
    languages: Vec<String>,
    /// low (trigrams: less memory) or high (all n-grams: better on short texts)
    #[arg(long, default_value = "low", value_parser = Accuracy::parse)]
    accuracy: Accuracy,
    /// Judge at most this many characters of text
    #[arg(long, default_value_t = DEFAULT_MAX_CHARS,
          value_parser = clap::value_parser!(u32).range(100..=100_000).map(|n| n as usize))]
    max_chars: usize,
    /// Fewer letters than this are no language
    #[arg(long, default_value_t = DEFAULT_MIN_LETTERS)]
    min_letters: usize,
    /// A language less likely than this (0 to 1) is no language
    #[arg(long, default_value_t = DEFAULT_MIN_CONFIDENCE,
          value_parser = |t: &str| match t.parse::<f64>() {
              Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
              _ => Err(format!("{t:?} is not a number from 0 to 1")),
          })]
    min_confidence: f64,
    /// Print the JSON object the stage records
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-detect-language`: its `--help` and manual page.
pub fn command_cli() -> clap::Command {
    <CommandCli as clap::CommandFactory>::command()
}

fn run_command() -> ExitCode {
    let cli = CommandCli::parse();
    let fail = |e: String| {
        eprintln!("{}: {e}", constants::COMMAND);
        ExitCode::from(2)
    };
    let languages = match detect::languages(&cli.languages) {
        Ok(l) => l,
        Err(e) => return fail(format!("--languages: {e}")),
    };
    let mut message = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(COMMAND_MAX_BYTES + 1)
        .read_to_end(&mut message)
    {
        return fail(format!("standard input: {e}"));
    }
    if message.len() as u64 > COMMAND_MAX_BYTES {
        return fail(format!("a message larger than {COMMAND_MAX_BYTES} bytes"));
    }
    let detector = Detector::new(
        &languages,
        cli.accuracy,
        cli.min_letters,
        cli.min_confidence,
    );
    let d = detector.detect(&text::judged_text(&message, cli.max_chars, cli.min_letters));
    if cli.json {
        println!("{}", serde_json::to_string(&d).unwrap_or_default());
    } else {
        match (&d.code, &d.name) {
            (Some(code), Some(name)) => println!("{code} {:.2} {name}", d.confidence),
            _ => println!("und {:.2}", d.confidence),
        }
    }
    if d.code.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Entry point of the binary: the command when run as `pepsi-detect-language` (a symlink),
/// else the stage worker.
pub fn run() -> ExitCode {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if name == constants::COMMAND {
        return run_command();
    }
    pepsi_contract::stage::main::<DetectLanguage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

//! What a program's manual page is made from, as the table of programs names it
//! (`crate::programs`); `crate::manual` renders the pages. Pure data: the table sits below
//! the renderer, so this module imports neither.

use pepsi_conf::cli::Command;

/// Where a page's text comes from.
pub enum Source {
    /// The program's clap definition.
    Clap(fn() -> Command),
    /// A program that parses its own arguments: its one-line summary and its `--help` text
    /// (sections under headings written in capitals).
    Help {
        about: &'static str,
        help: fn() -> String,
    },
}

/// One program's page.
pub struct Page {
    /// The program, as its `[[bin]]` and executable are named.
    pub name: &'static str,
    /// The manual section: 8 for the daemons, stages, helpers and administrative tools, 1
    /// for what any user runs.
    pub section: u8,
    pub source: Source,
}

impl Page {
    /// The file name the page is installed under (`pepsi-ingress.8`).
    pub fn file_name(&self) -> String {
        format!("{}.{}", self.name, self.section)
    }
}

/// pepsi-sendmail's page: the text its `--help` prints, without the first line.
pub(crate) fn sendmail_help() -> String {
    // The first line repeats the name section; the rest is the text `--help` prints.
    let help = pepsi_sendmail::options::HELP;
    help.split_once("\n\n")
        .map_or(help, |(_, rest)| rest)
        .to_owned()
}

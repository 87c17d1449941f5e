//! The manual pages of every program: one page per `[[bin]]`, rendered with clap_mangen from
//! the command line each crate defines (`<crate>::command()`, the same clap definition its
//! `--help` prints), so a page cannot drift from the program. `pepsi-sendmail` and the
//! multi-call `pepsi` parse their arguments by hand (sendmail's syntax is not clap's); their
//! pages are rendered from the help text they print. A subcommand's synopsis, description
//! and options are a section of its program's page.
//!
//! `examples/pepsi-man.rs` writes them (`make man`, installed by `make install` and
//! `make deb`); `tests/integration/manual.rs` checks that every program has a page that names each of
//! its options. The hand-written `man/pepsi.state.7` (the message state) sits beside them.
//!
//! Nothing here runs in a program: no executable calls it, so none links it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use pepsi_conf::cli::Command;

pub use crate::programs::page::{Page, Source};

const fn clap(name: &'static str, section: u8, command: fn() -> Command) -> Page {
    Page {
        name,
        section,
        source: Source::Clap(command),
    }
}

fn pepsi_usage() -> String {
    format!(
        "USAGE\n{}\nDESCRIPTION\nThe unified multi-call executable of a release build (docs/unibin.md): \
         every program it contains is installed as a symbolic link to it, and argv[0] names \
         the program to run. pepsi PROGRAM ARGS runs PROGRAM with ARGS. --list prints the \
         names it runs, one a line; --help prints this text. Exit status 2 for no program, \
         an unknown one, or one installed as its own executable.\n",
        crate::programs::usage()
    )
}

/// Every program's page: the unified binary's, every row of the table of programs
/// (`crate::programs::manual_pages`), and the second name of a program that is also a
/// command of its own (`crate::programs::COMMAND_LINKS`, a row's `also:`).
pub fn pages() -> Vec<Page> {
    let mut pages = vec![Page {
        name: "pepsi",
        section: 8,
        source: Source::Help {
            about: "the unified multi-call executable of the Pepsi mail server",
            help: pepsi_usage,
        },
    }];
    pages.extend(crate::programs::manual_pages());
    pages.push(clap(
        "pepsi-detect-language",
        1,
        pepsi_stage_detect_language::command_cli,
    ));
    pages
}

const SOURCE: &str = concat!("Pepsi ", env!("CARGO_PKG_VERSION"));
const MANUAL: &str = "Pepsi Manual";

/// The roff text of `page`.
pub fn render(page: &Page) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    match &page.source {
        Source::Clap(command) => {
            let mut cmd = command().name(page.name);
            cmd.build();
            let man = clap_mangen::Man::new(cmd.clone())
                .title(page.name.to_uppercase())
                .section(page.section.to_string())
                .date(date())
                .source(SOURCE)
                .manual(MANUAL);
            // clap_mangen's own SUBCOMMANDS section points at a page per subcommand; here
            // each subcommand is a section of this page instead.
            man.render_title(&mut out)?;
            man.render_name_section(&mut out)?;
            man.render_synopsis_section(&mut out)?;
            man.render_description_section(&mut out)?;
            if cmd.get_arguments().any(|a| !a.is_hide_set()) {
                man.render_options_section(&mut out)?;
            }
            subcommand_sections(&cmd, page.section, &mut out)?;
            if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
                man.render_extra_section(&mut out)?;
            }
            if cmd.get_version().is_some() {
                man.render_version_section(&mut out)?;
            }
        }
        Source::Help { about, help } => help_page(page, about, &help(), &mut out)?,
    }
    writeln!(out, ".SH SEE ALSO")?;
    writeln!(
        out,
        "pepsi.state(7), and the documentation in /usr/share/doc/pepsi (docs/ of the source)"
    )?;
    Ok(out)
}

/// Each subcommand (depth first) as sections of its program's page: a heading with its
/// whole command line, its synopsis, description and options.
fn subcommand_sections(cmd: &Command, section: u8, out: &mut Vec<u8>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let path = sub.get_bin_name().unwrap_or(sub.get_name()).to_owned();
        let man = clap_mangen::Man::new(sub.clone()).section(section.to_string());
        writeln!(out, ".SH \"{}\"", escape(&path.to_uppercase()))?;
        let mut body = Vec::new();
        man.render_synopsis_section(&mut body)?;
        man.render_description_section(&mut body)?;
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut body)?;
        }
        // Within the program's page the subcommand's own sections are subsections.
        for line in String::from_utf8_lossy(&body).lines() {
            match line.strip_prefix(".SH ") {
                Some(heading) => writeln!(out, ".SS {heading}")?,
                None => writeln!(out, "{line}")?,
            }
        }
        let mut sub = sub.clone();
        sub.build();
        subcommand_sections(&sub, section, out)?;
    }
    Ok(())
}

/// A page from a help text: headings in capitals become sections, the rest is kept as
/// written (its columns are aligned by spaces).
fn help_page(page: &Page, about: &str, help: &str, out: &mut Vec<u8>) -> std::io::Result<()> {
    writeln!(
        out,
        ".TH {} {} {} \"{SOURCE}\" \"{MANUAL}\"",
        page.name.to_uppercase(),
        page.section,
        date()
    )?;
    writeln!(out, ".SH NAME\n{} \\- {}", escape(page.name), escape(about))?;
    let mut open = false;
    for line in help.lines() {
        // A heading: written in capitals up to an explanation in parentheses.
        let words = line.split('(').next().unwrap_or_default();
        let heading = !line.starts_with(' ')
            && words.chars().any(|c| c.is_ascii_alphabetic())
            && words
                .chars()
                .all(|c| c.is_ascii_uppercase() || " -_".contains(c));
        if heading {
            if open {
                writeln!(out, ".fi")?;
            }
            writeln!(out, ".SH \"{}\"\n.nf", escape(line))?;
            open = true;
        } else {
            if !open {
                writeln!(out, ".SH DESCRIPTION\n.nf")?;
                open = true;
            }
            // A line that starts with a roff control character would be read as a request.
            let text = escape(line);
            if text.starts_with('.') || text.starts_with('\'') {
                writeln!(out, "\\&{text}")?;
            } else {
                writeln!(out, "{text}")?;
            }
        }
    }
    if open {
        writeln!(out, ".fi")?;
    }
    Ok(())
}

/// The date in a page's title line: `SOURCE_DATE_EPOCH` when set (a reproducible build),
/// else today, as YYYY-MM-DD (UTC).
fn date() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Text for roff: backslashes doubled, hyphens as `\-` (so copied options stay ASCII).
fn escape(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// Writes every page, and the hand-written ones of `man/`, into `dir/man<section>/`;
/// returns the files written.
pub fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for page in pages() {
        let sub = dir.join(format!("man{}", page.section));
        std::fs::create_dir_all(&sub)?;
        let path = sub.join(page.file_name());
        std::fs::write(&path, render(&page)?)?;
        written.push(path);
    }
    for (file, text) in HAND_WRITTEN {
        let section = file.rsplit('.').next().unwrap_or("7");
        let sub = dir.join(format!("man{section}"));
        std::fs::create_dir_all(&sub)?;
        let path = sub.join(file);
        std::fs::write(&path, text)?;
        written.push(path);
    }
    Ok(written)
}

/// The pages written by hand, under `man/` of the source: what no program's command line
/// describes.
pub const HAND_WRITTEN: &[(&str, &str)] =
    &[("pepsi.state.7", include_str!("../man/pepsi.state.7"))];

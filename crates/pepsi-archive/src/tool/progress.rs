//! Progress lines on stderr for the commands that take seconds: on a terminal one line
//! rewritten as the work goes (at most a few times a second), otherwise one line every
//! [`EVERY`] items, so a log keeps a record without a line per message.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

/// Items between two progress lines when stderr is no terminal.
pub(crate) const EVERY: u64 = 1000;
/// The least time between two updates of a terminal's line.
const TICK: Duration = Duration::from_millis(250);

pub(crate) struct Progress {
    what: String,
    unit: &'static str,
    total_bytes: Option<u64>,
    terminal: bool,
    started: Instant,
    last: Option<Instant>,
    last_count: u64,
    shown: bool,
}

impl Progress {
    /// Progress of `what` (a list) counting `unit` ("messages read"), of a file of
    /// `total_bytes` when known.
    pub(crate) fn new(what: &str, unit: &'static str, total_bytes: Option<u64>) -> Progress {
        Progress {
            what: what.to_owned(),
            unit,
            total_bytes,
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: None,
            last_count: 0,
            shown: false,
        }
    }

    /// `count` items done, `bytes` of the input read (when it is a file), of `total` items
    /// (when known).
    pub(crate) fn update(&mut self, count: u64, bytes: Option<u64>, total: Option<u64>) {
        let now = Instant::now();
        let due = if self.terminal {
            self.last.is_none_or(|l| now.duration_since(l) >= TICK)
        } else {
            count / EVERY > self.last_count / EVERY
        };
        if !due {
            return;
        }
        self.last = Some(now);
        self.last_count = count;
        let line = self.line(count, bytes, total, now);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[K{line}");
            self.shown = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
    }

    fn line(&self, count: u64, bytes: Option<u64>, total: Option<u64>, now: Instant) -> String {
        let mut line = format!("{}: {count}", self.what);
        if let Some(t) = total {
            line.push_str(&format!(" of {t}"));
        }
        line.push(' ');
        line.push_str(self.unit);
        if let Some(b) = bytes {
            let mb = |n: u64| n as f64 / (1024.0 * 1024.0);
            match self.total_bytes {
                Some(t) if t > 0 => line.push_str(&format!(
                    ", {:.1} of {:.1} MB ({}%)",
                    mb(b),
                    mb(t),
                    b.min(t) * 100 / t
                )),
                _ => line.push_str(&format!(", {:.1} MB", mb(b))),
            }
        }
        let secs = now.duration_since(self.started).as_secs_f64();
        if secs > 0.0 {
            line.push_str(&format!(", {:.0}/s", count as f64 / secs));
        }
        line
    }

    /// Ends a terminal's progress line, so that what follows starts on its own line.
    pub(crate) fn finish(&mut self) {
        if self.shown {
            let _ = writeln!(std::io::stderr());
            self.shown = false;
        }
    }
}

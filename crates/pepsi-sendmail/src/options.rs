//! The sendmail(1) command line: getopt-style letters that cluster (`-ti`), take their value
//! attached or as the next argument (`-fme@x`, `-f me@x`), and the `-o`/`-b`/`-q` families
//! whose value is the rest of the word (`-oi`, `-bs`, `-q30m`). Pure: argv in, an
//! [`Invocation`] or a usage error naming the offending argument out.
//!
//! clap cannot express this syntax (`-oi` is not `-o i` in every sendmail, `-q` takes an
//! optional attached value, `-V` is an option here, not the version), so the parser is
//! written out and tested as a table; `--help` prints [`HELP`].

use std::path::PathBuf;
use std::time::Duration;

use pepsi_contract::state::Ret;

/// What the program is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// `-bm` (the default): read one message from standard input and queue it.
    Deliver,
    /// `-bs`: an SMTP session on standard input and output.
    Smtp,
    /// `-q`, `--flush`: insert the drop directory's files; with an interval, every interval
    /// until stopped.
    Pickup {
        every: Option<Duration>,
    },
    /// `-bi` (newaliases): nothing to rebuild; said so, exit 0.
    Newaliases,
    Help,
    Version,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub mode: Mode,
    /// Recipients named as arguments.
    pub recipients: Vec<String>,
    /// `-t`: recipients from the To, Cc and Bcc fields as well.
    pub from_headers: bool,
    /// `-f` / `-r`: the envelope sender; `Some("")` for the null sender (`-f '<>'`).
    pub sender: Option<String>,
    /// `-F`: the full name of the added From field.
    pub full_name: Option<String>,
    /// False with `-i` / `-oi`: a line holding a single dot does not end the message.
    pub dot_ends: bool,
    /// `-N`: `["NEVER"]` or some of SUCCESS, FAILURE, DELAY, for every recipient.
    pub notify: Option<Vec<String>>,
    /// `-R`: what a failure notice returns.
    pub ret: Option<Ret>,
    /// `-V`: the envelope id.
    pub envid: Option<String>,
    /// `-C FILE` / `--config FILE`.
    pub config: Option<PathBuf>,
    /// `--log-level LEVEL` (`-L` is sendmail's syslog tag, ignored).
    pub log_level: String,
    /// `-v`: say where the message went on standard error.
    pub verbose: bool,
    /// Options accepted and ignored, as written (logged at debug level).
    pub ignored: Vec<String>,
}

impl Default for Invocation {
    fn default() -> Self {
        Invocation {
            mode: Mode::Deliver,
            recipients: Vec::new(),
            from_headers: false,
            sender: None,
            full_name: None,
            dot_ends: true,
            notify: None,
            ret: None,
            envid: None,
            config: None,
            log_level: "warn".into(),
            verbose: false,
            ignored: Vec::new(),
        }
    }
}

/// A command line sendmail cannot run: printed after `pepsi-sendmail: `, exit 64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Letters that take a value (attached, else the next argument).
const WITH_VALUE: &[char] = &[
    'f', 'r', 'F', 'N', 'R', 'V', 'B', 'C', 'h', 'L', 'O', 'X', 'p', 'A',
];
/// Flags accepted and ignored: `-m` (me too), `-n` (no aliasing), `-U` (initial
/// submission), `-G` (gateway), `-s` (save From lines).
const IGNORED_FLAGS: &[char] = &['m', 'n', 'U', 'G', 's'];

/// The longest `-F`, `-V` and sender value accepted.
const MAX_VALUE: usize = 320;

/// Parses the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Invocation, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let mut inv = Invocation::default();
    let mut i = 0;
    let mut only_recipients = false;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if only_recipients || !arg.starts_with('-') || arg == "-" {
            inv.recipients.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_recipients = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, attached) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (long, None),
            };
            let mut value = |what: &str| -> Result<String, UsageError> {
                match attached.clone() {
                    Some(v) => Ok(v),
                    None if i < args.len() => {
                        i += 1;
                        Ok(args[i - 1].clone())
                    }
                    None => Err(usage(format!("--{name} needs {what}"))),
                }
            };
            match name {
                "help" => inv.mode = Mode::Help,
                "version" => inv.mode = Mode::Version,
                "flush" => inv.mode = Mode::Pickup { every: None },
                "config" => inv.config = Some(PathBuf::from(value("a file")?)),
                "log-level" => inv.log_level = value("a level")?,
                _ => return Err(usage(format!("unknown option --{name}"))),
            }
            continue;
        }
        let letters: Vec<char> = arg[1..].chars().collect();
        let mut k = 0;
        while k < letters.len() {
            let c = letters[k];
            k += 1;
            let rest: String = letters[k..].iter().collect();
            match c {
                't' => inv.from_headers = true,
                'i' => inv.dot_ends = false,
                'v' => inv.verbose = true,
                c if IGNORED_FLAGS.contains(&c) => inv.ignored.push(format!("-{c}")),
                'o' => {
                    // -oX…: the rest of the word is the option (sendmail's old form).
                    k = letters.len();
                    option_o(&rest, &mut inv)?;
                }
                'b' => {
                    k = letters.len();
                    inv.mode = match rest.as_str() {
                        "m" => Mode::Deliver,
                        "s" => Mode::Smtp,
                        "i" => Mode::Newaliases,
                        "p" => {
                            return Err(usage(
                                "-bp (list the queue) is not offered: use pepsi-queue list",
                            ));
                        }
                        "d" | "D" => {
                            return Err(usage(format!(
                                "-b{rest} (run as a daemon) is not offered: pepsi-ingress is the SMTP server"
                            )));
                        }
                        "" => {
                            return Err(usage(
                                "-b needs a mode: -bm (queue a message) or -bs (an SMTP session)",
                            ));
                        }
                        _ => {
                            return Err(usage(format!(
                                "-b{rest}: unknown or unsupported mode (offered: -bm, -bs, -bi)"
                            )));
                        }
                    };
                }
                'q' => {
                    k = letters.len();
                    inv.mode = Mode::Pickup {
                        every: queue_interval(&rest)?,
                    };
                }
                c if WITH_VALUE.contains(&c) => {
                    k = letters.len();
                    let value = if !rest.is_empty() {
                        rest
                    } else if i < args.len() {
                        i += 1;
                        args[i - 1].clone()
                    } else {
                        return Err(usage(format!("-{c} needs a value")));
                    };
                    option_value(c, value, &mut inv)?;
                }
                _ => return Err(usage(format!("unknown option -{c} (in {arg:?})"))),
            }
        }
    }
    Ok(inv)
}

/// `-oX…`.
fn option_o(rest: &str, inv: &mut Invocation) -> Result<(), UsageError> {
    let mut chars = rest.chars();
    match chars.next() {
        None => Err(usage(
            "-o needs an option letter attached (e.g. -oi; -o value is not accepted)",
        )),
        Some('i') if chars.as_str().is_empty() => {
            inv.dot_ends = false;
            Ok(())
        }
        // Error mode (-oem, -oee, -oeq, -oep, -oew), delivery mode (-odb, -odi, -odq),
        // me too (-om), the queue directory (-oQ), and every other old-style option: the
        // outcome is always told by the exit status and standard error, the message is
        // always queued, and pepsi's configuration is its own.
        Some(_) => {
            inv.ignored.push(format!("-o{rest}"));
            Ok(())
        }
    }
}

fn option_value(c: char, value: String, inv: &mut Invocation) -> Result<(), UsageError> {
    let bounded = |what: &str, v: &str| -> Result<(), UsageError> {
        if v.len() > MAX_VALUE || v.chars().any(char::is_control) {
            Err(usage(format!(
                "-{c} {what}: at most {MAX_VALUE} octets without control characters"
            )))
        } else {
            Ok(())
        }
    };
    match c {
        'f' | 'r' => {
            bounded("sender", &value)?;
            let v = value.trim();
            let v = v
                .strip_prefix('<')
                .and_then(|v| v.strip_suffix('>'))
                .unwrap_or(v);
            inv.sender = Some(v.to_owned());
        }
        'F' => {
            bounded("full name", &value)?;
            inv.full_name = Some(value);
        }
        'N' => inv.notify = Some(notify(&value)?),
        'R' => {
            inv.ret = Some(match value.to_ascii_lowercase().as_str() {
                "full" => Ret::Full,
                "hdrs" => Ret::Headers,
                _ => return Err(usage(format!("-R {value:?}: full or hdrs expected"))),
            })
        }
        'V' => {
            if value.is_empty()
                || value.len() > 100
                || !value.bytes().all(|b| (0x21..=0x7e).contains(&b))
            {
                return Err(usage(format!(
                    "-V {value:?}: an envelope id is 1 to 100 printable ASCII characters without spaces"
                )));
            }
            inv.envid = Some(value);
        }
        'B' => match value.to_ascii_uppercase().as_str() {
            "7BIT" | "8BITMIME" => inv.ignored.push(format!("-B{value}")),
            _ => return Err(usage(format!("-B {value:?}: 7BIT or 8BITMIME expected"))),
        },
        'C' => inv.config = Some(PathBuf::from(value)),
        // -h hop count, -L syslog tag, -O option=value, -X traffic log file, -p protocol,
        // -A configuration selector: accepted, ignored.
        _ => inv.ignored.push(format!("-{c}{value}")),
    }
    Ok(())
}

/// `-N never` or a comma list of success, failure, delay.
fn notify(value: &str) -> Result<Vec<String>, UsageError> {
    let words: Vec<String> = value
        .split(',')
        .map(|w| w.trim().to_ascii_uppercase())
        .collect();
    let known = ["SUCCESS", "FAILURE", "DELAY"];
    if words == ["NEVER"] {
        return Ok(words);
    }
    let mut out: Vec<String> = Vec::new();
    for w in words {
        if !known.contains(&w.as_str()) {
            return Err(usage(format!(
                "-N {value:?}: never, or a comma-separated list of success, failure and delay"
            )));
        }
        if !out.contains(&w) {
            out.push(w);
        }
    }
    Ok(out)
}

/// The attached value of `-q`: nothing (one pass), `f` (in the foreground: one pass), or an
/// interval (`30s`, `5m`, `1h`).
fn queue_interval(rest: &str) -> Result<Option<Duration>, UsageError> {
    match rest {
        "" | "f" => Ok(None),
        r if r.starts_with(['I', 'R', 'S', '!', 'G', 'Q', 'L']) => Err(usage(format!(
            "-q{r}: queue selection is not offered; -q inserts every file of the drop directory"
        ))),
        r => {
            let d =
                pepsi_conf::config::parse_duration(r).map_err(|e| usage(format!("-q{r}: {e}")))?;
            if d.is_zero() {
                return Err(usage(format!("-q{r}: the interval must be more than 0")));
            }
            Ok(Some(d))
        }
    }
}

/// `pepsi-sendmail --help`.
pub const HELP: &str = "\
pepsi-sendmail - the sendmail(1) interface of the Pepsi mail server

USAGE
  pepsi-sendmail [OPTIONS] [--] [RECIPIENT...]      queue the message on standard input
  pepsi-sendmail -t [OPTIONS] [RECIPIENT...]        recipients from To, Cc, Bcc as well
  pepsi-sendmail -bs                                an SMTP session on standard input/output
  pepsi-sendmail -q[INTERVAL] | --flush             insert the drop directory (the pickup)

Installed as /usr/sbin/sendmail, it is what cron, PHP's mail(), monitoring scripts and
mail(1) call. The message is handed to the Pepsi queue without SMTP and without a password:
the program connects to PostgreSQL as the sendmail role, which may only call one stored
function (pepsi.sendmail_submit) that checks the envelope and stores the message at stage
init, marked as a local submission by this user. When the database cannot be reached the
message is written to the drop directory instead (SPOOL_DIR) and the exit status is still
0: it is queued, and the pickup (pepsi-sendmail -q, run by the supervisor) inserts it later.
Nothing is lost either way: a non-zero exit status means the message was not taken.

OPTIONS
  -t            Read recipients from the To, Cc and Bcc fields too (recipients given as
                arguments are added). Bcc fields are removed from every message.
  -f SENDER     The envelope sender (also -r). '<>' is the null sender. Default: the
                invoking user's login name at [pepsi-sendmail] DOMAIN.
  -F NAME       The full name for the From field added when the message has none.
  -i, -oi       A line holding a single dot does not end the message (only end of input
                does). Without it, such a line ends the message, as in sendmail.
  -bm           Queue the message on standard input (the default).
  -bs           Speak SMTP on standard input and output (RFC 5321: EHLO, MAIL, RCPT, DATA,
                RSET, NOOP, HELP, VRFY, QUIT; PIPELINING, SIZE, 8BITMIME, SMTPUTF8, DSN and
                ENHANCEDSTATUSCODES offered).
  -bi           newaliases: Pepsi reads its alias file itself; nothing to rebuild (exit 0).
  -N DSN        Delivery status notifications wanted: never, or a comma-separated list of
                success, failure, delay (RFC 3461 NOTIFY), for every recipient.
  -R RET        What a failure notice returns: full or hdrs (RFC 3461 RET).
  -V ENVID      The envelope id that notices quote (RFC 3461 ENVID).
  -q[INTERVAL]  The pickup: insert every file of the drop directory into the queue, each
                removed only once its insert committed; with an INTERVAL (30s, 5m) again
                every INTERVAL until SIGTERM. Only the owner of SPOOL_DIR (or root) may.
  --flush       The same as -q.
  -v            Say on standard error where the message went.
  -C FILE, --config FILE
                The configuration (default $PEPSI_CONFIG, else /etc/pepsi/pepsi.conf).
                Refused, like $PEPSI_CONFIG, when the program runs set-group-id for
                another user. Its secrets.d/ is never read.
  --log-level LEVEL
                Logs on standard error: error, warn (default), info, debug.
  --help        This text. (-h N is sendmail's hop count, accepted and ignored.)
  --version     The version.

ACCEPTED AND IGNORED
  -oem -oee -oeq -oep -oew (error mode: errors are always the exit status and a message on
  standard error), -odb -odi -odq (delivery mode: the message is always queued), -om, -oQ,
  any other -oX, -B 7BIT|8BITMIME (the message itself decides), -m, -n, -U, -G, -s,
  -h HOPS, -L TAG, -O OPTION=VALUE, -X FILE, -p PROTOCOL, -A c|m.

NOT OFFERED (exit 64)
  -bp (use pepsi-queue list), -bd/-bD (pepsi-ingress is the server), -bv, -bt and other
  modes, -qI/-qR/-qS queue selection, -d debugging.

CONFIGURATION ([pepsi-sendmail] in the configuration file)
  DOMAIN             domain of the default sender and of unqualified addresses
                     (default [pepsi] HOSTNAME, else the host name)
  SPOOL_DIR          the drop directory (default /var/spool/pepsi/sendmail), mode 1730,
                     owned by the pepsi user and the pepsi-sendmail group
  DATABASE_URL       how to reach PostgreSQL as the sendmail role (default [database] URL
                     with the user [pepsi-setup] SENDMAIL_ROLE, pepsi-sendmail)
  CONNECT_TIMEOUT    give up on the database and use the drop directory after this (5s)
  MAX_MESSAGE_SIZE   largest message (default [pepsi-ingress] MAX_MESSAGE_SIZE, 25M)
  MAX_RECIPIENTS     most recipients of one message (default 100)
  MAX_LINE_LENGTH    longest line, its line end included (default 1000)

EXIT STATUS (sysexits.h)
  0   queued (in the database or the drop directory)
  64  EX_USAGE     a bad option, or no recipient
  65  EX_DATAERR   the message is too large, has a line too long or a bare CR, too many
                   recipients, or the database refused it as malformed
  66  EX_NOINPUT   standard input could not be read
  67  EX_NOUSER    a recipient or the sender is not an address
  70  EX_SOFTWARE  an internal error
  73  EX_CANTCREAT the pickup cannot read or change the drop directory
  75  EX_TEMPFAIL  neither the database nor the drop directory took the message; try again
  77  EX_NOPERM    not allowed (another configuration while set-group-id, the pickup by
                   someone other than the drop directory's owner)
  78  EX_CONFIG    the configuration is wrong

EXAMPLES
  printf 'Subject: disk\\n\\n/var is 91%% full\\n' | pepsi-sendmail -i root
  pepsi-sendmail -t -oi < message.eml
  pepsi-sendmail -f noreply@example.org -F 'Backup job' -N failure ops@example.org < report

SEE ALSO
  docs/sendmail.md, pepsi-queue(1), pepsi-setup(1)
";

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], want: impl FnOnce(&mut Invocation)) {
        let mut expected = Invocation::default();
        want(&mut expected);
        assert_eq!(parse(args.iter().copied()).unwrap(), expected, "{args:?}");
    }

    fn refused(args: &[&str], contains: &str) {
        let err = parse(args.iter().copied()).unwrap_err().0;
        assert!(err.contains(contains), "{args:?}: {err}");
    }

    #[test]
    fn accepted_command_lines() {
        check(&["bob@example.org"], |i| {
            i.recipients = vec!["bob@example.org".into()]
        });
        check(&["-t", "-i"], |i| {
            i.from_headers = true;
            i.dot_ends = false;
        });
        check(&["-ti"], |i| {
            i.from_headers = true;
            i.dot_ends = false;
        });
        check(&["-oi", "-oem", "-odb", "root"], |i| {
            i.dot_ends = false;
            i.ignored = vec!["-oem".into(), "-odb".into()];
            i.recipients = vec!["root".into()];
        });
        check(&["-f", "me@example.org", "-F", "Cron Daemon", "x"], |i| {
            i.sender = Some("me@example.org".into());
            i.full_name = Some("Cron Daemon".into());
            i.recipients = vec!["x".into()];
        });
        check(&["-fme@example.org", "-FCron"], |i| {
            i.sender = Some("me@example.org".into());
            i.full_name = Some("Cron".into());
        });
        check(&["-f", "<>"], |i| i.sender = Some(String::new()));
        check(&["-r", "<a@b.test>"], |i| {
            i.sender = Some("a@b.test".into())
        });
        check(
            &["-N", "success,Failure", "-R", "hdrs", "-V", "id-1"],
            |i| {
                i.notify = Some(vec!["SUCCESS".into(), "FAILURE".into()]);
                i.ret = Some(Ret::Headers);
                i.envid = Some("id-1".into());
            },
        );
        check(&["-Nnever"], |i| i.notify = Some(vec!["NEVER".into()]));
        check(&["-bs"], |i| i.mode = Mode::Smtp);
        check(&["-bm", "a"], |i| i.recipients = vec!["a".into()]);
        check(&["-bi"], |i| i.mode = Mode::Newaliases);
        check(&["-q"], |i| i.mode = Mode::Pickup { every: None });
        check(&["--flush"], |i| i.mode = Mode::Pickup { every: None });
        check(&["-q30s"], |i| {
            i.mode = Mode::Pickup {
                every: Some(Duration::from_secs(30)),
            }
        });
        check(&["-B", "8BITMIME", "-h", "17", "-L", "tag"], |i| {
            i.ignored = vec!["-B8BITMIME".into(), "-h17".into(), "-Ltag".into()];
        });
        check(&["-C", "/etc/x.conf", "--log-level=debug"], |i| {
            i.config = Some("/etc/x.conf".into());
            i.log_level = "debug".into();
        });
        check(&["--", "-odd@example.org"], |i| {
            i.recipients = vec!["-odd@example.org".into()]
        });
        check(&["--help"], |i| i.mode = Mode::Help);
        check(&["-vm"], |i| {
            i.verbose = true;
            i.ignored = vec!["-m".into()];
        });
    }

    #[test]
    fn refused_command_lines() {
        refused(&["-Z"], "unknown option -Z");
        refused(&["--frobnicate"], "unknown option --frobnicate");
        refused(&["-f"], "-f needs a value");
        refused(&["-o"], "-o needs an option letter");
        refused(&["-bp"], "pepsi-queue list");
        refused(&["-bd"], "pepsi-ingress");
        refused(&["-bv"], "-bv: unknown or unsupported mode");
        refused(&["-b"], "-b needs a mode");
        refused(&["-N", "sometimes"], "-N \"sometimes\"");
        refused(&["-N", "never,success"], "-N");
        refused(&["-R", "most"], "full or hdrs");
        refused(&["-V", "has space"], "envelope id");
        refused(&["-B", "BINARYMIME"], "7BIT or 8BITMIME");
        refused(&["-qRexample"], "queue selection");
        refused(&["-qsoon"], "-qsoon");
        refused(&["-q0s"], "more than 0");
        refused(&["-F", "a\nb"], "control characters");
        refused(&["-d0.1"], "unknown option -d");
    }
}

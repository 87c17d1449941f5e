//! `-bs`: an SMTP dialogue (RFC 5321) on standard input and output, for programs that
//! speak SMTP to a local sendmail rather than passing arguments. Commands, paths and the
//! MAIL/RCPT parameters are read by the protocol crate the ingress uses
//! (`pepsi_smtp`), so a local session accepts exactly what the server does;
//! lines may end in LF or CRLF (a local pipe, not the network). The session is a state
//! machine over a reader and a writer; the caller supplies what happens to a message at the
//! end of DATA, and so the session itself does no queueing and no database work.

use std::io::{BufRead, Write};

use pepsi_contract::state::{DsnRcpt, Ret};
use pepsi_smtp::Reply;
use pepsi_smtp::command::{self, Command, ParseError};
use pepsi_smtp::params::{self, MailParams};

use crate::message::{EnvelopeRequest, Limits};

/// The longest command line read (RFC 5321 §4.5.3.1.4 allows 512 with its CRLF; some
/// slack for ESMTP parameters).
const MAX_COMMAND: usize = 2048;

/// The facts the session announces and enforces.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub hostname: String,
    pub limits: Limits,
    /// `-F`: the full name for a From field the message lacks.
    pub full_name: Option<String>,
}

struct Transaction {
    sender: String,
    params: MailParams,
    rcpts: Vec<(String, DsnRcpt)>,
}

/// Runs one session until QUIT or the end of input. `deliver` gets each message (CRLF
/// lines, dot-stuffing undone) with its envelope and answers with the reply to DATA.
pub fn run<R: BufRead, W: Write>(
    input: &mut R,
    out: &mut W,
    options: &SessionOptions,
    mut deliver: impl FnMut(&EnvelopeRequest, &[u8]) -> Reply,
) -> std::io::Result<()> {
    let send = |out: &mut W, reply: &Reply| -> std::io::Result<()> {
        out.write_all(reply.render().as_bytes())?;
        out.flush()
    };
    send(
        out,
        &Reply::plain(
            220,
            vec![format!("{} ESMTP pepsi-sendmail", options.hostname)],
        ),
    )?;
    let mut greeted: Option<bool> = None;
    let mut tx: Option<Transaction> = None;
    loop {
        let Some(line) = read_line(input, MAX_COMMAND)? else {
            return Ok(());
        };
        let Some(line) = line else {
            send(out, &Reply::new(500, "5.5.2", "command line too long"))?;
            continue;
        };
        let reply = match command::parse(&line) {
            Err(ParseError::Unknown(verb)) => {
                Reply::new(500, "5.5.1", format!("command not recognised: {verb}"))
            }
            Err(ParseError::Syntax(code, why)) => Reply::new(501, code, why),
            Ok(Command::Helo(_)) => {
                greeted = Some(false);
                tx = None;
                Reply::plain(250, vec![options.hostname.clone()])
            }
            Ok(Command::Ehlo(_)) => {
                greeted = Some(true);
                tx = None;
                Reply::plain(
                    250,
                    vec![
                        options.hostname.clone(),
                        "PIPELINING".into(),
                        format!("SIZE {}", options.limits.max_size),
                        "8BITMIME".into(),
                        "SMTPUTF8".into(),
                        "DSN".into(),
                        "ENHANCEDSTATUSCODES".into(),
                    ],
                )
            }
            Ok(Command::Mail { from, params }) => match (greeted, &tx) {
                (None, _) => Reply::new(503, "5.5.1", "send EHLO or HELO first"),
                (_, Some(_)) => Reply::new(503, "5.5.1", "a transaction is open: RSET first"),
                (Some(esmtp), None) => match params::mail_params(&params, esmtp) {
                    Err(reply) => reply,
                    Ok(p) if p.size.is_some_and(|s| s > options.limits.max_size) => Reply::new(
                        552,
                        "5.3.4",
                        format!(
                            "message exceeds the limit of {} octets",
                            options.limits.max_size
                        ),
                    ),
                    Ok(p) => {
                        tx = Some(Transaction {
                            sender: from.address.unwrap_or_default(),
                            params: p,
                            rcpts: Vec::new(),
                        });
                        Reply::new(250, "2.1.0", "sender ok")
                    }
                },
            },
            Ok(Command::Rcpt { to, params }) => match &mut tx {
                None => Reply::new(503, "5.5.1", "send MAIL first"),
                Some(t) if t.rcpts.len() >= options.limits.max_recipients => {
                    Reply::new(452, "4.5.3", "too many recipients")
                }
                Some(t) => match params::rcpt_params(&params) {
                    Err(reply) => reply,
                    Ok(p) => {
                        let address = to.address.unwrap_or_default();
                        t.rcpts.push((
                            address,
                            DsnRcpt {
                                notify: p.notify,
                                orcpt: p.orcpt,
                                ..DsnRcpt::default()
                            },
                        ));
                        Reply::new(250, "2.1.5", "recipient ok")
                    }
                },
            },
            Ok(Command::Data) => match tx.take() {
                None => Reply::new(503, "5.5.1", "send MAIL and RCPT first"),
                Some(t) if t.rcpts.is_empty() => {
                    tx = Some(t);
                    Reply::new(554, "5.5.1", "no valid recipients")
                }
                Some(t) => {
                    send(
                        out,
                        &Reply::new(354, "", "start mail input; end with <CRLF>.<CRLF>"),
                    )?;
                    match read_data(input, &options.limits)? {
                        Err(reply) => reply,
                        Ok(message) => {
                            let req = EnvelopeRequest {
                                sender: Some(t.sender),
                                recipients: t.rcpts.iter().map(|r| r.0.clone()).collect(),
                                rcpt_params: t.rcpts.into_iter().map(|r| r.1).collect(),
                                from_headers: false,
                                full_name: options.full_name.clone(),
                                notify: None,
                                ret: t.params.ret.map(|r| match r {
                                    params::Ret::Full => Ret::Full,
                                    params::Ret::Hdrs => Ret::Headers,
                                }),
                                envid: t.params.envid,
                            };
                            deliver(&req, &message)
                        }
                    }
                }
            },
            Ok(Command::Rset) => {
                tx = None;
                Reply::new(250, "2.0.0", "reset")
            }
            Ok(Command::Noop) => Reply::new(250, "2.0.0", "ok"),
            Ok(Command::Help) => Reply::new(
                214,
                "2.0.0",
                "commands: EHLO HELO MAIL RCPT DATA RSET NOOP VRFY HELP QUIT",
            ),
            Ok(Command::Vrfy) => Reply::new(
                252,
                "2.5.0",
                "cannot verify the user, but will accept the message and try",
            ),
            Ok(Command::Quit) => {
                send(out, &Reply::new(221, "2.0.0", "bye"))?;
                return Ok(());
            }
            Ok(Command::Expn | Command::StartTls | Command::Auth { .. } | Command::Bdat { .. }) => {
                Reply::new(502, "5.5.1", "command not offered by a local session")
            }
        };
        send(out, &reply)?;
    }
}

/// One line without its line end; `Ok(None)` at the end of input, `Ok(Some(None))` for a
/// line longer than `max` (read to its end and dropped).
fn read_line<R: BufRead>(input: &mut R, max: usize) -> std::io::Result<Option<Option<Vec<u8>>>> {
    let mut line = Vec::new();
    let n = std::io::Read::take(&mut *input, max as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && line.len() > max {
        let mut sink = Vec::new();
        input.read_until(b'\n', &mut sink)?;
        return Ok(Some(None));
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.len() + 2 > max {
        return Ok(Some(None));
    }
    Ok(Some(Some(line)))
}

/// The message text up to the line holding a single dot, dot-stuffing undone, CRLF line
/// ends; a reply instead when it broke a limit (the text is still read to its end).
fn read_data<R: BufRead>(
    input: &mut R,
    limits: &Limits,
) -> std::io::Result<Result<Vec<u8>, Reply>> {
    let mut message = Vec::new();
    let mut problem: Option<Reply> = None;
    loop {
        let Some(line) = read_line(input, limits.max_line)? else {
            // The end of input inside DATA: the client went away; nothing is queued.
            return Ok(Err(Reply::new(
                451,
                "4.3.0",
                "the input ended before the end of the message",
            )));
        };
        let Some(line) = line else {
            problem.get_or_insert_with(|| {
                Reply::new(
                    554,
                    "5.6.0",
                    format!("a line exceeds the limit of {} octets", limits.max_line),
                )
            });
            continue;
        };
        if line == b"." {
            return Ok(match problem {
                Some(reply) => Err(reply),
                None => Ok(message),
            });
        }
        if line.contains(&b'\r') {
            problem.get_or_insert_with(|| {
                Reply::new(554, "5.6.0", "a carriage return that does not end a line")
            });
            continue;
        }
        let text = line.strip_prefix(b".").unwrap_or(&line);
        if problem.is_none() && (message.len() + text.len() + 2) as u64 > limits.max_size {
            problem = Some(Reply::new(
                552,
                "5.3.4",
                format!("message exceeds the limit of {} octets", limits.max_size),
            ));
        }
        if problem.is_none() {
            message.extend_from_slice(text);
            message.extend_from_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SessionOptions {
        SessionOptions {
            hostname: "host.example.test".into(),
            limits: Limits {
                max_size: 100,
                max_line: 100,
                max_recipients: 2,
            },
            full_name: None,
        }
    }

    /// Runs a session over `input`; returns the reply codes (first line of each) and the
    /// messages handed over.
    fn session(input: &str) -> (Vec<String>, Vec<(EnvelopeRequest, String)>) {
        let mut out = Vec::new();
        let mut got = Vec::new();
        run(&mut input.as_bytes(), &mut out, &settings(), |req, msg| {
            got.push((req.clone(), String::from_utf8_lossy(msg).into_owned()));
            Reply::new(250, "2.0.0", "queued")
        })
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let codes = text
            .lines()
            .filter(|l| l.as_bytes().get(3) != Some(&b'-'))
            .map(|l| l[..3].to_owned())
            .collect();
        (codes, got)
    }

    #[test]
    fn a_transaction_and_the_replies_of_each_command() {
        let (codes, got) = session(
            "EHLO me\nMAIL FROM:<a@example.test> RET=HDRS ENVID=x1\n\
             RCPT TO:<b@example.org> NOTIFY=FAILURE\nRCPT TO:<c@example.org>\n\
             RCPT TO:<d@example.org>\nDATA\nSubject: s\n\n..dot\nline\n.\nNOOP\nVRFY x\n\
             EXPN x\nFOO\nQUIT\nNOOP\n",
        );
        assert_eq!(
            codes,
            [
                "220", "250", "250", "250", "250", "452", "354", "250", "250", "252", "502", "500",
                "221"
            ]
        );
        assert_eq!(got.len(), 1);
        let (req, msg) = &got[0];
        assert_eq!(msg, "Subject: s\r\n\r\n.dot\r\nline\r\n");
        assert_eq!(req.sender.as_deref(), Some("a@example.test"));
        assert_eq!(req.recipients, ["b@example.org", "c@example.org"]);
        assert_eq!(req.rcpt_params[0].notify, Some(vec!["FAILURE".into()]));
        assert_eq!(req.ret, Some(Ret::Headers));
        assert_eq!(req.envid.as_deref(), Some("x1"));
    }

    #[test]
    fn order_and_limits() {
        let (codes, got) = session(
            "MAIL FROM:<a@x.test>\nEHLO me\nRCPT TO:<b@x.test>\nDATA\nMAIL FROM:<>\n\
             MAIL FROM:<>\nDATA\nRSET\nMAIL FROM:<a@x.test> SIZE=1000\n\
             MAIL FROM:<a@x.test>\nRCPT TO:<b@x.test>\nDATA\n\
             0123456789012345678901234567890123456789012345678901234567890123456789\n\
             0123456789012345678901234567890123456789012345678901234567890123456789\n.\n",
        );
        assert_eq!(
            codes,
            [
                "220", "503", "250", "503", "503", "250", "503", "554", "250", "552", "250", "250",
                "354", "552"
            ]
        );
        assert!(got.is_empty());
        // End of input inside DATA queues nothing.
        let (codes, got) = session("HELO a\nMAIL FROM:<>\nRCPT TO:<b@x.test>\nDATA\nhalf\n");
        assert_eq!(codes, ["220", "250", "250", "250", "354", "451"]);
        assert!(got.is_empty());
    }
}

//! DATA and BDAT, and the end of a transaction: check the text, authenticate the message,
//! prepend the trace headers, store it, and only then say 250.

use super::conn::End;
use super::{Session, State, Transaction};
use crate::admission::{Accepted, AdmitError};
use crate::headers::{Trace, received, strip_forged_results};
use pepsi_contract::state::{BodyType, Dsn, DsnRcpt, Origin, OriginTls, Ret};
use pepsi_contract::telemetry::wire::{message_id_token, unix_ns};
use pepsi_contract::telemetry::{SpanId, SpanKind, SpanOutcome, SpanRecord, TraceId};
use pepsi_smtp::Reply;
use pepsi_smtp::data::{DataDecoder, DataProblem, Feed};
use pepsi_smtp::params::{self, Body};

impl Session {
    pub(super) async fn data(&mut self) -> Result<Reply, End> {
        let tx = match std::mem::replace(&mut self.state, State::Connected) {
            State::Rcpt(tx) => tx,
            other => {
                let reply = match &other {
                    State::Mail(_) => Reply::new(554, "5.5.1", "no valid recipients"),
                    State::Chunking(..) => Reply::new(503, "5.5.1", "DATA cannot follow BDAT"),
                    _ => Reply::new(503, "5.5.1", "send MAIL and RCPT before DATA"),
                };
                self.state = other;
                return Ok(reply);
            }
        };
        self.conn.reply(&Reply::new(
            354,
            "",
            "start mail input; end with <CRLF>.<CRLF>",
        ));
        let s = &self.settings;
        let mut dec = DataDecoder::dot_stuffed(s.max_message_size, s.max_line_length);
        let timeout = s.data_timeout;
        loop {
            let pending = self.conn.buffered();
            let fed = dec.feed(pending);
            self.hold(&mut dec);
            match fed {
                Feed::Done { consumed } => {
                    self.conn.consume(consumed);
                    break;
                }
                Feed::More => {
                    let n = self.conn.buffered().len();
                    self.conn.consume(n);
                    self.conn.fill(timeout).await?;
                }
            }
        }
        Ok(self.finish(tx, dec).await)
    }

    pub(super) async fn bdat(&mut self, size: u64, last: bool) -> Result<Reply, End> {
        let s = &self.settings;
        let (max_size, max_line, timeout) = (s.max_message_size, s.max_line_length, s.data_timeout);
        let (tx, mut dec) = match std::mem::replace(&mut self.state, State::Connected) {
            State::Rcpt(tx) => (Some(tx), DataDecoder::raw(max_size, max_line)),
            State::Chunking(tx, dec) => (Some(tx), dec),
            other => {
                self.state = other;
                (None, DataDecoder::raw(0, max_line))
            }
        };
        // The chunk follows the command at once (RFC 3030), so it is read whatever the
        // verdict; the decoder keeps nothing beyond the size limit.
        let mut left = size;
        while left > 0 {
            if self.conn.buffered().is_empty() {
                self.conn.fill(timeout).await?;
            }
            let pending = self.conn.buffered();
            let take = pending
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            dec.feed(&pending[..take]);
            self.hold(&mut dec);
            self.conn.consume(take);
            left -= take as u64;
        }
        let Some(tx) = tx else {
            let reply = match self.state {
                State::Mail(_) => Reply::new(554, "5.5.1", "no valid recipients"),
                _ => Reply::new(503, "5.5.1", "send MAIL and RCPT before BDAT"),
            };
            return Ok(reply);
        };
        if !last {
            self.state = State::Chunking(tx, dec);
            return Ok(Reply::new(250, "2.0.0", format!("{size} octets received")));
        }
        dec.finish_raw();
        Ok(self.finish(tx, dec).await)
    }

    /// Counts what the decoder holds against the server's MESSAGE_MEMORY; when it has no
    /// room, the message is dropped as it arrives and refused at its end.
    fn hold(&mut self, dec: &mut DataDecoder) {
        if !self.held.grow_to(dec.held()) {
            tracing::warn!(
                peer = %self.peer,
                in_use = self.shared.memory.used(),
                "MESSAGE_MEMORY exhausted: this message is refused with 452"
            );
            dec.out_of_storage();
        }
    }

    /// Ends the transaction: refuses data with a problem, stores the rest.
    async fn finish(&mut self, tx: Transaction, dec: DataDecoder) -> Reply {
        let reply = self.finish_holding(tx, dec).await;
        self.held = self.shared.memory.hold();
        reply
    }

    async fn finish_holding(&mut self, tx: Transaction, dec: DataDecoder) -> Reply {
        self.state = State::Greeted;
        let s = &self.settings;
        if let Some(problem) = dec.problem() {
            tracing::info!(peer = %self.peer, ?problem, "message refused");
            return match problem {
                DataProblem::BareLf => Reply::new(
                    554,
                    "5.6.0",
                    "bare LF in the message text; lines must end in CRLF",
                ),
                DataProblem::BareCr => Reply::new(
                    554,
                    "5.6.0",
                    "bare CR in the message text; lines must end in CRLF",
                ),
                DataProblem::NoStorage => Reply::new(
                    452,
                    "4.3.1",
                    "insufficient system storage for the message now, try again later",
                ),
                DataProblem::TooBig => Reply::new(
                    552,
                    "5.3.4",
                    format!("message exceeds the limit of {} octets", s.max_message_size),
                ),
                DataProblem::LineTooLong => Reply::new(
                    554,
                    "5.6.0",
                    format!("a line exceeds the limit of {} octets", s.max_line_length),
                ),
            };
        }
        let message = dec.into_message();
        if crate::headers::begins_with_continuation(&message) {
            tracing::info!(peer = %self.peer, "message refused: it begins with a continuation line");
            return Reply::new(
                554,
                "5.6.0",
                "the message begins with a line starting with a space or tab, which continues no \
                 header field",
            );
        }
        if let Some(reply) = self
            .author_not_owned(pepsi_contract::message::split(&message).0)
            .await
        {
            return reply;
        }
        let size = message.len();
        let limit = self.settings.admission.timeout;
        let trace = pepsi_contract::state::Trace {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
        };
        let message_id = self.shared.telemetry.is_on().then(|| {
            pepsi_contract::message::field_values(
                pepsi_contract::message::split(&message).0,
                "Message-ID",
            )
            .first()
            .and_then(|v| message_id_token(v))
        });
        // While the pipeline is behind, the message waits here (at most INFLOW_DELAY), before
        // it is stored and before ADMISSION_TIMEOUT starts.
        let held = self.shared.inflow.wait().await;
        if !held.is_zero() {
            tracing::debug!(peer = %self.peer, ?held, "held back by inflow control");
        }
        let stored = match tokio::time::timeout(limit, self.store(&tx, trace, message)).await {
            Ok(stored) => stored,
            Err(_) => {
                // The statement may still commit after this; the client's retry then
                // queues the message twice, which is better than never.
                tracing::warn!(peer = %self.peer, ?limit, "the message was not stored within ADMISSION_TIMEOUT");
                return Reply::new(
                    451,
                    "4.3.0",
                    "temporary failure storing the message, try again later",
                );
            }
        };
        match stored {
            Ok(id) => {
                tracing::info!(peer = %self.peer, id, rcpts = tx.rcpts.len(), size, "queued");
                if self.shared.telemetry.is_on() {
                    self.shared.telemetry.emit(&SpanRecord {
                        trace_id: trace.trace_id,
                        span_id: trace.span_id,
                        parent: None,
                        kind: SpanKind::Ingress,
                        program: "pepsi-ingress".into(),
                        pid: std::process::id(),
                        stage: None,
                        queue_id: Some(id),
                        message_id: message_id.flatten(),
                        start_ns: unix_ns(tx.started),
                        end_ns: unix_ns(std::time::SystemTime::now()),
                        outcome: SpanOutcome::Accepted,
                        next_stage: None,
                        fused_into: None,
                        dispatch_wait_ms: None,
                        error: None,
                        rcpt_count: u32::try_from(tx.rcpts.len()).ok(),
                        size: u64::try_from(size).ok(),
                        mail_from: tx.from.clone(),
                        rcpt_to: tx.rcpts.clone(),
                        sender_dropped: 0,
                    });
                }
                Reply::new(250, "2.0.0", format!("queued as {id}"))
            }
            Err(e) => {
                tracing::warn!(peer = %self.peer, "cannot store the message: {e}");
                Reply::new(
                    451,
                    "4.3.0",
                    "temporary failure storing the message, try again later",
                )
            }
        }
    }

    async fn store(
        &mut self,
        tx: &Transaction,
        context: pepsi_contract::state::Trace,
        message: Vec<u8>,
    ) -> Result<i64, AdmitError> {
        let s = &self.settings;
        let ip = self.peer.ip();
        let helo = self.helo.clone().unwrap_or_default();
        let mail_from = tx.from.clone().unwrap_or_default();
        let verdict = match (&self.shared.verifier, self.listener.config.verify) {
            (Some(verifier), true) => {
                if self.iprev.is_none() {
                    self.iprev = Some(verifier.iprev(ip).await);
                }
                let iprev = self.iprev.as_ref().expect("set above");
                Some(verifier.check(ip, &helo, &mail_from, iprev, &message).await)
            }
            _ => None,
        };
        let iprev = self.iprev.as_ref().map(crate::verify::iprev_state);
        let ptr = iprev.as_ref().and_then(|v| v.name.clone());
        let (headers, body) = pepsi_contract::message::split(&message);
        let body_at = message.len() - body.len();
        let date = chrono::Local::now().to_rfc2822();
        let trace = received(&Trace {
            helo: &helo,
            ptr: ptr.as_deref(),
            client_ip: ip,
            hostname: &s.hostname,
            esmtp: self.esmtp,
            utf8: tx.params.smtputf8,
            tls: self
                .tls
                .as_ref()
                .map(|t| (t.version.as_str(), t.cipher.as_str())),
            authenticated: self.auth_user.is_some(),
            single_rcpt: (tx.rcpts.len() == 1).then(|| tx.rcpts[0].as_str()),
            date: &date,
        });
        let kept = strip_forged_results(headers, &s.authserv_id, &s.strip_fields);
        let mut stored_headers = Vec::with_capacity(trace.len() + 512 + kept.len());
        stored_headers.extend_from_slice(trace.as_bytes());
        if let Some(v) = &verdict {
            stored_headers.extend_from_slice(v.header.as_bytes());
        }
        stored_headers.extend_from_slice(&kept);
        let origin = Origin {
            client_addr: Some(ip),
            helo: Some(helo),
            esmtp: self.esmtp,
            smtputf8: tx.params.smtputf8,
            body: tx.params.body.map(|b| match b {
                Body::SevenBit => BodyType::SevenBit,
                Body::EightBitMime => BodyType::EightBitMime,
            }),
            tls: self.tls.as_ref().map(|t| OriginTls {
                version: t.version.clone(),
                cipher: t.cipher.clone(),
            }),
            listener: Some(self.listener.config.name.clone()),
            iprev,
            authserv_id: Some(s.authserv_id.clone()),
            auth_user: self.auth_user.clone(),
            local: None,
        };
        let dsn = Dsn {
            ret: tx.params.ret.map(|r| match r {
                params::Ret::Full => Ret::Full,
                params::Ret::Hdrs => Ret::Headers,
            }),
            envid: tx.params.envid.clone(),
            rcpt: tx
                .rcpt_params
                .iter()
                .map(|p| DsnRcpt {
                    notify: p.notify.clone(),
                    orcpt: p.orcpt.clone(),
                    ..DsnRcpt::default()
                })
                .collect(),
            ..Dsn::default()
        };
        let mut state = serde_json::Map::new();
        origin.insert_into(&mut state);
        dsn.insert_into(&mut state);
        if let Some(v) = verdict {
            v.state.insert_into(&mut state);
        }
        context.insert_into(&mut state);
        let state = serde_json::Value::Object(state);
        self.shared
            .admitter
            .admit(Accepted {
                mail_from,
                rcpt_to: tx.rcpts.clone(),
                headers: stored_headers,
                message,
                body_at,
                state,
                auth_user: self.auth_user.clone(),
                client_addr: ip,
            })
            .await
    }
}

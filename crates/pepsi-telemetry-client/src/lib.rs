//! pepsi-telemetry-client: the telemetry agent of one Pepsi host. Every Pepsi process hands
//! each span it finishes (the ingress's SMTP transaction, each stage's pass, a pass cut
//! short) over its connection to the Unix socket `[pepsi-telemetry-client] SOCKET`
//! (`pepsi_contract::telemetry::Emitter`); this daemon takes them, turns them into
//! OpenTelemetry spans and exports them in batches to the receiver, pepsi-telemetry, over
//! OTLP/HTTP (protobuf, gzip, HTTPS, a bearer token), together with the host's metrics:
//! those the spans tell, the counters the ingress and the dispatcher report on the same
//! socket, those `/proc` tells of the Pepsi processes, and its own.
//!
//! What it must never do: make mail wait or fail (nothing waits on it: a span it cannot
//! take is the sender's to drop, one it cannot keep is its own to drop, and both are
//! counted), hold more than MAX_QUEUE + BATCH_SIZE spans (the queue and the batch in
//! flight), let one batch the receiver will never take stop the export, or let an address
//! leave the host unless ADDRESSES is on. It reads no database and no message.
//!
//! The modules: `options` (the section, and the token and CA files), `spans` (the socket
//! task, the queue and the export task, and what a refused batch becomes), `queue` (the
//! bounded queue, pure), `senders` (the drops each sender reports, pure), `convert` (the
//! privacy rule and the OpenTelemetry span, pure), `metrics` (the instruments), `procfs`
//! (the processes, parsed purely), `transport` (the HTTP client the exporters send
//! through, which keeps what a failed request met), `health` (when to log a failure and a
//! recovery, pure).

pub mod convert;
pub mod health;
pub mod metrics;
pub mod options;
pub mod procfs;
pub mod queue;
pub mod senders;
pub mod spans;
pub mod transport;

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{
    Compression, Protocol, RetryPolicy, WithExportConfig as _, WithHttpConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SpanExporter as _;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_contract::telemetry::attr;

use crate::health::Health;
use crate::metrics::{Instruments, WatchedExporter};
use crate::options::{Credentials, Options, SECTION};
use crate::spans::{Export, SpanQueue, Spans};
use crate::transport::Transport;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "telemetry-client",
        exec: "pepsi-telemetry-client",
    };
}

/// The mode of the span socket: every account in the client's group may send (the
/// services' accounts share group pepsi); the directory around it decides who reaches it.
pub const SOCKET_MODE: u32 = 0o660;

/// How long the last export at SIGTERM may take, at most.
const LAST_EXPORT: Duration = Duration::from_secs(5);

const LONG_ABOUT: &str = "\
The telemetry agent of a Pepsi host. Every Pepsi process (the ingress, the dispatcher, each \
stage worker) keeps one connection to the Unix stream socket [pepsi-telemetry-client] SOCKET \
and sends each span it finishes over it, one length-prefixed JSON record a span, without \
waiting: the SMTP transaction of the ingress, each \
stage's pass over a message, a pass cut short when its worker died. pepsi-telemetry-client \
listens on that socket (at most MAX_CONNECTIONS senders at once), keeps the spans in a queue of at most MAX_QUEUE, and exports them in \
batches of BATCH_SIZE to the receiver, pepsi-telemetry, as OpenTelemetry spans over OTLP/HTTP \
(protobuf, gzip, POST ENDPOINT/v1/traces, `Authorization: Bearer` with the token of \
TOKEN_FILE), every EXPORT_INTERVAL or as soon as a batch is full. Every METRICS_INTERVAL it \
exports the host's metrics to ENDPOINT/v1/metrics: stage pass durations and dispatch waits, \
ingress transactions, interrupted passes, the counters the ingress and the dispatcher report \
on the same socket (pepsi.ingress.*, pepsi.dispatch.*), the number and resident memory of the \
Pepsi processes (from /proc), and its own counts of spans exported and dropped.

What leaves the host: no message body, no header field but the Message-ID, and the \
envelope's addresses only with ADDRESSES = yes. With ADDRESSES = no (the default) the \
sender and recipients are dropped as each span arrives, and anything address-shaped in an \
error text is replaced by [address].

Nothing waits on the client, so mail goes on whether it runs or not. When the receiver \
cannot be reached, refuses the token (401, 403), is busy (408, 429) or fails (5xx), the batch \
goes back to the front of the queue and the next try waits longer (EXPORT_INTERVAL doubled \
each time, at most 30 seconds); the log says so once, and once again when exports work \
again. A batch the receiver will never take (400, 413 and the other 4xx) is dropped instead, \
after a 413 only once its two halves were sent on their own, and logged once per status. \
The queue never holds more than MAX_QUEUE spans: when full, the oldest spans go. Every span \
dropped is counted in the metric pepsi.telemetry.dropped_spans by reason: queue_full, \
rejected (by the receiver), malformed (a record that is no span), sender (spans a process \
could not hand over because the client was not there or its connection's buffer was full, \
as its next span reports). The memory bound is MAX_QUEUE + \
BATCH_SIZE spans: the queue and the batch in flight.

At start it refuses a configuration it cannot use: no SOCKET, ENDPOINT or TOKEN_FILE, an \
http:// ENDPOINT to a host that is not loopback, a token file it cannot read or that holds \
no token, a CA_FILE without a certificate, a SOCKET another process is bound to. A stale \
socket file is removed; the new socket gets mode 0660. SIGTERM or SIGINT stops it after one \
last export of what is queued (at most 5 seconds).

`check` reads the configuration, the token file and the CA file as the client would, looks \
at the socket's directory, and sends the receiver an empty export with the token, so a \
refused token or an unknown certificate shows before the client runs.

Exit status: 0 after SIGTERM/SIGINT, 1 when it cannot start. See docs/telemetry.md.";

const AFTER_HELP: &str = "\
CONFIGURATION ([pepsi-telemetry-client]):
  SOCKET            the Unix stream socket to listen on, where every Pepsi process sends
                    (required; /run/pepsi/telemetry.sock in the package)
  ENDPOINT          the receiver's base URL, https://host:4318 (required; http:// only to
                    a loopback host)
  TOKEN_FILE        the file holding the bearer token the receiver accepts from this host
                    (required)
  CA_FILE           a PEM trust anchor for the receiver's certificate, besides the usual roots
  HOSTNAME          the host.name exported with every span and metric (the system's name)
  ADDRESSES         yes: export the envelope's sender and recipients (default no)
  MAX_QUEUE         spans queued at most while the receiver is away (default 10000)
  MAX_CONNECTIONS   sending processes connected at once at most; one more is closed at
                    once and drops its spans (default 1024)
  BATCH_SIZE        spans per export request (default 512, at most 2048); the memory bound
                    is MAX_QUEUE + BATCH_SIZE spans (the queue and the batch in flight)
  EXPORT_INTERVAL   the longest a span waits for its batch (default 2s)
  EXPORT_TIMEOUT    one export request's deadline (default 10s)
  METRICS_INTERVAL  time between metric exports (default 15s)

EXIT STATUS:
  0  stopped by SIGTERM or SIGINT; check: everything can be used
  1  the configuration, the token file or the socket could not be used; check: the first
     problem is on stderr

EXAMPLES:
  pepsi-telemetry-client -c /etc/pepsi/pepsi.conf
  runuser -u pepsi -- pepsi-telemetry-client check

SEE ALSO:
  pepsi-telemetry(8), docs/telemetry.md";

/// Export the host's spans and metrics to pepsi-telemetry.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-telemetry-client",
    version,
    about = "Exports the spans every Pepsi process sends it, and the host's metrics, to pepsi-telemetry over OTLP/HTTP",
    long_about = LONG_ABOUT,
    after_long_help = AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Take the spans and export them with the metrics (the default when no command is given).
    Run,
    /// Check the configuration, the token and CA files, the socket's directory and the
    /// receiver; take no span.
    ///
    /// Prints one line per part checked. The receiver is sent an empty export with the
    /// token, which it takes only when it accepts the token (and the client its
    /// certificate). Exit status 0 when everything can be used, 1 with the first problem on
    /// stderr otherwise. With --offline the receiver is not asked.
    #[command(long_about)]
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Do not send anything to the receiver
    #[arg(long)]
    offline: bool,
}

/// The command line of `pepsi-telemetry-client`: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The configuration check `pepsi-config` runs over a candidate configuration: the section
/// as the client reads it at start, without the files only the client may read. Without
/// SOCKET telemetry is off and the client is not meant to run, so there is nothing to judge.
pub fn check_config(cfg: &Config) -> anyhow::Result<()> {
    if pepsi_contract::telemetry::emit::socket_path(cfg)?.is_none() {
        return Ok(());
    }
    Options::from_config(cfg).map(drop)
}

/// Entry point of the `pepsi-telemetry-client` program.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let options = Options::from_config(&cfg)?;
        match cli.command.unwrap_or(Command::Run) {
            Command::Run => serve(options).await?,
            Command::Check(a) => check(&cfg, &options, a.offline).await?,
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `check`: every part the client needs, one line each, stopping at the first that fails.
async fn check(cfg: &Config, options: &Options, offline: bool) -> anyhow::Result<()> {
    println!(
        "configuration  {}: [{SECTION}] can be used",
        cfg.file().display()
    );
    let dir = options.socket.parent().unwrap_or(Path::new("/"));
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: a NUL-terminated path; access(2) only reads it.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        bail!(
            "[{SECTION}] SOCKET {}: this account cannot create it in {}: {}",
            options.socket.display(),
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    println!(
        "socket         {}: its directory is writable",
        options.socket.display()
    );
    let credentials = Credentials::load(options)?;
    println!(
        "token          {}: a token of {} characters",
        options.token_file.display(),
        credentials.token.len()
    );
    match &options.ca_file {
        Some(ca) => println!(
            "trust          {}: {} certificate(s), besides the usual roots",
            ca.display(),
            credentials.roots.len()
        ),
        None => println!("trust          the usual roots (no CA_FILE)"),
    }
    if offline {
        return Ok(());
    }
    let transport = Transport::new(options, &credentials, tokio::runtime::Handle::current())?;
    let exporter = span_exporter(options, &transport)?;
    if let Err(e) = exporter.export(Vec::new()).await {
        let why = transport
            .take_failure()
            .map_or_else(|| e.to_string(), |f| f.text);
        bail!("receiver {}: {why}", options.endpoint.traces());
    }
    println!(
        "receiver       {}: took an empty export with this token",
        options.endpoint.traces()
    );
    Ok(())
}

/// The OTLP span exporter of `options`, sending through `transport`.
fn span_exporter(
    options: &Options,
    transport: &Transport,
) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(transport.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_compression(Compression::Gzip)
        .with_endpoint(options.endpoint.traces())
        .with_timeout(options.export_timeout)
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .context("cannot set up the span exporter")
}

/// Binds `path` for the spans: a stale socket file (no process behind it) is removed
/// first; a live one, or anything that is no socket, is left alone and refused.
pub fn bind(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "[{SECTION}] SOCKET {}: exists and is no socket; remove it or name another path",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "[{SECTION}] SOCKET {}: another process is bound to it (a pepsi-telemetry-client running already?)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| {
            format!(
                "[{SECTION}] SOCKET {}: cannot remove the stale socket",
                path.display()
            )
        })?;
    }
    let socket = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("[{SECTION}] SOCKET {}: cannot bind it", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .with_context(|| format!("[{SECTION}] SOCKET {}: cannot set its mode", path.display()))?;
    socket.set_nonblocking(true)?;
    Ok(tokio::net::UnixListener::from_std(socket)?)
}

/// The resource every span and metric point names: the service and the host.
pub fn resource(hostname: &str) -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new(attr::RESOURCE_SERVICE, attr::SERVICE_NAME),
            KeyValue::new(attr::RESOURCE_HOST, hostname.to_owned()),
        ])
        .build()
}

/// Removes the socket file when the client stops.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the client until SIGTERM or SIGINT.
pub async fn serve(options: Options) -> anyhow::Result<()> {
    let credentials = Credentials::load(&options)?;
    let transport = Transport::new(&options, &credentials, tokio::runtime::Handle::current())?;
    // Bound before the meter provider exists, so a refusal here has no exporter to stop.
    let socket = bind(&options.socket)?;
    let _socket_file = SocketFile(options.socket.clone());
    let resource = resource(&options.hostname);
    let (traces_url, metrics_url) = (options.endpoint.traces(), options.endpoint.metrics());

    let metric_transport = transport.sibling();
    let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(metric_transport.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_compression(Compression::Gzip)
        .with_endpoint(metrics_url.clone())
        .with_timeout(options.export_timeout)
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .context("cannot set up the metric exporter")?;
    let reader = PeriodicReader::builder(WatchedExporter {
        inner: metric_exporter,
        transport: metric_transport,
        endpoint: metrics_url,
        health: Health::default(),
    })
    .with_interval(options.metrics_interval)
    .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource.clone())
        .with_reader(reader)
        .build();
    let meter = provider.meter("pepsi-telemetry-client");

    let queue = Arc::new(SpanQueue::new(options.max_queue, options.batch_size));
    let waiting = queue.clone();
    let instruments = Arc::new(Instruments::new(
        &meter,
        move || waiting.len() as u64,
        PathBuf::from("/proc"),
    ));
    let spans = Arc::new(Spans {
        queue,
        instruments,
        addresses: options.addresses,
        max_queue: options.max_queue,
    });

    let mut span_exporter = span_exporter(&options, &transport)?;
    span_exporter.set_resource(&resource);
    let export = Export::new(
        span_exporter,
        transport,
        traces_url,
        options.export_interval,
        convert::scope(),
    );

    tracing::info!(
        socket = %options.socket.display(),
        endpoint = options.endpoint.base(),
        host = options.hostname,
        addresses = options.addresses,
        max_queue = options.max_queue,
        "taking spans"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let receiver = tokio::spawn(spans::receive(
        socket,
        spans.clone(),
        options.max_connections,
    ));
    let exporting = {
        let spans = spans.clone();
        tokio::spawn(async move { export.run(spans, stop_rx, LAST_EXPORT).await })
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!(
        "stopping: one last export of {} queued span(s)",
        spans.queue.len()
    );
    receiver.abort();
    let _ = stop_tx.send(true);
    let _ = exporting.await;
    // The meter provider's reader thread exports through the runtime: shut it down off the
    // runtime's threads.
    let _ = tokio::task::spawn_blocking(move || {
        if let Err(e) = provider.shutdown_with_timeout(LAST_EXPORT) {
            tracing::debug!("metrics at stop: {e}");
        }
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_check_judges_the_section_once_telemetry_is_on() {
        let check = |text: &str| {
            check_config(&Config::from_str_named(text, "t.conf").unwrap())
                .map_err(|e| format!("{e:#}"))
        };
        assert_eq!(check("[pepsi]\n"), Ok(()));
        assert_eq!(check("[pepsi-telemetry-client]\nADDRESSES = yes\n"), Ok(()));
        let e =
            check("[pepsi-telemetry-client]\nSOCKET = /run/pepsi/telemetry.sock\n").unwrap_err();
        assert!(e.contains("ENDPOINT is not set"), "{e}");
        assert_eq!(
            check(
                "[pepsi-telemetry-client]\nSOCKET = /run/pepsi/telemetry.sock\n\
                 ENDPOINT = https://t.example.org:4318\nTOKEN_FILE = /etc/pepsi/telemetry.token\n"
            ),
            Ok(())
        );
    }

    #[test]
    fn a_stale_socket_goes_a_live_one_and_other_files_stay() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spans.sock");
        let live = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, SOCKET_MODE);
        let e = format!("{:#}", bind(&path).unwrap_err());
        assert!(e.contains("another process is bound to it"), "{e}");
        drop(live);
        // The file stays behind its socket: stale, so taken over.
        assert!(path.exists());
        let _again = bind(&path).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = format!("{:#}", bind(&file).unwrap_err());
        assert!(e.contains("exists and is no socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    }
}

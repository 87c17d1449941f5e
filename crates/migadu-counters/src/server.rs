//! The `migadu_counters` daemon: start-up in the plan's order, the worker pool, the CDB
//! watcher, signals (HUP reload/reopen, TERM/INT drain) and shutdown.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use clap::Parser;
use futures_util::FutureExt;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::{self, Config, split_host_port};
use crate::domains::Domains;
use crate::http::{App, Job, Timeouts};
use crate::logging::{LogWriter, Logs};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::store::Store;
use crate::txlog::TxLog;

/// How long a replaced CDB stays open for lookups already holding it.
const OLD_CDB_GRACE: Duration = Duration::from_secs(30);
/// How long shutdown waits for notifications in flight.
const NOTIFY_WAIT: Duration = Duration::from_secs(10);
/// Upper bound for counting what is still queued at shutdown, so a dead Redis cannot hang it.
const QUEUE_DRAIN: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(
    name = "migadu_counters",
    about = "Real-time mail counting service",
    disable_version_flag = true
)]
struct Args {
    /// Config file (default: the first of /etc/migadu_counters/config.toml,
    /// /usr/local/etc/migadu_counters/config.toml)
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print version, commit and build date
    #[arg(long)]
    version: bool,
}

/// The command line of `migadu_counters` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command()
}

pub fn run() -> ExitCode {
    let argv = crate::normalize_args(std::env::args(), &["config", "version", "help"]);
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    if args.version {
        println!("migadu_counters {}", crate::version_line());
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("migadu_counters: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(daemon(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("migadu_counters: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `:5555` listens on every interface, as the Go service did.
async fn bind(addr: &str) -> Result<TcpListener> {
    let (host, port) =
        split_host_port(addr).with_context(|| format!("bad listen address {addr:?}"))?;
    let host = if host.is_empty() {
        "0.0.0.0".to_string()
    } else {
        host
    };
    TcpListener::bind((host.as_str(), port))
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

fn reload(domains: &ArcSwap<Domains>, path: &Path, max: usize, metrics: &Metrics, trigger: &str) {
    match Domains::open(path, max) {
        Ok(d) => {
            let n = d.len();
            metrics.cdb_domains.set(n as i64);
            metrics.cdb_reloads.with_label_values(&["ok"]).inc();
            let old = domains.swap(Arc::new(d));
            tokio::spawn(async move {
                tokio::time::sleep(OLD_CDB_GRACE).await;
                drop(old);
            });
            tracing::info!(path = %path.display(), domains = n, trigger, "domains cdb reloaded");
        }
        Err(e) => {
            metrics.cdb_reloads.with_label_values(&["error"]).inc();
            tracing::error!(trigger, error = %e, "domains cdb reload failed, keeping the previous one");
        }
    }
}

/// Watches the CDB's directory, since rebuilding tools replace the file by renaming over it.
fn watch(path: &Path) -> Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    use notify::Watcher;
    let (tx, rx) = mpsc::unbounded_channel();
    let name = path.file_name().map(|n| n.to_os_string());
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && !ev.kind.is_access()
            && !ev.kind.is_remove()
            && ev
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
        {
            let _ = tx.send(());
        }
    })
    .context("cannot start the cdb file watcher")?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    w.watch(&dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch {}", dir.display()))?;
    Ok((w, rx))
}

async fn daemon(args: Args) -> Result<()> {
    let path = config::discover(args.config.as_deref())?;
    let cfg: Config = config::load(&path)?;
    let logs = Arc::new(
        Logs::open(&cfg.logging.output, cfg.logging.counting_output.as_deref())
            .context("cannot open logs")?,
    );
    crate::logging::init_app_log(logs.app.clone(), &cfg.logging.format, &cfg.logging.level);
    std::panic::set_hook(Box::new(|info| {
        let bt = std::backtrace::Backtrace::force_capture();
        tracing::error!(panic = %info, backtrace = %bt, "panic");
    }));
    tracing::info!(config = %path.display(), version = %crate::version_line(), "starting");
    for warning in crate::config::exposure_warnings(&cfg) {
        tracing::warn!("{warning}");
    }

    let metrics = Arc::new(Metrics::new());
    let initial = Domains::open(&cfg.domains_cdb, cfg.max_cached_domains)?;
    metrics.cdb_domains.set(initial.len() as i64);
    tracing::info!(path = %cfg.domains_cdb.display(), domains = initial.len(), "domains cdb loaded");
    let domains = Arc::new(ArcSwap::from_pointee(initial));

    let store = Arc::new(Store::new(&cfg.redis));
    match tokio::time::timeout(Duration::from_millis(cfg.redis.timeout_ms), store.ping()).await {
        Ok(Ok(())) => tracing::info!("redis write side answers"),
        Ok(Err(e)) => tracing::warn!(error = %e, "redis write side not answering yet"),
        Err(_) => tracing::warn!("redis write side not answering yet: timeout"),
    }

    // Handlers first: a signal arriving once the ports answer must not hit the default action.
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (_watcher, mut changes) = watch(&cfg.domains_cdb)?;
    let api_listener = bind(&cfg.addr).await?;
    let admin_listener = bind(&cfg.admin_addr).await?;

    let counting_writer: Arc<LogWriter> = logs.counting.clone();
    let txlog = TxLog::new(counting_writer, cfg.logging.counting_format == "json");
    let trust = crate::notify::trust_report();
    tracing::info!(
        source = %trust.source,
        certificates = trust.certificates,
        "notification TLS trust: built-in Mozilla roots plus these certificates"
    );
    for error in &trust.errors {
        tracing::warn!(source = %trust.source, error = %error, "notification TLS trust: cannot load certificates");
    }
    let notifier = Notifier::new(
        cfg.notify.clone(),
        Duration::from_secs(1),
        metrics.clone(),
        txlog.clone(),
    )
    .map_err(anyhow::Error::msg)?;
    let (queue, rx) = mpsc::channel::<Job>(cfg.queue_size);
    let rx = Arc::new(Mutex::new(rx));
    let cidrs = cfg
        .allowed_cidrs
        .iter()
        .filter_map(|c| config::parse_network(c))
        .collect();
    let app = Arc::new(App {
        cfg: cfg.clone(),
        cidrs,
        domains: domains.clone(),
        store,
        metrics: metrics.clone(),
        notifier: notifier.clone(),
        txlog,
        queue,
    });

    let mut workers = tokio::task::JoinSet::new();
    let closing = CancellationToken::new();
    for _ in 0..cfg.workers {
        let app = app.clone();
        let rx = rx.clone();
        let closing = closing.clone();
        let batch_size = cfg.batch_size;
        workers.spawn(async move {
            let mut jobs = Vec::with_capacity(batch_size);
            loop {
                // Wait for one job, then take what else is already queued, up to the bound:
                // idle workers count a lone request at once, busy ones pipeline the backlog.
                // Once closing, take what is left without waiting, then stop.
                {
                    let mut q = rx.lock().await;
                    let first = tokio::select! {
                        biased;
                        j = q.recv() => j,
                        _ = closing.cancelled() => q.try_recv().ok(),
                    };
                    let Some(first) = first else { break };
                    jobs.push(first);
                    while jobs.len() < batch_size {
                        match q.try_recv() {
                            Ok(j) => jobs.push(j),
                            Err(_) => break,
                        }
                    }
                }
                let n = jobs.len();
                // A bug in counting must not take a worker away for good: the pool would
                // shrink until requests are accepted and never counted.
                let batch = std::mem::replace(&mut jobs, Vec::with_capacity(batch_size));
                if let Err(panic) = AssertUnwindSafe(app.count_batch(batch)).catch_unwind().await {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!(reason = %what, requests = n, "counting panicked, the rest of the batch abandoned; worker kept");
                }
            }
        });
    }

    let stop = CancellationToken::new();
    let timeouts = Timeouts {
        read_header: Duration::from_secs(cfg.read_header_timeout),
        write: Duration::from_secs(cfg.write_timeout),
        idle: Duration::from_secs(cfg.idle_timeout),
    };
    let api = tokio::spawn(crate::http::serve(
        api_listener,
        timeouts,
        stop.clone(),
        crate::http::api_router(app.clone()),
    ));
    let admin = tokio::spawn(crate::http::serve(
        admin_listener,
        timeouts,
        stop.clone(),
        crate::http::admin_router(app.clone()),
    ));
    tracing::info!(addr = %cfg.addr, admin_addr = %cfg.admin_addr, workers = cfg.workers, batch_size = cfg.batch_size, "listening");

    loop {
        tokio::select! {
            _ = hup.recv() => {
                if let Err(e) = logs.reopen() {
                    tracing::error!(error = %e, "cannot reopen logs");
                }
                tracing::info!("logs reopened");
                reload(&domains, &cfg.domains_cdb, cfg.max_cached_domains, &metrics, "SIGHUP");
            }
            Some(()) = changes.recv() => {
                // Let a writer finish its burst of events before reading the file.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while changes.try_recv().is_ok() {}
                reload(&domains, &cfg.domains_cdb, cfg.max_cached_domains, &metrics, "file change");
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    tracing::info!("stopping: draining requests in flight");
    stop.cancel();
    let _ = api.await;
    let _ = admin.await;
    tracing::info!(
        queued = app.queue.max_capacity() - app.queue.capacity(),
        "counting what is still queued"
    );
    closing.cancel();
    if tokio::time::timeout(QUEUE_DRAIN, async {
        while workers.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::error!(
            "queued counting work not finished after {}s, abandoned",
            QUEUE_DRAIN.as_secs()
        );
    }
    tracing::info!(
        in_flight = notifier.in_flight(),
        "waiting for notifications in flight"
    );
    let abandoned = notifier.wait(NOTIFY_WAIT).await;
    if abandoned > 0 {
        tracing::warn!(
            abandoned,
            "notifications still in flight after {}s, abandoned",
            NOTIFY_WAIT.as_secs()
        );
    }
    tracing::info!("stopped");
    Ok(())
}

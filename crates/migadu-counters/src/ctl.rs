//! `counterctl`: shows an address's or a domain's counters for a UTC day by asking the running
//! service's `GET /counters`, so key building and limit resolution live in one place.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::NaiveDate;
use clap::Parser;
use serde_json::Value;

use crate::config::{DEFAULT_PATHS, ENV_AUTH_TOKEN};
use crate::validate::parse_iso_date;

/// Counters expire after this many days; older dates can only show zeros.
const KEPT_DAYS: i64 = 31;

#[derive(Parser, Debug)]
#[command(
    name = "counterctl",
    about = "Show migadu_counters counters for an address or a domain",
    disable_version_flag = true
)]
struct Args {
    /// Address to show (A, D and O levels)
    #[arg(long)]
    address: Option<String>,
    /// Domain to show (D and O levels)
    #[arg(long)]
    domain: Option<String>,
    /// UTC day, YYYY-MM-DD (default: today)
    #[arg(long)]
    date: Option<String>,
    /// Print the service's JSON answer unchanged
    #[arg(long)]
    json: bool,
    /// Config file to read addr and auth_token from
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Service URL, overriding the config's addr
    #[arg(long)]
    url: Option<String>,
    /// Print version, commit and build date
    #[arg(long)]
    version: bool,
}

/// A usage or runtime failure: message for stderr, exit 1.
struct Fail(String);

/// The command line of `counterctl` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command()
}

pub fn run() -> ExitCode {
    let argv = crate::normalize_args(
        std::env::args(),
        &[
            "address", "domain", "date", "json", "config", "url", "version", "help",
        ],
    );
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    if args.version {
        println!("counterctl {}", crate::version_line());
        return ExitCode::SUCCESS;
    }
    match main(args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(Fail(msg)) => {
            eprintln!("counterctl: {msg}");
            ExitCode::from(1)
        }
    }
}

/// The date to ask for, and a warning when its keys have expired.
pub fn check_date(
    raw: Option<&str>,
    today: NaiveDate,
) -> Result<(NaiveDate, Option<String>), String> {
    let Some(raw) = raw else {
        return Ok((today, None));
    };
    let date =
        parse_iso_date(raw).ok_or_else(|| format!("bad --date {raw:?}: expected YYYY-MM-DD"))?;
    if date > today {
        return Err(format!(
            "bad --date {raw}: in the future (today is {today} UTC)"
        ));
    }
    let warning = ((today - date).num_days() > KEPT_DAYS).then(|| {
        format!("warning: {raw} is more than {KEPT_DAYS} days ago; its counters have expired and read as 0")
    });
    Ok((date, warning))
}

/// `:5555` → `http://localhost:5555`; a bare `host:port` gets `http://`; URLs stay.
pub fn service_url(addr: &str) -> String {
    let a = addr.trim().trim_end_matches('/');
    if a.starts_with("http://") || a.starts_with("https://") {
        return a.to_string();
    }
    if let Some(port) = a.strip_prefix(':') {
        return format!("http://localhost:{port}");
    }
    for any in ["0.0.0.0:", "[::]:"] {
        if let Some(port) = a.strip_prefix(any) {
            return format!("http://localhost:{port}");
        }
    }
    format!("http://{a}")
}

/// True for loopback hosts, where a plain-text token does not leave the machine.
pub fn is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or("");
    let host = if let Some(h) = hostport.strip_prefix('[') {
        h.split(']').next().unwrap_or("")
    } else {
        hostport.rsplit_once(':').map_or(hostport, |(h, _)| h)
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Aligned columns: each at least 6 wide and 2 wider than its widest cell.
    fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                let w = self
                    .rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0);
                (w + 2).max(6)
            })
            .collect();
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                if i + 1 == r.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}", w = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The human view of a `/counters` answer.
pub fn render(resp: &Value) -> String {
    let mut out = format!(
        "{}   date {} (UTC)   domain {}   org {}\n",
        cell(&resp["query"]),
        cell(&resp["date"]),
        cell(&resp["domain"]),
        cell(&resp["org_id"])
    );
    let mut rows = vec![
        ["LEVEL", "ID", "IN", "LIMIT", "OUT", "LIMIT"]
            .map(String::from)
            .to_vec(),
    ];
    for l in resp["levels"].as_array().into_iter().flatten() {
        let count = |v: &str, lim: &str| {
            let n = l[v].as_i64().unwrap_or(0);
            let over = l[lim].as_i64().is_some_and(|limit| n >= limit);
            format!("{n}{}", if over { "!" } else { "" })
        };
        rows.push(vec![
            cell(&l["level"]),
            cell(&l["id"]),
            count("in", "in_limit"),
            cell(&l["in_limit"]),
            count("out", "out_limit"),
            cell(&l["out_limit"]),
        ]);
    }
    out.push_str(&Table { rows }.render());
    if resp["managed"] == Value::Bool(false) {
        out.push_str("domain is not in rspamd_domains_db (not counted)\n");
    }
    if resp["exempt"] == Value::Bool(true) {
        out.push_str("address is exempt from counting\n");
    }
    out
}

/// Reads `addr` and `auth_token` only, so a config with newer keys still works here.
fn read_config(explicit: Option<&PathBuf>) -> Result<(Option<String>, Option<String>), Fail> {
    let path = match explicit {
        Some(p) => Some(p.clone()),
        None => DEFAULT_PATHS.iter().map(PathBuf::from).find(|p| p.exists()),
    };
    let Some(path) = path else {
        return Ok((None, None));
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Fail(format!("cannot read config {}: {e}", path.display())))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        Fail(format!(
            "config {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })?;
    let get = |k: &str| table.get(k).and_then(|v| v.as_str()).map(str::to_string);
    Ok((get("addr"), get("auth_token")))
}

fn main(args: Args) -> Result<String, Fail> {
    let query = match (&args.address, &args.domain) {
        (Some(a), None) => ("address", a.trim().to_string()),
        (None, Some(d)) => ("domain", d.trim().to_string()),
        _ => {
            return Err(Fail(
                "exactly one of --address or --domain is required".into(),
            ));
        }
    };
    let today = chrono::Utc::now().date_naive();
    let (date, warning) = check_date(args.date.as_deref(), today).map_err(Fail)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    let (addr, file_token) = read_config(args.config.as_ref())?;
    let token = std::env::var(ENV_AUTH_TOKEN)
        .ok()
        .filter(|t| !t.is_empty())
        .or(file_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Fail(format!(
                "no auth_token: none in the config and {ENV_AUTH_TOKEN} is unset"
            ))
        })?;
    let base = match (&args.url, &addr) {
        (Some(u), _) => service_url(u),
        (None, Some(a)) => service_url(a),
        (None, None) => service_url(":5555"),
    };
    if !is_local(&base) && base.starts_with("http://") {
        eprintln!("warning: {base} is not local; the bearer token travels in plain text");
    }
    let url = format!(
        "{base}/counters?{}={}&date={}",
        query.0,
        crate::notify::query_escape(&query.1),
        date.format("%Y-%m-%d")
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail(format!("cannot start runtime: {e}")))?;
    let (status, body) = rt.block_on(async {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Fail(format!("http client: {e}")))?;
        let resp = client
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .map_err(|e| Fail(format!("service unreachable at {base}: {e}")))?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| Fail(format!("reading the answer of {base}: {e}")))?;
        Ok::<_, Fail>((status, body))
    })?;
    if status != reqwest::StatusCode::OK {
        let why = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| body.trim().to_string());
        return Err(Fail(format!("service answered {}: {why}", status.as_u16())));
    }
    if args.json {
        return Ok(if body.ends_with('\n') {
            body
        } else {
            format!("{body}\n")
        });
    }
    let v: Value = serde_json::from_str(&body)
        .map_err(|e| Fail(format!("unexpected answer from {base}: {e}")))?;
    Ok(render(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dates() {
        let today = NaiveDate::from_ymd_opt(2026, 10, 13).unwrap();
        assert_eq!(check_date(None, today).unwrap(), (today, None));
        assert_eq!(
            check_date(Some("2026-10-12"), today).unwrap().0,
            today.pred_opt().unwrap()
        );
        assert!(check_date(Some("2026-09-12"), today).unwrap().1.is_none());
        assert!(
            check_date(Some("2026-09-01"), today)
                .unwrap()
                .1
                .unwrap()
                .contains("expired")
        );
        assert!(
            check_date(Some("2099-01-01"), today)
                .unwrap_err()
                .contains("future")
        );
        assert!(
            check_date(Some("13.10.2026"), today)
                .unwrap_err()
                .contains("YYYY-MM-DD")
        );
        assert!(check_date(Some("2026-13-01"), today).is_err());
    }

    #[test]
    fn urls() {
        let cases = [
            (":5555", "http://localhost:5555"),
            ("0.0.0.0:5555", "http://localhost:5555"),
            ("127.0.0.1:5555", "http://127.0.0.1:5555"),
            ("10.0.0.5:5555", "http://10.0.0.5:5555"),
            ("https://c.example/", "https://c.example"),
        ];
        for (a, want) in cases {
            assert_eq!(service_url(a), want);
        }
        assert!(is_local("http://localhost:5555"));
        assert!(is_local("http://127.0.0.1:5555"));
        assert!(is_local("http://[::1]:5555"));
        assert!(!is_local("http://10.0.0.5:5555"));
        assert!(!is_local("http://counters.example"));
    }

    #[test]
    fn table() {
        let resp = json!({ "query": "me@dimitrijedimitrijevic.com", "mode": "address", "date": "2026-10-13",
          "managed": true, "exempt": false, "domain": "dimitrijedimitrijevic.com", "org_id": 1234,
          "levels": [
            {"level": "A", "id": "me@dimitrijedimitrijevic.com", "in": 12, "in_limit": 500, "out": 3, "out_limit": 200},
            {"level": "D", "id": "dimitrijedimitrijevic.com", "in": 40, "in_limit": 1000, "out": 400, "out_limit": 400},
            {"level": "O", "id": "1234", "in": 120, "in_limit": null, "out": 30, "out_limit": 1000} ] });
        let want = "\
me@dimitrijedimitrijevic.com   date 2026-10-13 (UTC)   domain dimitrijedimitrijevic.com   org 1234
LEVEL  ID                            IN    LIMIT  OUT   LIMIT
A      me@dimitrijedimitrijevic.com  12    500    3     200
D      dimitrijedimitrijevic.com     40    1000   400!  400
O      1234                          120   -      30    1000
";
        assert_eq!(render(&resp), want);
        let unmanaged = json!({"query": "x@gmail.com", "date": "2026-10-13", "managed": false, "exempt": true,
            "domain": "gmail.com", "org_id": null, "levels": []});
        let out = render(&unmanaged);
        assert!(
            out.starts_with("x@gmail.com   date 2026-10-13 (UTC)   domain gmail.com   org -\n")
        );
        assert!(out.contains("domain is not in rspamd_domains_db (not counted)\n"));
        assert!(out.ends_with("address is exempt from counting\n"));
    }
}

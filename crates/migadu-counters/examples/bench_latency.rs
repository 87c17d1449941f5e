//! Benchmark: latency from request to counted, below saturation.
//!
//! A paced (open-loop) loader sends `POST /out` at a fixed rate, each request for a new address
//! `<tag>-<i>@bench.example`, so each one increments a fresh A key. A watcher on its own thread
//! and its own Redis connection turns on keyspace notifications (`CONFIG SET
//! notify-keyspace-events KEA`), subscribes to `__keyevent@0__:incr*` (INCR reports as
//! `incrby`) and timestamps the first increment of every A key. Latency = increment seen −
//! the moment the request was due to be sent (its slot in the schedule), so a loader falling
//! behind adds to the figure instead of hiding it. Prints one JSON line.
//!
//! usage: bench_latency <api host:port> <token> <redis host:port> <rate/s> <seconds> <tag> [connections=32]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

fn line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut s = String::new();
    if r.read_line(&mut s)? == 0 {
        return Err(std::io::Error::other("redis closed the connection"));
    }
    Ok(s.trim_end().to_string())
}

/// Reads one RESP value as a flat list of strings (enough for pub/sub messages).
fn read_flat(r: &mut impl BufRead, out: &mut Vec<String>) -> std::io::Result<()> {
    let l = line(r)?;
    let (kind, rest) = l.split_at(1);
    match kind {
        "*" => {
            for _ in 0..rest.parse::<i64>().unwrap_or(0).max(0) {
                read_flat(r, out)?;
            }
        }
        "$" => {
            let n: i64 = rest.parse().unwrap_or(-1);
            if n >= 0 {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                out.push(String::from_utf8_lossy(&buf).into_owned());
            }
        }
        "-" => return Err(std::io::Error::other(format!("redis: {rest}"))),
        _ => out.push(rest.to_string()),
    }
    Ok(())
}

fn command(s: &mut TcpStream, args: &[&str]) -> std::io::Result<()> {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The schedule every connection follows.
struct Plan {
    api: String,
    token: String,
    tag: String,
    conns: usize,
    n: usize,
    start: Instant,
    period: Duration,
}

/// One keep-alive connection sending requests `k, k+conns, k+2·conns, …` on schedule.
async fn connection(plan: Arc<Plan>, k: usize) -> anyhow::Result<(usize, Duration)> {
    let Plan {
        api,
        token,
        tag,
        conns,
        n,
        start,
        period,
    } = &*plan;
    let (conns, n, start, period) = (*conns, *n, *start, *period);
    let stream = tokio::net::TcpStream::connect(&api).await?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    let (mut bad, mut behind) = (0, Duration::ZERO);
    let mut i = k;
    while i < n {
        let due = start + period * i as u32;
        tokio::time::sleep_until(due.into()).await;
        behind = behind.max(Instant::now().saturating_duration_since(due));
        let body = format!(
            r#"{{"trace_id":"{tag}-{i}","auth_user":"{tag}-{i}@bench.example","recipient":"s@gmail.com"}}"#
        );
        let req = format!(
            "POST /out HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        wr.write_all(req.as_bytes()).await?;
        let mut status = 0;
        let mut len = 0usize;
        let mut first = true;
        loop {
            let mut l = String::new();
            if rd.read_line(&mut l).await? == 0 {
                anyhow::bail!("the service closed the connection");
            }
            let l = l.trim_end();
            if first {
                status = l.split_whitespace().nth(1).unwrap_or("0").parse()?;
                first = false;
            } else if l.is_empty() {
                break;
            } else if let Some((h, v)) = l.split_once(':')
                && h.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse()?;
            }
        }
        let mut body = vec![0; len];
        rd.read_exact(&mut body).await?;
        if status != 202 {
            bad += 1;
        }
        i += conns;
    }
    Ok((bad, behind))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, api, token, redis, rate, secs, tag, rest @ ..] = args.as_slice() else {
        anyhow::bail!(
            "usage: bench_latency <api host:port> <token> <redis host:port> <rate/s> <seconds> <tag> [connections=32]"
        );
    };
    let rate: f64 = rate.parse()?;
    let secs: f64 = secs.parse()?;
    let conns: usize = rest.first().map(|c| c.parse()).transpose()?.unwrap_or(32);
    let n = (rate * secs).round() as usize;
    let date = chrono::Utc::now()
        .date_naive()
        .format("%Y-%m-%d")
        .to_string();
    let index: HashMap<String, usize> = (0..n)
        .map(|i| (format!("cnt/A/{tag}-{i}@bench.example/d/{date}/o"), i))
        .collect();

    // the watcher: subscribed before the first request goes out
    let seen: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
    {
        let mut c = TcpStream::connect(redis)?;
        command(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"])?;
        read_flat(&mut BufReader::new(&mut c), &mut Vec::new())?;
    }
    let mut sub = TcpStream::connect(redis)?;
    command(&mut sub, &["PSUBSCRIBE", "__keyevent@0__:incr*"])?;
    let mut sub = BufReader::new(sub);
    let mut ack = Vec::new();
    read_flat(&mut sub, &mut ack)?;
    anyhow::ensure!(
        ack.first().map(String::as_str) == Some("psubscribe"),
        "{ack:?}"
    );
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut msg = Vec::new();
            loop {
                msg.clear();
                if read_flat(&mut sub, &mut msg).is_err() {
                    return;
                }
                let now = Instant::now();
                // pmessage <pattern> <channel> <key>
                if let [kind, _, _, key] = msg.as_slice()
                    && kind == "pmessage"
                    && let Some(&i) = index.get(key)
                {
                    let mut s = seen.lock().expect("seen");
                    if s[i].is_none() {
                        s[i] = Some(now);
                    }
                }
            }
        });
    }

    let period = Duration::from_secs_f64(1.0 / rate);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let start = Instant::now() + Duration::from_millis(200);
    let (bad, behind) = rt.block_on(async {
        let plan = Arc::new(Plan {
            api: api.clone(),
            token: token.clone(),
            tag: tag.clone(),
            conns,
            n,
            start,
            period,
        });
        let mut tasks = Vec::new();
        for k in 0..conns.min(n.max(1)) {
            tasks.push(tokio::spawn(connection(plan.clone(), k)));
        }
        let (mut bad, mut behind) = (0, Duration::ZERO);
        for t in tasks {
            let (b, l) = t.await??;
            bad += b;
            behind = behind.max(l);
        }
        anyhow::Ok((bad, behind))
    })?;
    let sent_done = Instant::now();

    // every key seen, or 30 s of silence after the last request
    let deadline = sent_done + Duration::from_secs(30);
    while Instant::now() < deadline && seen.lock().expect("seen").iter().any(Option::is_none) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = seen.lock().expect("seen").clone();
    let mut lat: Vec<f64> = seen
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.map(|t| {
                (t.saturating_duration_since(start + period * i as u32)).as_secs_f64() * 1000.0
            })
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let send_secs = (sent_done - start).as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "rate": rate,
            "seconds": secs,
            "connections": conns,
            "sent": n,
            "sent_per_second": n as f64 / send_secs,
            "non_202": bad,
            "seen": lat.len(),
            "missing": n - lat.len(),
            "max_behind_schedule_ms": behind.as_secs_f64() * 1000.0,
            "p50_ms": percentile(&lat, 50.0),
            "p99_ms": percentile(&lat, 99.0),
            "max_ms": lat.last().copied().unwrap_or(f64::NAN),
        })
    );
    // the watcher thread blocks on its socket; the process ends here
    std::process::exit(0)
}

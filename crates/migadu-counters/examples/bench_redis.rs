//! Benchmark reference: the counting transaction of one `/out` request (MULTI, INCR + EXPIRE on
//! the A, D and O keys, EXEC) issued straight to Redis by N concurrent tasks, without HTTP,
//! queue or CDB. Prints transactions per second and latency percentiles as one JSON line.
//!
//! usage: bench_redis <host:port> <concurrency> <seconds>

use std::time::{Duration, Instant};

use migadu_counters::counting::{KEY_TTL_SECONDS, counter_key};
use migadu_counters::domains::{Flow, Level};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (addr, conc, secs) = match args.as_slice() {
        [_, a, c, s] => (a.clone(), c.parse::<usize>()?, s.parse::<u64>()?),
        _ => anyhow::bail!("usage: bench_redis <host:port> <concurrency> <seconds>"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = redis::Client::open(format!("redis://{addr}/0"))?;
        let date = chrono::Utc::now().date_naive();
        let keys: Vec<String> = [(Level::A, "ref@bench.example"), (Level::D, "bench.example"), (Level::O, "4242")]
            .into_iter()
            .map(|(l, id)| counter_key(l, id, date, Flow::Out))
            .collect();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for k in &keys {
            pipe.cmd("INCR").arg(k);
            pipe.cmd("EXPIRE").arg(k).arg(KEY_TTL_SECONDS).ignore();
        }
        let end = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let mut con = client.get_multiplexed_async_connection().await?;
            let pipe = pipe.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    let _: Vec<i64> = pipe.query_async(&mut con).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, redis::RedisError>(lat)
            }));
        }
        let started = Instant::now();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        let elapsed = started.elapsed().as_secs_f64();
        all.sort();
        let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        println!(
            "{{\"transactions\":{},\"seconds\":{elapsed:.3},\"per_second\":{:.0},\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
            all.len(),
            all.len() as f64 / elapsed,
            pct(0.50),
            pct(0.99)
        );
        Ok(())
    })
}

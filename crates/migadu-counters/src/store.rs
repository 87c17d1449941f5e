//! Redis access: a write side (static address or the Sentinel master, following failover) and
//! a read side (round-robin static replicas, or a Sentinel replica with fallback to the
//! master); one MULTI/EXEC per counted request, the transactions of a counting worker's batch
//! pipelined on one connection of the worker's own (`redis_conn`); one MGET per `/counters`
//! read and per re-read after lost replies, on the `redis` crate's connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Value,
};
use tokio::sync::Mutex;

use crate::config::{RedisConfig, split_host_port};
use crate::counting::{KEY_TTL_SECONDS, KeyResult};
use crate::redis_conn::Conn;
use crate::resp::TxOutcome;

/// How a node address is found.
#[derive(Clone, Debug)]
enum Locate {
    Fixed(String),
    SentinelMaster,
    SentinelReplica,
}

/// A set of multiplexed connections to one logical node, connected lazily, dropped on error.
struct Pool {
    locate: Locate,
    slots: Vec<Mutex<Option<MultiplexedConnection>>>,
    next: AtomicUsize,
}

impl Pool {
    fn new(locate: Locate, size: usize) -> Pool {
        Pool {
            locate,
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }
}

/// Errors of the counting transaction.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Nothing reached Redis, or Redis refused the whole transaction.
    #[error("{0}")]
    NotApplied(String),
}

pub struct Store {
    write: Pool,
    /// The counting connections to the write side, each held by one worker for a batch.
    counting: Vec<Mutex<Option<Conn>>>,
    next_counting: AtomicUsize,
    reads: Vec<Pool>,
    next_read: AtomicUsize,
    sentinels: Vec<String>,
    master_name: String,
    password: String,
    sentinel_password: String,
    timeout: Duration,
}

fn conn_info(addr: &str, password: &str) -> redis::RedisResult<redis::ConnectionInfo> {
    let (host, port) = split_host_port(addr).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "bad address",
            addr.to_string(),
        ))
    })?;
    let mut settings = RedisConnectionInfo::default().set_db(0);
    if !password.is_empty() {
        settings = settings.set_password(password);
    }
    Ok(ConnectionAddr::Tcp(host, port)
        .into_connection_info()?
        .set_redis_settings(settings))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Picks usable replicas out of a `SENTINEL replicas` reply.
fn healthy_replicas(reply: &Value) -> Vec<String> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in items {
        let fields: Vec<(String, String)> = match item {
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|c| Some((text(c.first()?)?, text(c.get(1)?)?)))
                .collect(),
            Value::Map(m) => m
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
                .collect(),
            _ => continue,
        };
        let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let flags = get("flags").unwrap_or("");
        let down = ["s_down", "o_down", "disconnected"]
            .iter()
            .any(|f| flags.contains(f));
        if down || get("master-link-status").is_some_and(|s| s != "ok") {
            continue;
        }
        if let (Some(ip), Some(port)) = (get("ip"), get("port")) {
            out.push(format!("{ip}:{port}"));
        }
    }
    out
}

/// What one transaction did: per-key results, and whether they were re-read after a lost
/// reply.
pub type TxResult = Result<(Vec<KeyResult>, bool), StoreError>;

/// Turns the values re-read for lost transactions (their keys in order, concatenated) into
/// their results. A key shared by several of them shows its value in each, but only the last
/// of them (the one Redis ran last, if it ran them) may see a crossing in it: the others get
/// `KeyResult::Seen`. A key absent on the master was not counted.
fn reread_results<K: AsRef<str>>(
    txs: &[Vec<K>],
    lost: &[(usize, String)],
    vals: Vec<Option<i64>>,
) -> Vec<(usize, TxResult)> {
    let mut claimed = std::collections::HashSet::new();
    let mut vals = vals.into_iter().rev();
    let mut out: Vec<(usize, TxResult)> = lost
        .iter()
        .rev()
        .map(|(i, why)| {
            let mut results: Vec<KeyResult> = txs[*i]
                .iter()
                .rev()
                .map(|k| match vals.next().flatten() {
                    Some(n) if claimed.insert(k.as_ref()) => KeyResult::Counted(n),
                    Some(n) => KeyResult::Seen(n),
                    None => KeyResult::Failed(format!("{why}; key absent on re-read")),
                })
                .collect();
            results.reverse();
            (*i, Ok((results, true)))
        })
        .collect();
    out.reverse();
    out
}

impl Store {
    pub fn new(c: &RedisConfig) -> Store {
        let size = c.pool_size.max(1);
        let (write, reads) = if c.sentinels.is_empty() {
            let reads = if c.read_addrs.is_empty() {
                vec![c.write_addr.clone()]
            } else {
                c.read_addrs.clone()
            };
            (
                Pool::new(Locate::Fixed(c.write_addr.clone()), size),
                reads
                    .into_iter()
                    .map(|a| Pool::new(Locate::Fixed(a), size))
                    .collect(),
            )
        } else {
            (
                Pool::new(Locate::SentinelMaster, size),
                vec![Pool::new(Locate::SentinelReplica, size)],
            )
        };
        Store {
            write,
            counting: (0..size).map(|_| Mutex::new(None)).collect(),
            next_counting: AtomicUsize::new(0),
            reads,
            next_read: AtomicUsize::new(0),
            sentinels: c.sentinels.clone(),
            master_name: c.master_name.clone(),
            password: c.password.clone(),
            sentinel_password: c.sentinel_password.clone(),
            timeout: Duration::from_millis(c.timeout_ms),
        }
    }

    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }

    async fn connect(
        &self,
        addr: &str,
        password: &str,
    ) -> redis::RedisResult<MultiplexedConnection> {
        Client::open(conn_info(addr, password)?)?
            .get_multiplexed_async_connection_with_config(&self.config())
            .await
    }

    /// Asks each sentinel in turn; the first answer wins.
    async fn ask_sentinels(&self, args: &[&str]) -> redis::RedisResult<Value> {
        let mut last = None;
        for s in &self.sentinels {
            match self.connect(s, &self.sentinel_password).await {
                Ok(mut con) => match redis::cmd("SENTINEL")
                    .arg(args)
                    .query_async::<Value>(&mut con)
                    .await
                {
                    Ok(Value::Nil) => {
                        last = Some(redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "sentinel does not know the master",
                            self.master_name.clone(),
                        )))
                    }
                    Ok(v) => return Ok(v),
                    Err(e) => last = Some(e),
                },
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| (redis::ErrorKind::Client, "no sentinels configured").into()))
    }

    async fn master_addr(&self) -> redis::RedisResult<String> {
        let v = self
            .ask_sentinels(&["get-master-addr-by-name", &self.master_name])
            .await?;
        match v {
            Value::Array(a) if a.len() == 2 => match (text(&a[0]), text(&a[1])) {
                (Some(ip), Some(port)) => Ok(format!("{ip}:{port}")),
                _ => Err((redis::ErrorKind::Client, "malformed sentinel reply").into()),
            },
            _ => Err((redis::ErrorKind::Client, "malformed sentinel reply").into()),
        }
    }

    async fn open(&self, locate: &Locate) -> redis::RedisResult<MultiplexedConnection> {
        match locate {
            Locate::Fixed(a) => self.connect(a, &self.password).await,
            Locate::SentinelMaster => {
                let addr = self.master_addr().await?;
                let mut con = self.connect(&addr, &self.password).await?;
                // A sentinel can lag behind a failover; a node that is not master would refuse writes.
                let role: Value = redis::cmd("ROLE").query_async(&mut con).await?;
                match role {
                    Value::Array(a) if a.first().and_then(text).as_deref() == Some("master") => {
                        Ok(con)
                    }
                    _ => Err((
                        redis::ErrorKind::Client,
                        "sentinel master is not master",
                        addr,
                    )
                        .into()),
                }
            }
            Locate::SentinelReplica => {
                let replicas = match self.ask_sentinels(&["replicas", &self.master_name]).await {
                    Ok(v) => healthy_replicas(&v),
                    Err(_) => Vec::new(),
                };
                let start = self.next_read.fetch_add(1, Ordering::Relaxed);
                for i in 0..replicas.len() {
                    let addr = &replicas[(start + i) % replicas.len()];
                    if let Ok(con) = self.connect(addr, &self.password).await {
                        return Ok(con);
                    }
                }
                let addr = self.master_addr().await?;
                self.connect(&addr, &self.password).await
            }
        }
    }

    async fn take(&self, pool: &Pool) -> redis::RedisResult<(usize, MultiplexedConnection)> {
        let i = pool.next.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        self.take_at(pool, i).await
    }

    /// The connection of slot `i`, opened when the slot is empty.
    async fn take_at(
        &self,
        pool: &Pool,
        i: usize,
    ) -> redis::RedisResult<(usize, MultiplexedConnection)> {
        let mut slot = pool.slots[i].lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok((i, c.clone()));
        }
        let c = self.open(&pool.locate).await?;
        *slot = Some(c.clone());
        Ok((i, c))
    }

    async fn drop_slot(&self, pool: &Pool, i: usize) {
        *pool.slots[i].lock().await = None;
    }

    /// A counting connection to the write side, opened anew: in Sentinel mode the current
    /// master, checked to be one.
    async fn open_counting(&self) -> Result<Conn, String> {
        let (addr, want_master) = match &self.write.locate {
            Locate::Fixed(a) => (a.clone(), false),
            _ => (self.master_addr().await.map_err(|e| e.to_string())?, true),
        };
        Conn::open(&addr, &self.password, want_master, self.timeout)
            .await
            .map_err(|e| e.to_string())
    }

    /// A counting slot: `again` when retrying on it, else the first one free from a
    /// round-robin start, else that start's once it is free.
    async fn counting_slot(
        &self,
        again: Option<usize>,
    ) -> (usize, tokio::sync::MutexGuard<'_, Option<Conn>>) {
        if let Some(i) = again {
            return (i, self.counting[i].lock().await);
        }
        let n = self.counting.len();
        let start = self.next_counting.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let i = (start + k) % n;
            if let Ok(guard) = self.counting[i].try_lock() {
                return (i, guard);
            }
        }
        (start, self.counting[start].lock().await)
    }

    /// One MULTI/EXEC per entry of `txs`, all written together on one counting connection
    /// and their replies read in order, each transaction with a reply of its own. The result
    /// has one entry per transaction, in order:
    ///
    /// - a reply: the new values (`Counted`) or the key's own error (`Failed`);
    /// - no reply because the connection failed or timed out after sending (Redis may or may
    ///   not have run it): never sent again, its keys are re-read from the master (`reread`);
    /// - refused as a whole (not connected, `EXECABORT` from a demoted master): it certainly
    ///   changed nothing and is sent once more on a fresh connection, else `NotApplied`.
    ///
    /// `budget` bounds the wait for connections and replies, and the replies are awaited for
    /// at most the Redis `timeout_ms` after sending; a transaction whose reply misses either
    /// counts as lost.
    pub async fn incr_batch(&self, txs: &[Vec<&str>], budget: Duration) -> Vec<TxResult> {
        let deadline = tokio::time::Instant::now() + budget;
        let late = || format!("timeout after {}s", budget.as_secs_f64());
        let mut out: Vec<Option<TxResult>> = txs.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..txs.len()).collect();
        let mut lost: Vec<(usize, String)> = Vec::new();
        let mut last = String::new();
        // The second attempt reopens the slot of the first, which was dropped: a fresh
        // connection, located anew (in Sentinel mode, the current master).
        let mut retry_slot = None;
        for _ in 0..2 {
            if todo.is_empty() {
                break;
            }
            let Ok((slot, mut held)) =
                tokio::time::timeout_at(deadline, self.counting_slot(retry_slot)).await
            else {
                last = late();
                break;
            };
            retry_slot = Some(slot);
            if held.is_none() {
                match tokio::time::timeout_at(deadline, self.open_counting()).await {
                    Ok(Ok(c)) => *held = Some(c),
                    Ok(Err(e)) => {
                        last = e;
                        continue;
                    }
                    Err(_) => {
                        last = late();
                        break;
                    }
                }
            }
            let Some(conn) = held.as_mut() else { continue };
            let batch: Vec<&[&str]> = todo.iter().map(|&i| txs[i].as_slice()).collect();
            let mut got = Vec::with_capacity(batch.len());
            let replies_by = deadline.min(tokio::time::Instant::now() + self.timeout);
            let why = match tokio::time::timeout_at(
                replies_by,
                conn.count(&batch, KEY_TTL_SECONDS, &mut got),
            )
            .await
            {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) if replies_by < deadline => {
                    Some(format!("no reply within {}s", self.timeout.as_secs_f64()))
                }
                Err(_) => Some(late()),
            };
            let mut refused = Vec::new();
            let mut outcomes = got.into_iter();
            for &i in &todo {
                match outcomes.next() {
                    Some(TxOutcome::Done(results)) => out[i] = Some(Ok((results, false))),
                    Some(TxOutcome::Refused(e)) => {
                        last = e;
                        refused.push(i);
                    }
                    None => lost.push((i, why.clone().unwrap_or_default())),
                }
            }
            if why.is_some() || !refused.is_empty() {
                *held = None;
            }
            todo = refused;
        }
        if !lost.is_empty() {
            for (i, r) in self.reread(txs, &lost).await {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::NotApplied(last.clone()))))
            .collect()
    }

    /// After lost EXEC replies the increments may or may not have happened; the master knows.
    /// One MGET for all of them.
    async fn reread(&self, txs: &[Vec<&str>], lost: &[(usize, String)]) -> Vec<(usize, TxResult)> {
        let keys: Vec<&str> = lost
            .iter()
            .flat_map(|(i, _)| txs[*i].iter().copied())
            .collect();
        match self.mget_on(&self.write, &keys).await {
            Ok(vals) => reread_results(txs, lost, vals),
            Err(e) => lost
                .iter()
                .map(|(i, why)| {
                    (
                        *i,
                        Err(StoreError::NotApplied(format!(
                            "{why}; re-read failed: {e}"
                        ))),
                    )
                })
                .collect(),
        }
    }

    async fn mget_on<K: redis::ToRedisArgs + Sync>(
        &self,
        pool: &Pool,
        keys: &[K],
    ) -> redis::RedisResult<Vec<Option<i64>>> {
        let (slot, mut con) = self.take(pool).await?;
        let res: redis::RedisResult<Vec<Option<String>>> =
            redis::cmd("MGET").arg(keys).query_async(&mut con).await;
        match res {
            Ok(v) => Ok(v
                .into_iter()
                .map(|s| s.and_then(|s| s.parse::<i64>().ok()))
                .collect()),
            Err(e) => {
                self.drop_slot(pool, slot).await;
                Err(e)
            }
        }
    }

    /// Reads counters from the read side, falling back to the write side when it fails.
    pub async fn mget(&self, keys: &[String]) -> redis::RedisResult<Vec<Option<i64>>> {
        let i = self.next_read.fetch_add(1, Ordering::Relaxed) % self.reads.len();
        match self.mget_on(&self.reads[i], keys).await {
            Ok(v) => Ok(v),
            Err(_) => self.mget_on(&self.write, keys).await,
        }
    }

    /// PING on the write side.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let (slot, mut con) = self.take(&self.write).await?;
        let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut con).await;
        if r.is_err() {
            self.drop_slot(&self.write, slot).await;
        }
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replica_selection_skips_unhealthy() {
        let entry = |ip: &str, flags: &str, link: &str| {
            Value::Array(vec![
                bulk("ip"),
                bulk(ip),
                bulk("port"),
                bulk("6380"),
                bulk("flags"),
                bulk(flags),
                bulk("master-link-status"),
                bulk(link),
            ])
        };
        let reply = Value::Array(vec![
            entry("10.0.0.1", "slave", "ok"),
            entry("10.0.0.2", "s_down,slave", "ok"),
            entry("10.0.0.3", "slave,disconnected", "ok"),
            entry("10.0.0.4", "slave", "err"),
        ]);
        assert_eq!(healthy_replicas(&reply), vec!["10.0.0.1:6380"]);
        assert!(healthy_replicas(&Value::Nil).is_empty());
    }

    #[test]
    fn a_key_re_read_for_several_lost_transactions_can_cross_in_the_last_only() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        // transaction 1 had its reply; 0, 2 and 3 lost theirs and share the key "d"
        let txs = [
            keys(&["a0", "d"]),
            keys(&["a1", "d"]),
            keys(&["a2", "d"]),
            keys(&["a3", "x"]),
        ];
        let lost = [(0, "t0".to_string()), (2, "t2".into()), (3, "t3".into())];
        let vals = vec![Some(1), Some(7), Some(1), Some(7), None, Some(9)];
        let got: Vec<(usize, Vec<KeyResult>)> = reread_results(&txs, &lost, vals)
            .into_iter()
            .map(|(i, r)| {
                let (results, reread) = r.unwrap();
                assert!(reread);
                (i, results)
            })
            .collect();
        use KeyResult::*;
        assert_eq!(
            got,
            vec![
                (0, vec![Counted(1), Seen(7)]),
                (2, vec![Counted(1), Counted(7)]),
                (
                    3,
                    vec![Failed("t3; key absent on re-read".into()), Counted(9)]
                ),
            ]
        );
    }
}

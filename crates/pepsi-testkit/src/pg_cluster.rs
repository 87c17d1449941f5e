//! A private PostgreSQL primary with a streaming standby made by `pg_basebackup -R`, for the
//! failover tests (docs/ha.md, "PostgreSQL"): synchronous (`synchronous_standby_names = '*'`,
//! `synchronous_commit = on`: a commit returns once the standby has the WAL) or asynchronous.
//! Both servers listen on loopback ports of their own; a test puts a [`crate::proxy::Proxy`]
//! in front and repoints it after `promote`, as HAProxy does on Patroni's `/primary` check.
//!
//! The servers run as the `postgres` account when the tests run as root (initdb and postgres
//! refuse root), else as the current user. Both are stopped and their data removed on drop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::{Connection as _, PgConnection};
use tokio::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    Synchronous,
    Asynchronous,
}

/// One server of the pair: its data directory and port.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: &'static str,
    pub data: PathBuf,
    pub port: u16,
}

pub struct PgCluster {
    pub primary: Node,
    pub standby: Node,
    pub replication: Replication,
    bin: PathBuf,
    user: String,
    as_postgres: bool,
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// initdb, start the primary, base-backup the standby from it, start the standby and
    /// wait until it streams (and, synchronous, until the primary counts it as `sync`).
    pub async fn start(replication: Replication) -> PgCluster {
        let bin = bindir();
        let as_postgres = is_root();
        let user = if as_postgres {
            "postgres".to_string()
        } else {
            std::env::var("USER").unwrap_or_else(|_| "postgres".into())
        };
        let dir = tempfile::tempdir().expect("cluster directory");
        let cluster = PgCluster {
            primary: Node {
                name: "primary",
                data: dir.path().join("primary"),
                port: free_port(),
            },
            standby: Node {
                name: "standby",
                data: dir.path().join("standby"),
                port: free_port(),
            },
            replication,
            bin,
            user,
            as_postgres,
            dir,
        };
        if as_postgres {
            chown_postgres(cluster.dir.path());
        }
        cluster
            .run(
                "initdb",
                &[
                    "-D",
                    path(&cluster.primary.data),
                    "-U",
                    &cluster.user,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ],
            )
            .await;
        let sync = match replication {
            Replication::Synchronous => "synchronous_standby_names = '*'\n",
            Replication::Asynchronous => "synchronous_standby_names = ''\n",
        };
        append(
            &cluster.primary.data.join("postgresql.conf"),
            &format!(
                "wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = '64MB'\n\
                 synchronous_commit = on\n{sync}fsync = off\nmax_connections = 200\n\
                 listen_addresses = '127.0.0.1'\nunix_socket_directories = '{dir}'\n",
                dir = cluster.dir.path().display()
            ),
        );
        cluster.start_node(&cluster.primary).await;
        cluster
            .run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &cluster.primary.port.to_string(),
                    "-U",
                    &cluster.user,
                    "-D",
                    path(&cluster.standby.data),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                ],
            )
            .await;
        cluster.start_node(&cluster.standby).await;
        cluster.wait_streaming().await;
        cluster
    }

    /// `postgres://<user>@127.0.0.1:<port>/<database>`.
    pub fn url(&self, port: u16, database: &str) -> String {
        format!("postgres://{}@127.0.0.1:{port}/{database}", self.user)
    }

    /// Starts `node` (again) on its port.
    pub async fn start_node(&self, node: &Node) {
        let log = self.dir.path().join(format!("{}.log", node.name));
        self.run(
            "pg_ctl",
            &[
                "-D",
                path(&node.data),
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "-o",
                &format!("-p {}", node.port),
                "start",
            ],
        )
        .await;
    }

    /// `pg_ctl stop -m immediate`: the server's processes end at once, as in a crash; what
    /// it had not sent to the standby is gone with it.
    pub async fn stop_immediately(&self, node: &Node) {
        self.run(
            "pg_ctl",
            &["-D", path(&node.data), "-m", "immediate", "-w", "stop"],
        )
        .await;
    }

    /// `pg_ctl promote -w`: the standby ends recovery and accepts writes. It has no standby
    /// of its own, so it stops waiting for one (`synchronous_standby_names = ''`, which its
    /// base backup copied from the primary): as Patroni's `synchronous_mode` does when no
    /// synchronous standby is left (`synchronous_mode_strict` off). Otherwise every commit
    /// on it would wait until a new standby streams from it.
    pub async fn promote(&self) {
        self.run("pg_ctl", &["-D", path(&self.standby.data), "-w", "promote"])
            .await;
        let mut conn = PgConnection::connect(&self.url(self.standby.port, "postgres"))
            .await
            .expect("connect to the promoted standby");
        for sql in [
            "ALTER SYSTEM SET synchronous_standby_names = ''",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        conn.close().await.ok();
    }

    /// The server log of `node`, for a failing test's message.
    pub fn log(&self, node: &Node) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", node.name)))
            .unwrap_or_default()
    }

    /// Waits until the primary lists the standby as streaming, and as `sync` when the
    /// replication is synchronous.
    pub async fn wait_streaming(&self) {
        let want = match self.replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut conn) =
                PgConnection::connect(&self.url(self.primary.port, "postgres")).await
            {
                let state: Option<(String, String)> =
                    sqlx::query_as("SELECT state, sync_state FROM pg_stat_replication LIMIT 1")
                        .fetch_optional(&mut conn)
                        .await
                        .ok()
                        .flatten();
                conn.close().await.ok();
                if let Some((state, sync)) = state
                    && state == "streaming"
                    && sync == want
                {
                    return;
                }
            }
            assert!(
                Instant::now() < until,
                "the standby does not stream ({want}) after 60 s:\n{}\n{}",
                self.log(&self.primary),
                self.log(&self.standby)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn wait_replayed(&self) {
        let mut conn = PgConnection::connect(&self.url(self.primary.port, "postgres"))
            .await
            .expect("connect to the primary");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let caught_up: Option<bool> = sqlx::query_scalar(
                "SELECT replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication LIMIT 1",
            )
            .fetch_optional(&mut conn)
            .await
            .expect("read pg_stat_replication")
            .flatten();
            if caught_up == Some(true) {
                conn.close().await.ok();
                return;
            }
            assert!(
                Instant::now() < until,
                "the standby has not replayed the primary's WAL after 60 s:\n{}",
                self.log(&self.standby)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn run(&self, program: &str, args: &[&str]) {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for node in [&self.primary, &self.standby] {
            if !node.data.join("postmaster.pid").exists() {
                continue;
            }
            let exe = self.bin.join("pg_ctl");
            let mut cmd = if self.as_postgres {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&exe);
                c
            } else {
                std::process::Command::new(&exe)
            };
            let _ = cmd
                .args(["-D", path(&node.data), "-m", "immediate", "-w", "stop"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin`, else the directory of `initdb` on PATH.
fn bindir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        })
        .expect("no PostgreSQL server programs (initdb, pg_ctl, pg_basebackup): install postgresql")
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

fn chown_postgres(dir: &Path) {
    let ok = std::process::Command::new("chown")
        .arg("postgres")
        .arg(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "cannot give {} to the postgres account (does it exist?)",
        dir.display()
    );
}

fn append(file: &Path, text: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    f.write_all(text.as_bytes()).unwrap();
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

//! migadu_counters in Sentinel mode (its own master, replica and sentinel on loopback ports:
//! reads from the replica, writes following a failover, fallback to the master) and in static
//! mode with several read addresses.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use migadu_counters_testkit::{
    Daemon, DaemonSetup, RedisServer, Resp, TempDir, free_port, redis_cmd, wait_until,
};

const BIN: &str = env!("CARGO_BIN_EXE_migadu_counters");
const ROWS: &[(&str, &str)] = &[("example.com", "1|A/o=100")];

/// A sentinel process, killed on drop.
struct Sentinel {
    port: u16,
    child: Child,
    _dir: TempDir,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
        let dir = TempDir::new("sentinel");
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(&conf, format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 4000\n",
            dir.path().display()
        )).unwrap();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        assert!(wait_until(Duration::from_secs(20), || matches!(
            redis_cmd(&addr, &["PING"]),
            Ok(Resp::Simple(_))
        )));
        Sentinel {
            port,
            child,
            _dir: dir,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn master_port(&self) -> Option<u16> {
        match redis_cmd(
            &self.addr(),
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        ) {
            Ok(Resp::Array(a)) if a.len() == 2 => a[1].int().map(|p| p as u16),
            _ => None,
        }
    }

    fn knows_replica(&self, port: u16) -> bool {
        let Ok(Resp::Array(rs)) = redis_cmd(&self.addr(), &["SENTINEL", "replicas", "mymaster"])
        else {
            return false;
        };
        rs.iter().any(|r| {
            let Resp::Array(f) = r else { return false };
            let get = |k: &str| {
                f.chunks(2)
                    .find(|c| c[0] == Resp::Bulk(Some(k.into())))
                    .and_then(|c| match &c[1] {
                        Resp::Bulk(Some(v)) => Some(v.clone()),
                        _ => None,
                    })
            };
            get("port") == Some(port.to_string())
                && get("flags")
                    .is_some_and(|fl| !fl.contains("down") && !fl.contains("disconnected"))
        })
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mget_calls(r: &RedisServer) -> i64 {
    let Resp::Bulk(Some(info)) = r.cmd(&["INFO", "commandstats"]) else {
        return 0;
    };
    info.lines()
        .find(|l| l.starts_with("cmdstat_mget:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn replica_of(master: &RedisServer) -> RedisServer {
    let port = master.port.to_string();
    let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    assert!(wait_until(
        Duration::from_secs(20),
        || matches!(r.cmd(&["INFO", "replication"]), Resp::Bulk(Some(i)) if i.contains("master_link_status:up"))
    ));
    r
}

fn key() -> String {
    format!(
        "cnt/A/x@example.com/d/{}/o",
        chrono::Utc::now().date_naive().format("%Y-%m-%d")
    )
}

fn send(d: &Daemon, t: &str) {
    let r = d.post(
        "/out",
        &format!(r#"{{"trace_id":"{t}","auth_user":"x@example.com","recipient":"s@gmail.com"}}"#),
    );
    assert_eq!(r.status, 202, "{}", r.body);
}

#[test]
fn sentinel_mode_reads_replicas_and_writes_follow_a_failover() {
    let mut master = RedisServer::start();
    let replica = replica_of(&master);
    let sentinel = Sentinel::start(master.port);
    assert!(
        wait_until(Duration::from_secs(30), || sentinel
            .knows_replica(replica.port)),
        "sentinel never saw the replica"
    );
    let extra = format!(
        "master_name = \"mymaster\"\nsentinels = [\"{}\"]\n",
        sentinel.addr()
    );
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: "",
            rows: ROWS,
            redis_extra: &extra,
            ..Default::default()
        },
    );

    for i in 0..3 {
        send(&d, &format!("s{i}"));
    }
    assert!(wait_until(Duration::from_secs(20), || master.get(&key()) == Some(3)));
    assert!(wait_until(Duration::from_secs(20), || replica.get(&key()) == Some(3)));
    let before = mget_calls(&master);
    let v = d.get_counters("address=x@example.com");
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.json()["levels"][0]["out"], 3);
    assert!(
        mget_calls(&replica) >= 1,
        "the read did not go to the replica"
    );
    assert_eq!(mget_calls(&master), before, "the read went to the master");

    // the master dies; the sentinel promotes the replica; writes follow without a restart
    master.kill();
    assert!(
        wait_until(Duration::from_secs(60), || sentinel.master_port()
            == Some(replica.port)),
        "no failover"
    );
    let mut n = 0;
    let counted = wait_until(Duration::from_secs(60), || {
        n += 1;
        send(&d, &format!("f{n}"));
        std::thread::sleep(Duration::from_millis(200));
        replica.get(&key()).is_some_and(|v| v > 3)
    });
    assert!(counted, "writes did not follow the failover: {}", d.logs());
    assert!(wait_until(Duration::from_secs(20), || {
        migadu_counters_testkit::http(&d.admin, "GET", "/health", &[], b"")
            .is_ok_and(|r| r.status == 200)
    }));
}

#[test]
fn sentinel_reads_fall_back_to_the_master_without_replicas() {
    let master = RedisServer::start();
    let sentinel = Sentinel::start(master.port);
    let extra = format!(
        "master_name = \"mymaster\"\nsentinels = [\"127.0.0.1:{}\", \"{}\"]\n",
        free_port(),
        sentinel.addr()
    );
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: "",
            rows: ROWS,
            redis_extra: &extra,
            ..Default::default()
        },
    );
    send(&d, "m1");
    assert!(wait_until(Duration::from_secs(20), || master.get(&key()) == Some(1)));
    let v = d.get_counters("address=x@example.com");
    assert_eq!(v.status, 200, "{}", v.body);
    assert_eq!(v.json()["levels"][0]["out"], 1);
    assert!(mget_calls(&master) >= 1);
}

#[test]
fn static_mode_round_robins_reads_and_falls_back_to_the_write_address() {
    let master = RedisServer::start();
    let (r1, r2) = (replica_of(&master), replica_of(&master));
    let extra = format!("read_addrs = [\"{}\", \"{}\"]\n", r1.addr(), r2.addr());
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &master.addr(),
            rows: ROWS,
            redis_extra: &extra,
            ..Default::default()
        },
    );
    for _ in 0..4 {
        assert_eq!(d.get_counters("address=x@example.com").status, 200);
    }
    assert!(
        mget_calls(&r1) >= 1 && mget_calls(&r2) >= 1,
        "reads not spread: {} {}",
        mget_calls(&r1),
        mget_calls(&r2)
    );
    assert_eq!(mget_calls(&master), 0);

    let extra = format!("read_addrs = [\"127.0.0.1:{}\"]\n", free_port());
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &master.addr(),
            rows: ROWS,
            redis_extra: &extra,
            ..Default::default()
        },
    );
    let v = d.get_counters("address=x@example.com");
    assert_eq!(v.status, 200, "{}", v.body);
    assert!(mget_calls(&master) >= 1);
}

//! The host's Pepsi processes as `/proc` shows them: how many run of each program and how
//! much memory they hold resident. A process is Pepsi's when the file name of its argv[0]
//! starts with `pepsi-` or is `migadu_counters` (the unified binary runs under its programs'
//! names, so argv[0] names the program whichever file holds the code). The parsing is pure
//! (`program_name`, `rss_bytes`, `tally`), the reading of `/proc` a thin loop around it.

use std::collections::BTreeMap;
use std::path::Path;

/// The processes of one program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub count: u64,
    /// The sum of their resident set sizes, in bytes.
    pub rss: u64,
}

/// The program a process runs, from its `/proc/PID/cmdline` (the arguments, each ended by a
/// NUL): the file name of argv[0] when that is a Pepsi program's.
pub fn program_name(cmdline: &[u8]) -> Option<String> {
    let argv0 = cmdline.split(|&b| b == 0).next()?;
    let name = argv0.rsplit(|&b| b == b'/').next()?;
    let name = std::str::from_utf8(name).ok()?;
    let pepsi = name.len() > "pepsi-".len() && name.starts_with("pepsi-");
    (pepsi || name == "migadu_counters").then(|| name.to_owned())
}

/// The resident set size in bytes, from `/proc/PID/status` (its `VmRSS:` line, in kB).
pub fn rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut words = line.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Counts the processes `(cmdline, status)` by program. A process without a `VmRSS` line
/// (a zombie) is counted with no memory.
pub fn tally<'a>(
    processes: impl IntoIterator<Item = (&'a [u8], &'a str)>,
) -> BTreeMap<String, Usage> {
    let mut out: BTreeMap<String, Usage> = BTreeMap::new();
    for (cmdline, status) in processes {
        let Some(name) = program_name(cmdline) else {
            continue;
        };
        let usage = out.entry(name).or_default();
        usage.count += 1;
        usage.rss += rss_bytes(status).unwrap_or(0);
    }
    out
}

/// The Pepsi processes under `proc` (`/proc`). A process that ends while it is read is
/// left out.
pub fn scan(proc: &Path) -> BTreeMap<String, Usage> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return BTreeMap::new();
    };
    let mut read: Vec<(Vec<u8>, String)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        if program_name(&cmdline).is_none() {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        read.push((cmdline, status));
    }
    tally(read.iter().map(|(c, s)| (c.as_slice(), s.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names() {
        let cases: [(&[u8], Option<&str>); 10] = [
            (
                b"/usr/bin/pepsi-ingress\0-c\0/etc/pepsi/pepsi.conf\0",
                Some("pepsi-ingress"),
            ),
            (b"pepsi-stage-route\0worker\0", Some("pepsi-stage-route")),
            (
                b"/usr/libexec/pepsi/pepsi-dispatch\0",
                Some("pepsi-dispatch"),
            ),
            (b"migadu_counters\0", Some("migadu_counters")),
            (b"/usr/libexec/pepsi/pepsi\0pepsi-queue\0", None),
            (b"pepsi-\0", None),
            (b"/usr/sbin/postgres\0", None),
            (b"/bin/bash\0/usr/bin/pepsi-x\0", None),
            (b"", None),
            (b"/x/pepsi-\xff\0", None),
        ];
        for (cmdline, want) in cases {
            assert_eq!(program_name(cmdline).as_deref(), want, "{cmdline:?}");
        }
    }

    #[test]
    fn resident_sizes() {
        let cases = [
            (
                "Name:\tx\nVmRSS:\t   12345 kB\nThreads:\t1\n",
                Some(12345 * 1024),
            ),
            ("VmRSS:\t0 kB\n", Some(0)),
            ("Name:\tkworker\nThreads:\t1\n", None),
            ("VmRSS:\tlots kB\n", None),
            ("VmRSS:\t12 MB\n", None),
            ("VmRSS:\n", None),
        ];
        for (status, want) in cases {
            assert_eq!(rss_bytes(status), want, "{status:?}");
        }
    }

    #[test]
    fn processes_counted_by_program() {
        let procs: [(&[u8], &str); 5] = [
            (b"pepsi-stage-route\0worker\0", "VmRSS:\t100 kB\n"),
            (b"/usr/bin/pepsi-stage-route\0worker\0", "VmRSS:\t50 kB\n"),
            (b"pepsi-dispatch\0", "VmRSS:\t1000 kB\n"),
            (b"/usr/bin/python3\0", "VmRSS:\t9999 kB\n"),
            (b"pepsi-ingress\0", "State:\tZ (zombie)\n"),
        ];
        let got = tally(procs);
        let want: BTreeMap<String, Usage> = [
            (
                "pepsi-dispatch",
                Usage {
                    count: 1,
                    rss: 1_024_000,
                },
            ),
            ("pepsi-ingress", Usage { count: 1, rss: 0 }),
            (
                "pepsi-stage-route",
                Usage {
                    count: 2,
                    rss: 153_600,
                },
            ),
        ]
        .into_iter()
        .map(|(n, u)| (n.to_owned(), u))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_scan_reads_pid_directories_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scan(dir.path()).is_empty());
        std::fs::create_dir(dir.path().join("42")).unwrap();
        std::fs::write(dir.path().join("42/cmdline"), b"/usr/bin/pepsi-ingress\0").unwrap();
        std::fs::write(dir.path().join("42/status"), "VmRSS:\t8 kB\n").unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        assert_eq!(
            scan(dir.path()).get("pepsi-ingress"),
            Some(&Usage {
                count: 1,
                rss: 8192
            })
        );
    }
}

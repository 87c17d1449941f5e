//! Embeds the commit and build date that `-version` prints; "unknown" when git is unavailable.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Days since 1970-01-01 to a civil date (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn main() {
    let commit = std::env::var("MIGADU_COUNTERS_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // SOURCE_DATE_EPOCH keeps reproducible builds reproducible.
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs() as i64)
        });
    let date = secs.map_or_else(
        || "unknown".to_string(),
        |s| {
            let (y, m, d) = civil(s.div_euclid(86_400));
            let t = s.rem_euclid(86_400);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                t / 3600,
                t / 60 % 60,
                t % 60
            )
        },
    );
    let version = std::env::var("MIGADU_COUNTERS_VERSION")
        .unwrap_or_else(|_| std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    println!("cargo:rustc-env=MIGADU_COUNTERS_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=MIGADU_COUNTERS_BUILD_DATE={date}");
    println!("cargo:rustc-env=MIGADU_COUNTERS_BUILD_VERSION={version}");
    println!("cargo:rerun-if-env-changed=MIGADU_COUNTERS_COMMIT");
    println!("cargo:rerun-if-env-changed=MIGADU_COUNTERS_VERSION");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        println!("cargo:rerun-if-changed={git_dir}/refs/heads");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

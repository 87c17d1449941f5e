//! The workspace's shape, as `cargo metadata` reports it: no tool or daemon links a stage
//! crate as a library, the crate graph has no cycle (dev-dependencies included, which Cargo
//! allows), and no crate imports one of a layer above it.
//!
//! The layers, bottom up: `pepsi-smtp` (the protocol), `pepsi-conf` (configuration, no
//! database), `pepsi-contract` (the stage contract), `pepsi-outbound` and `pepsi-admin` (side
//! by side: what the delivery stages share, what the tools share; neither imports the other),
//! every other `pepsi-*` crate (stages, helpers, tools, daemons, test support), and
//! the root package `pepsi` (the programs' mains, the registry and the integration tests).
//! `migadu-*` (the counters daemon and its test support) stand beside them: they import no
//! Pepsi crate and only the root package imports them.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

use crate::support::root;

/// The root package, the one crate allowed to link everything (the unified binary folds the
/// stages in).
const ROOT: &str = "pepsi";

/// Where a crate sits; a crate may import only crates of a lower layer (or, in the middle
/// layer, its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Protocol,
    Conf,
    Contract,
    /// `pepsi-outbound` and `pepsi-admin`: one layer, so neither may import the other.
    Shared,
    Middle,
    Root,
    /// Beside the Pepsi layers: imports none of them, imported only by the root package.
    Counters,
}

fn layer(name: &str) -> Layer {
    match name {
        "pepsi-smtp" => Layer::Protocol,
        "pepsi-conf" => Layer::Conf,
        "pepsi-contract" => Layer::Contract,
        "pepsi-outbound" | "pepsi-admin" => Layer::Shared,
        ROOT => Layer::Root,
        n if n.starts_with("migadu-") => Layer::Counters,
        _ => Layer::Middle,
    }
}

/// The crates under the stages' prefix that are no stage: `pepsi-stage-validate` judges the
/// stage graph from the tables the root package passes in and links no stage crate, so the
/// tools and the dispatcher may link it.
const NOT_STAGES: &[&str] = &["pepsi-stage-validate"];

fn is_stage(name: &str) -> bool {
    name.starts_with("pepsi-stage-") && !NOT_STAGES.contains(&name)
}

/// One dependency of a workspace crate on another: `from` imports `to`, as a normal, build
/// or dev dependency (`kind`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    kind: String,
}

impl std::fmt::Display for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {} ({})", self.from, self.to, self.kind)
    }
}

/// The workspace's packages, from the real `cargo metadata`.
fn metadata() -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(root().join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON")
}

/// The edges between the workspace's crates, from the real `cargo metadata`.
fn workspace_edges() -> Vec<Edge> {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("package name"))
        .collect();
    assert!(
        names.contains(ROOT) && names.contains("pepsi-contract") && names.len() > 10,
        "cargo metadata lists the workspace: {names:?}"
    );
    let mut edges = Vec::new();
    for p in packages {
        let from = p["name"].as_str().unwrap();
        for d in p["dependencies"].as_array().expect("dependencies") {
            let to = d["name"].as_str().unwrap();
            if names.contains(to) {
                edges.push(Edge {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    kind: d["kind"].as_str().unwrap_or("normal").to_owned(),
                });
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

/// Edges by which a crate other than a stage and the root package links a stage crate.
fn stage_links(edges: &[Edge]) -> Vec<&Edge> {
    edges
        .iter()
        .filter(|e| is_stage(&e.to) && !is_stage(&e.from) && e.from != ROOT)
        .collect()
}

/// Edges by which a stage links `pepsi-admin`, which holds what only the tools and
/// pepsi-httpd may do.
fn stage_admin_links(edges: &[Edge]) -> Vec<&Edge> {
    edges
        .iter()
        .filter(|e| is_stage(&e.from) && e.to == "pepsi-admin")
        .collect()
}

/// Edges by which a crate imports one of a layer above it (or one beside the Pepsi layers).
fn upward_imports(edges: &[Edge]) -> Vec<&Edge> {
    edges
        .iter()
        .filter(|e| {
            let (from, to) = (layer(&e.from), layer(&e.to));
            match (from, to) {
                (Layer::Counters, Layer::Counters) | (Layer::Root, _) => false,
                (Layer::Counters, _) | (_, Layer::Counters) => true,
                (Layer::Middle, Layer::Middle) => false,
                _ => to >= from,
            }
        })
        .collect()
}

/// A cycle of the graph (every kind of edge), as the crates along it with the first repeated
/// at the end; `None` when the graph has none.
fn find_cycle(edges: &[Edge]) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().push(&e.to);
    }
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        marks: &mut BTreeMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| *n == node).unwrap();
                let mut cycle: Vec<String> = path[start..].iter().map(|n| n.to_string()).collect();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node, Mark::Open);
        path.push(node);
        for to in next.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(to, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    let starts: Vec<&str> = next.keys().copied().collect();
    for start in starts {
        if let Some(cycle) = visit(start, &next, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

fn list(edges: &[&Edge]) -> String {
    edges.iter().map(|e| format!("\n  {e}")).collect()
}

#[test]
fn no_tool_or_daemon_links_a_stage_crate() {
    let edges = workspace_edges();
    let bad = stage_links(&edges);
    assert!(
        bad.is_empty(),
        "crates other than stages and the root package link stage crates (move what they \
         share below the stages):{}",
        list(&bad)
    );
}

#[test]
fn no_stage_links_the_administration_crate() {
    let edges = workspace_edges();
    let bad = stage_admin_links(&edges);
    assert!(
        bad.is_empty(),
        "stages link pepsi-admin (what a stage needs belongs in pepsi-contract or \
         pepsi-outbound):{}",
        list(&bad)
    );
}

#[test]
fn the_crate_graph_has_no_cycle() {
    let edges = workspace_edges();
    assert_eq!(
        find_cycle(&edges),
        None,
        "a cycle among the workspace's crates"
    );
}

#[test]
fn no_crate_imports_a_layer_above_it() {
    let edges = workspace_edges();
    let bad = upward_imports(&edges);
    assert!(
        bad.is_empty(),
        "imports of a higher layer (pepsi-smtp < pepsi-conf < pepsi-contract < \
         pepsi-outbound, pepsi-admin < other pepsi-* < pepsi; \
         migadu-* beside):{}",
        list(&bad)
    );
}

/// The crates a package links (its normal dependencies, by name), from `cargo metadata`.
fn linked(meta: &Value, package: &str) -> Vec<String> {
    let p = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("{package} is in the workspace"));
    p["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Of `linked`, the database clients and the Pepsi crates not in `allowed`.
fn beyond<'a>(linked: &'a [String], allowed: &[&str]) -> Vec<&'a str> {
    linked
        .iter()
        .map(String::as_str)
        .filter(|n| {
            ["sqlx", "postgres", "tokio-postgres"].contains(n)
                || (n.starts_with("pepsi-") && !allowed.contains(n))
        })
        .collect()
}

/// The configuration crate opens no database and links no other Pepsi crate; the set-user-id
/// helpers (the Maildir writer, the `.forward` reader, the postage payer) link nothing above
/// it but the wire crate, so no database client runs with their privilege.
#[test]
fn the_configuration_crate_and_the_setuid_helpers_link_no_database() {
    let meta = metadata();
    let conf = linked(&meta, "pepsi-conf");
    assert!(
        conf.iter().any(|n| n == "idna"),
        "the dependencies are read: {conf:?}"
    );
    assert_eq!(
        beyond(&conf, &[]),
        Vec::<&str>::new(),
        "pepsi-conf links these"
    );
    for helper in [
        "pepsi-helper-maildir-writer",
        "pepsi-helper-dot-forward",
        "pepsi-helper-auto-pay",
    ] {
        let links = linked(&meta, helper);
        assert_eq!(
            beyond(&links, &["pepsi-conf", "pepsi-smtp"]),
            Vec::<&str>::new(),
            "{helper} links these"
        );
    }
}

/// The checks above find what they look for, on graphs and lists made to hold it.
#[test]
fn the_checks_find_what_they_look_for() {
    let e = |from: &str, to: &str, kind: &str| Edge {
        from: from.into(),
        to: to.into(),
        kind: kind.into(),
    };
    let clean = [
        e("pepsi-contract", "pepsi-smtp", "normal"),
        e("pepsi-contract", "pepsi-conf", "normal"),
        e("pepsi-outbound", "pepsi-contract", "normal"),
        e("pepsi-admin", "pepsi-conf", "normal"),
        e("pepsi-stage-a", "pepsi-outbound", "normal"),
        e("pepsi-stage-a", "pepsi-helper-b", "normal"),
        e("pepsi-tool", "pepsi-admin", "normal"),
        e("pepsi", "pepsi-stage-a", "normal"),
        e("pepsi", "migadu-counters", "normal"),
        e("migadu-counters", "migadu-counters-testkit", "dev"),
    ];
    assert!(stage_links(&clean).is_empty());

    let list = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let helper = list(&["libc", "pepsi-conf", "pepsi-smtp"]);
    assert!(beyond(&helper, &["pepsi-conf", "pepsi-smtp"]).is_empty());
    assert_eq!(beyond(&helper, &[]), ["pepsi-conf", "pepsi-smtp"]);
    let through = list(&["pepsi-conf", "pepsi-contract", "sqlx"]);
    assert_eq!(
        beyond(&through, &["pepsi-conf"]),
        ["pepsi-contract", "sqlx"]
    );
    assert!(upward_imports(&clean).is_empty());
    assert_eq!(find_cycle(&clean), None);

    assert!(stage_admin_links(&clean).is_empty());
    let admin = e("pepsi-stage-a", "pepsi-admin", "dev");
    assert_eq!(stage_admin_links(std::slice::from_ref(&admin)), [&admin]);

    let tool = e("pepsi-tool", "pepsi-stage-a", "normal");
    assert_eq!(stage_links(std::slice::from_ref(&tool)), [&tool]);
    let validate = e("pepsi-config", "pepsi-stage-validate", "normal");
    assert!(stage_links(std::slice::from_ref(&validate)).is_empty());
    let validating_stage = e("pepsi-stage-validate", "pepsi-stage-a", "normal");
    assert_eq!(
        stage_links(std::slice::from_ref(&validating_stage)),
        [&validating_stage]
    );
    let dev = e("pepsi-tool", "pepsi-stage-a", "dev");
    assert_eq!(stage_links(std::slice::from_ref(&dev)), [&dev]);

    for up in [
        e("pepsi-smtp", "pepsi-conf", "normal"),
        e("pepsi-conf", "pepsi-contract", "normal"),
        e("pepsi-contract", "pepsi-outbound", "dev"),
        e("pepsi-outbound", "pepsi-admin", "normal"),
        e("pepsi-admin", "pepsi-outbound", "normal"),
        e("pepsi-admin", "pepsi-stage-a", "dev"),
        e("pepsi-stage-a", "pepsi", "dev"),
        e("pepsi-stage-a", "migadu-counters", "normal"),
        e("migadu-counters", "pepsi-conf", "normal"),
    ] {
        assert_eq!(upward_imports(std::slice::from_ref(&up)), [&up]);
    }

    let cycle = [
        e("pepsi-contract", "pepsi-smtp", "normal"),
        e("pepsi-contract", "pepsi-kit", "dev"),
        e("pepsi-kit", "pepsi-setup", "normal"),
        e("pepsi-setup", "pepsi-contract", "normal"),
    ];
    assert_eq!(
        find_cycle(&cycle),
        Some(
            [
                "pepsi-contract",
                "pepsi-kit",
                "pepsi-setup",
                "pepsi-contract"
            ]
            .map(String::from)
            .to_vec()
        )
    );
}

/// The files that may split an address by hand: `pepsi_conf::address` (the one rule and
/// normalisation), and the wire crate's and the counters' own, which link no Pepsi crate.
const ADDRESS_MODULES: [&str; 3] = [
    "crates/pepsi-conf/src/address.rs",
    "crates/pepsi-smtp/src/address.rs",
    "crates/migadu-counters/src/address.rs",
];

/// The lines of one production source file (`path` as shown) that split at `@` by hand: a
/// `split`, `split_once`, `rsplit_once`, `splitn`, `find` or `rfind` on `'@'` or `"@"`. The
/// file's `#[cfg(test)]` module and everything after it are tests, not scanned; a split
/// whose line or the one above says "not an address" (a URL's user@host, a milter's
/// PORT@HOST) is not one.
fn address_splits(path: &str, text: &str) -> Vec<String> {
    let methods = ["split", "split_once", "rsplit_once", "find", "rfind"];
    let calls: Vec<String> = methods
        .iter()
        .flat_map(|m| [format!(".{m}('@')"), format!(".{m}(\"@\")")])
        .chain([".splitn(2, '@')".to_owned(), ".splitn(2, \"@\")".to_owned()])
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        if !calls.iter().any(|c| code.contains(c.as_str())) {
            continue;
        }
        let excused = |l: &str| l.to_lowercase().contains("not an address");
        if excused(line) || i > 0 && excused(lines[i - 1]) {
            continue;
        }
        found.push(format!("{path}:{}: {}", i + 1, line.trim()));
    }
    found
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn addresses_are_split_only_by_the_address_modules() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for krate in std::fs::read_dir(root().join("crates")).expect("crates/") {
        rust_files(&krate.expect("a crate").path().join("src"), &mut files);
    }
    assert!(
        files.len() > 100,
        "the scan finds the sources: {}",
        files.len()
    );
    let mut found = Vec::new();
    for file in files {
        let shown = file
            .strip_prefix(root())
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        // `tests.rs`: a module of unit tests kept in a file of its own.
        if ADDRESS_MODULES.contains(&shown.as_str())
            || file.file_name().is_some_and(|n| n == "tests.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        found.extend(address_splits(&shown, &text));
    }
    assert!(
        found.is_empty(),
        "addresses split by hand; use pepsi_conf::address (Address::parse, parts, \
         local_part, domain_part), or say on the line above why the text is not an \
         address:\n  {}",
        found.join("\n  ")
    );
}

/// The address scan finds a hand-made split, and passes tests and what is not an address.
#[test]
fn the_address_scan_finds_what_it_looks_for() {
    let cases = [
        ("let (l, d) = a.rsplit_once('@')?;", 1),
        ("let d = a.split_once(\"@\").map(|(_, d)| d);", 1),
        ("let i = a.rfind('@').unwrap();", 1),
        ("let mut p = a.splitn(2, '@');", 1),
        ("let l = a.split('@').next();", 1),
        (
            "// Not an address: a URL's user@host.\nlet h = u.rsplit_once('@');",
            0,
        ),
        ("let ok = a.contains('@');", 0),
        ("// a.split('@') in a comment", 0),
        (
            "fn f() {}\n#[cfg(test)]\nmod tests {\n    let l = a.split('@').next();\n}",
            0,
        ),
        (
            "#[cfg(test)]\nfn helper() {}\nlet l = a.split('@').next();",
            1,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(address_splits("x.rs", text).len(), want, "{text:?}");
    }
}

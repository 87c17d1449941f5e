//! The workspace's shape, as `cargo metadata` reports it: no tool or daemon links a stage
//! crate as a library, the crate graph has no cycle (dev-dependencies included, which Cargo
//! allows), and no crate imports one of a layer above it.
//!
//! The layers, bottom up: `pepsi-smtp` (the protocol), `pepsi-common` (what every program
//! shares), every other `pepsi-*` crate (stages, helpers, tools, daemons, test support), and
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
    Common,
    Middle,
    Root,
    /// Beside the Pepsi layers: imports none of them, imported only by the root package.
    Counters,
}

fn layer(name: &str) -> Layer {
    match name {
        "pepsi-smtp" => Layer::Protocol,
        "pepsi-common" => Layer::Common,
        ROOT => Layer::Root,
        n if n.starts_with("migadu-") => Layer::Counters,
        _ => Layer::Middle,
    }
}

fn is_stage(name: &str) -> bool {
    name.starts_with("pepsi-stage-")
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

/// The edges between the workspace's crates, from the real `cargo metadata`.
fn workspace_edges() -> Vec<Edge> {
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
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("package name"))
        .collect();
    assert!(
        names.contains(ROOT) && names.contains("pepsi-common") && names.len() > 10,
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
        "imports of a higher layer (pepsi-smtp < pepsi-common < other pepsi-* < pepsi; \
         migadu-* beside):{}",
        list(&bad)
    );
}

/// The three checks above find what they look for, on graphs made to hold it.
#[test]
fn the_checks_find_what_they_look_for() {
    let e = |from: &str, to: &str, kind: &str| Edge {
        from: from.into(),
        to: to.into(),
        kind: kind.into(),
    };
    let clean = [
        e("pepsi-common", "pepsi-smtp", "normal"),
        e("pepsi-stage-a", "pepsi-common", "normal"),
        e("pepsi-stage-a", "pepsi-helper-b", "normal"),
        e("pepsi-tool", "pepsi-common", "normal"),
        e("pepsi", "pepsi-stage-a", "normal"),
        e("pepsi", "migadu-counters", "normal"),
        e("migadu-counters", "migadu-counters-testkit", "dev"),
    ];
    assert!(stage_links(&clean).is_empty());
    assert!(upward_imports(&clean).is_empty());
    assert_eq!(find_cycle(&clean), None);

    let tool = e("pepsi-tool", "pepsi-stage-a", "normal");
    assert_eq!(stage_links(&[tool.clone()]), [&tool]);
    let dev = e("pepsi-tool", "pepsi-stage-a", "dev");
    assert_eq!(stage_links(&[dev.clone()]), [&dev]);

    for up in [
        e("pepsi-smtp", "pepsi-common", "normal"),
        e("pepsi-common", "pepsi-stage-a", "dev"),
        e("pepsi-common", "pepsi-common-b", "normal"),
        e("pepsi-stage-a", "pepsi", "dev"),
        e("pepsi-stage-a", "migadu-counters", "normal"),
        e("migadu-counters", "pepsi-common", "normal"),
    ] {
        assert_eq!(upward_imports(&[up.clone()]), [&up]);
    }

    let cycle = [
        e("pepsi-common", "pepsi-smtp", "normal"),
        e("pepsi-common", "pepsi-kit", "dev"),
        e("pepsi-kit", "pepsi-setup", "normal"),
        e("pepsi-setup", "pepsi-common", "normal"),
    ];
    assert_eq!(
        find_cycle(&cycle),
        Some(
            ["pepsi-common", "pepsi-kit", "pepsi-setup", "pepsi-common"]
                .map(String::from)
                .to_vec()
        )
    );
}

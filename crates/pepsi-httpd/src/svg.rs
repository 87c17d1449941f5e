//! The picture of the stage graph, pure: an SVG with one box per stage at its column and
//! row (`graph::Node`), the figures of the pipeline document in it, and a curve per edge.
//! Every figure the page updates is a `tspan` or `text` with `data-field`, inside the
//! stage's `g` (`id="stage-<name>"`, `data-stage`), so the script finds it without
//! knowing the layout. Names are escaped by maud; nothing here is script.
//!
//! Edges between neighbouring columns run side to side; every other edge (a long jump, a
//! way back, a loop) arches over the boxes, or under them when both ends are the lowest
//! box of their columns, the longer arches further out so that they do not cross.

use std::collections::BTreeMap;

use maud::{Markup, html};
use serde_json::Value;

use crate::graph::{EdgeKind, Graph, Node};

pub const BOX_W: f64 = 210.0;
pub const BOX_H: f64 = 120.0;
const COL_GAP: f64 = 70.0;
const ROW_GAP: f64 = 46.0;
const MARGIN: f64 = 24.0;
/// How far the innermost arch rises above the boxes, and each further arch beyond it.
const ARCH: f64 = 26.0;
const ARCH_STEP: f64 = 16.0;

fn kind_class(kind: EdgeKind) -> &'static str {
    match kind {
        EdgeKind::Next => "next",
        EdgeKind::Branch => "branch",
        EdgeKind::Bounce => "bounce",
    }
}

/// The figures of one stage from the pipeline document.
fn figure(stage: Option<&Value>, path: &[&str]) -> String {
    let mut v = match stage {
        Some(v) => v,
        None => return "0".into(),
    };
    for p in path {
        v = &v[*p];
    }
    match v {
        Value::Number(n) => n.to_string(),
        _ => "0".into(),
    }
}

/// One edge as drawn: its style, path, where its label goes, the label and the tooltip.
struct Curve {
    class: &'static str,
    d: String,
    mid: (f64, f64),
    label: Option<String>,
    title: String,
}

struct Arch {
    index: usize,
    above: bool,
    level: usize,
}

/// The SVG of `graph`, with the figures of `doc` (the pipeline document) filled in.
pub fn render(graph: &Graph, doc: &Value) -> Markup {
    let stages: BTreeMap<&str, &Value> = doc["stages"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["name"].as_str().map(|n| (n, s)))
                .collect()
        })
        .unwrap_or_default();
    let nodes: BTreeMap<&str, &Node> = graph.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let last_row: BTreeMap<usize, usize> = graph.nodes.iter().fold(BTreeMap::new(), |mut m, n| {
        let r = m.entry(n.column).or_insert(0);
        *r = (*r).max(n.row);
        m
    });
    // A jump over several columns to a stage higher up and lowest in its column, with no box
    // in between on the rows it crosses, runs along its own row and rises into the target's
    // bottom instead of arching over the boxes above it.
    let rises_from_side = |a: &Node, b: &Node| {
        b.column > a.column + 1
            && b.row < a.row
            && last_row.get(&b.column) == Some(&b.row)
            && !graph.nodes.iter().any(|n| {
                n.column > a.column && n.column < b.column && n.row > b.row && n.row <= a.row
            })
    };
    let columns = graph.nodes.iter().map(|n| n.column + 1).max().unwrap_or(1);
    let rows = graph.nodes.iter().map(|n| n.row + 1).max().unwrap_or(1);

    // Which edges arch, over or under, and how far out.
    let mut arches: Vec<Arch> = Vec::new();
    for (i, e) in graph.edges.iter().enumerate() {
        let (Some(a), Some(b)) = (nodes.get(e.from.as_str()), nodes.get(e.to.as_str())) else {
            continue;
        };
        if b.column == a.column + 1 || rises_from_side(a, b) {
            continue;
        }
        let lowest = |n: &Node| last_row.get(&n.column) == Some(&n.row);
        let above = (a.row == 0 && b.row == 0) || !(lowest(a) && lowest(b));
        arches.push(Arch {
            index: i,
            above,
            level: 0,
        });
    }
    let span = |i: usize| {
        let e = &graph.edges[i];
        let a = nodes[e.from.as_str()];
        let b = nodes[e.to.as_str()];
        (a.column.abs_diff(b.column), i)
    };
    for above in [true, false] {
        let mut mine: Vec<usize> = (0..arches.len())
            .filter(|&k| arches[k].above == above)
            .collect();
        mine.sort_by_key(|&k| span(arches[k].index));
        for (level, k) in mine.into_iter().enumerate() {
            arches[k].level = level;
        }
    }
    let levels = |above: bool| arches.iter().filter(|a| a.above == above).count();
    let top = MARGIN
        + if levels(true) > 0 {
            ARCH + ARCH_STEP * levels(true) as f64 + 14.0
        } else {
            0.0
        };
    let bottom_room = if levels(false) > 0 {
        ARCH + ARCH_STEP * levels(false) as f64 + 14.0
    } else {
        0.0
    };
    let x_of = |n: &Node| MARGIN + n.column as f64 * (BOX_W + COL_GAP);
    let y_of = |n: &Node| top + n.row as f64 * (BOX_H + ROW_GAP);
    let width = 2.0 * MARGIN + columns as f64 * (BOX_W + COL_GAP) - COL_GAP;
    let height = top + rows as f64 * (BOX_H + ROW_GAP) - ROW_GAP + bottom_room + MARGIN;

    let mut curves: Vec<Curve> = Vec::new();
    for (i, e) in graph.edges.iter().enumerate() {
        let (Some(a), Some(b)) = (nodes.get(e.from.as_str()), nodes.get(e.to.as_str())) else {
            continue;
        };
        let (p0, p1, p2, p3) = match arches.iter().find(|x| x.index == i) {
            None if rises_from_side(a, b) => {
                // Along the free row, then up into the bottom of the target.
                let p0 = (x_of(a) + BOX_W, y_of(a) + BOX_H / 2.0);
                let p3 = (x_of(b) + BOX_W * 0.5, y_of(b) + BOX_H);
                (p0, (p3.0, p0.1), (p3.0, p0.1), p3)
            }
            None => {
                let p0 = (x_of(a) + BOX_W, y_of(a) + BOX_H / 2.0);
                let p3 = (x_of(b), y_of(b) + BOX_H / 2.0);
                let dx = (p3.0 - p0.0) / 2.0;
                (p0, (p0.0 + dx, p0.1), (p3.0 - dx, p3.1), p3)
            }
            Some(arch) => {
                // Out of the right half of a box, into the left half.
                let x0 = x_of(a) + BOX_W * 0.62;
                let mut x3 = x_of(b) + BOX_W * 0.38;
                if e.from == e.to {
                    x3 = x_of(b) + BOX_W * 0.85;
                }
                let rise = (ARCH + ARCH_STEP * arch.level as f64) / 0.75;
                if arch.above {
                    let (y0, y3) = (y_of(a), y_of(b));
                    let lane = y0.min(y3) - rise;
                    ((x0, y0), (x0, lane), (x3, lane), (x3, y3))
                } else {
                    let (y0, y3) = (y_of(a) + BOX_H, y_of(b) + BOX_H);
                    let lane = y0.max(y3) + rise;
                    ((x0, y0), (x0, lane), (x3, lane), (x3, y3))
                }
            }
        };
        let d = format!(
            "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
            p0.0, p0.1, p1.0, p1.1, p2.0, p2.1, p3.0, p3.1
        );
        let mid = (
            (p0.0 + 3.0 * p1.0 + 3.0 * p2.0 + p3.0) / 8.0,
            (p0.1 + 3.0 * p1.1 + 3.0 * p2.1 + p3.1) / 8.0 - 4.0,
        );
        let title = format!(
            "{} → {}{}",
            e.from,
            e.to,
            match (e.kind, &e.label) {
                (EdgeKind::Next, _) => " (NEXT_STAGE)".to_owned(),
                (EdgeKind::Bounce, _) => " (BOUNCE_STAGE)".to_owned(),
                (EdgeKind::Branch, Some(l)) => format!(" ({l})"),
                (EdgeKind::Branch, None) => String::new(),
            }
        );
        curves.push(Curve {
            class: kind_class(e.kind),
            d,
            mid,
            label: e.label.clone(),
            title,
        });
    }

    html! {
        svg #pipeline-graph xmlns="http://www.w3.org/2000/svg" role="img"
            aria-label="the stage graph" data-graph=(graph.id())
            width=(format!("{width:.0}")) height=(format!("{height:.0}"))
            viewBox=(format!("0 0 {width:.0} {height:.0}")) {
            defs {
                @for kind in ["next", "branch", "bounce"] {
                    marker id=(format!("arrow-{kind}")) class=(format!("arrow {kind}"))
                        viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"
                        orient="auto-start-reverse" {
                        path d="M0,0 L10,5 L0,10 z" {}
                    }
                }
            }
            g.edges {
                @for c in &curves {
                    g class=(format!("edge {}", c.class)) {
                        title { (c.title) }
                        path d=(c.d) marker-end=(format!("url(#arrow-{})", c.class)) {}
                        @if let Some(label) = &c.label {
                            text.edge-label x=(format!("{:.1}", c.mid.0)) y=(format!("{:.1}", c.mid.1))
                                text-anchor="middle" { (label) }
                        }
                    }
                }
            }
            @for n in &graph.nodes {
                (node(n, stages.get(n.name.as_str()).copied(), x_of(n), y_of(n)))
            }
        }
    }
}

fn node(n: &Node, s: Option<&Value>, x: f64, y: f64) -> Markup {
    let f = |path: &[&str]| figure(s, path);
    let mut class = String::from("stage");
    if !n.configured {
        class.push_str(" unconfigured");
    }
    if !n.reachable {
        class.push_str(" unreachable");
    }
    if f(&["queue", "total"]) != "0" {
        class.push_str(" busy");
    }
    if f(&["failures", "rows"]) != "0" {
        class.push_str(" failing");
    }
    let program = n
        .program
        .clone()
        .unwrap_or_else(|| "no [stage-…] section".to_owned());
    let tip = match &n.condition {
        Some(c) => format!("{}: {program}; CONDITION = {c}", n.name),
        None => format!("{}: {program}", n.name),
    };
    let px = |v: f64| format!("{v:.1}");
    html! {
        g id=(format!("stage-{}", n.name)) class=(class) data-stage=(n.name)
            tabindex="0" role="button" aria-label=(format!("stage {}: open its rows", n.name)) {
            title { (tip) }
            rect.box x=(px(x)) y=(px(y)) width=(px(BOX_W)) height=(px(BOX_H)) rx="8" {}
            text.name x=(px(x + 12.0)) y=(px(y + 22.0)) { (n.name) }
            text.total x=(px(x + BOX_W - 12.0)) y=(px(y + 24.0)) text-anchor="end"
                data-field="queue.total" { (f(&["queue", "total"])) }
            text.program x=(px(x + 12.0)) y=(px(y + 39.0)) { (program) }
            text.counts x=(px(x + 12.0)) y=(px(y + 60.0)) {
                "pending " tspan.n data-field="queue.pending" { (f(&["queue", "pending"])) }
                "  running " tspan.n data-field="queue.running" { (f(&["queue", "running"])) }
                "  paused " tspan.n data-field="queue.paused" { (f(&["queue", "paused"])) }
            }
            text.counts x=(px(x + 12.0)) y=(px(y + 76.0)) {
                "held " tspan.n data-field="queue.held" { (f(&["queue", "held"])) }
                "  failed " tspan.n.bad data-field="queue.failed" { (f(&["queue", "failed"])) }
                "  timeout " tspan.n.bad data-field="queue.timeout" { (f(&["queue", "timeout"])) }
            }
            text.rates x=(px(x + 12.0)) y=(px(y + 94.0)) {
                "done " tspan.n data-field="counters.messages" { (f(&["counters", "messages"])) }
                "  last min " tspan.n data-field="throughput.messages" { (f(&["throughput", "messages"])) }
            }
            text.rates x=(px(x + 12.0)) y=(px(y + 110.0)) {
                "kills " tspan.n.bad data-field="failures.kills" { (f(&["failures", "kills"])) }
                "  crashes " tspan.n.bad data-field="failures.crashes" { (f(&["failures", "crashes"])) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_conf::config::Config;
    use serde_json::json;

    #[test]
    fn every_stage_is_a_box_with_its_figures_and_every_edge_a_curve() {
        let cfg = Config::from_str_named(
            "[stage-init]\nPROGRAM = two-way\nLEFT = local\nRIGHT = relay\n\
             [stage-local]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n\
             [stage-relay]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n\
             [stage-bounce]\nPROGRAM = x\nNEXT_STAGE = init\n",
            "t.conf",
        )
        .unwrap();
        let graph = crate::graph::build(&cfg, &["<odd>".to_owned()], crate::graph::tests::TWO_WAY);
        let doc = json!({"stages": [
            {"name": "relay", "queue": {"total": 5, "pending": 2, "failed": 3},
             "failures": {"rows": 3}}
        ]});
        let svg = render(&graph, &doc).into_string();
        for name in ["init", "local", "relay", "bounce"] {
            assert!(
                svg.contains(&format!("id=\"stage-{name}\"")),
                "{name}: {svg}"
            );
        }
        assert!(
            svg.contains("id=\"stage-&lt;odd&gt;\""),
            "names are escaped: {svg}"
        );
        assert!(
            svg.contains("class=\"stage busy failing\" data-stage=\"relay\""),
            "{svg}"
        );
        assert!(svg.contains("data-field=\"queue.total\">5<"), "{svg}");
        assert!(svg.contains("data-field=\"queue.failed\">3<"), "{svg}");
        assert_eq!(svg.matches("<g class=\"edge ").count(), graph.edges.len());
        assert_eq!(svg.matches("class=\"edge bounce\"").count(), 2);
        assert!(
            svg.contains(">left</text>") && svg.contains(">right</text>"),
            "branch labels"
        );
        assert!(svg.contains(&format!("data-graph=\"{}\"", graph.id())));
    }
}

//! A run's timeline as an SVG picture: one lane per node, its registration and its
//! leaderships over time, with the faults marked. Drawn from the same belief intervals the
//! checkers read.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::check::Beliefs;
use crate::history::History;
use crate::scenario::Scenario;

const LANE: f64 = 22.0;
const LEFT: f64 = 70.0;
const WIDTH: f64 = 1200.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
];

/// Draws `history` as an SVG document.
pub fn timeline_svg(scenario: &Scenario, history: &History) -> String {
    let end = history.end(scenario.duration);
    let beliefs = Beliefs::build(history, end);
    let x =
        |t: Duration| LEFT + (WIDTH - LEFT - 10.0) * t.as_secs_f64() / end.as_secs_f64().max(1e-9);
    let lanes = scenario.hosts;
    // Elections in the order they first had a leader, for their colours.
    let mut elections: BTreeMap<&str, usize> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut firsts: Vec<_> = beliefs.leading.iter().collect();
    firsts.sort_by_key(|l| l.from);
    for l in firsts {
        if !elections.contains_key(l.election.as_str()) {
            elections.insert(&l.election, order.len());
            order.push(&l.election);
        }
    }
    let legend_y = 30.0 + LANE * (lanes as f64 * 2.0) + 10.0;
    let height = legend_y + 40.0 + 14.0 * order.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Time axis, every 10 s.
    let mut t = Duration::ZERO;
    while t <= end {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="20" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="14">{2}s</text>"##,
            x(t),
            legend_y - 10.0,
            t.as_secs()
        );
        t += Duration::from_secs(10);
    }
    let lane_y = |node: usize, row: usize| 30.0 + LANE * (node * 2 + row) as f64;
    for n in 0..lanes {
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{:.1}">n{n} reg</text>"#,
            lane_y(n, 0) + 12.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="4" y="{:.1}">n{n} lead</text>"#,
            lane_y(n, 1) + 12.0
        );
    }
    let mut bar = |node: usize,
                   row: usize,
                   from: Duration,
                   to: Duration,
                   colour: &str,
                   title: String| {
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}" opacity="0.8"><title>{title}</title></rect>"#,
            x(from),
            lane_y(node, row) + 2.0,
            (x(to) - x(from)).max(1.0),
            LANE - 6.0
        );
    };
    for r in &beliefs.registered {
        bar(
            r.who.node,
            0,
            r.from,
            r.until,
            "#7fbf7f",
            format!("{} registered (lease {})", r.who, r.lease),
        );
    }
    for l in &beliefs.leading {
        let c = COLOURS[elections[l.election.as_str()] % COLOURS.len()];
        bar(
            l.who.node,
            1,
            l.from,
            l.until,
            c,
            format!("{} leads {} (token {})", l.who, l.election, l.token),
        );
    }
    for f in &beliefs.faults {
        let (y1, y2) = if f.fault.kind.targets_node() {
            (lane_y(f.fault.node, 0), lane_y(f.fault.node, 1) + LANE)
        } else {
            (20.0, legend_y - 10.0)
        };
        let w = (x(f.until) - x(f.from)).max(1.5);
        let _ = writeln!(
            svg,
            r##"<rect x="{:.1}" y="{y1:.1}" width="{w:.1}" height="{:.1}" fill="#d62728" opacity="0.25"><title>{}</title></rect>"##,
            x(f.from),
            y2 - y1,
            f.fault
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{0:.1}" y1="20" x2="{0:.1}" y2="{1:.1}" stroke="#000" stroke-dasharray="4"/><text x="{0:.1}" y="{2:.1}">heal</text>"##,
        x(beliefs.heal),
        legend_y - 10.0,
        legend_y
    );
    let _ = writeln!(
        svg,
        r##"<text x="4" y="{:.1}">green: registered; red: faults (hover for details); dashed: heal; leadership colour by election:</text>"##,
        legend_y + 14.0
    );
    for (i, e) in order.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<rect x="4" y="{:.1}" width="10" height="10" fill="{}"/><text x="18" y="{:.1}">{e}</text>"#,
            legend_y + 20.0 + 14.0 * i as f64,
            COLOURS[i % COLOURS.len()],
            legend_y + 29.0 + 14.0 * i as f64
        );
    }
    svg.push_str("</svg>\n");
    svg
}

//! A run's timeline as an SVG picture: one lane per node, its registration and its
//! leaderships over time, with the faults marked.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::history::{Happening, History};
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
    let x =
        |t: Duration| LEFT + (WIDTH - LEFT - 10.0) * t.as_secs_f64() / end.as_secs_f64().max(1e-9);
    let lanes = scenario.hosts;
    let legend_y = 30.0 + LANE * (lanes as f64 * 2.0) + 10.0;
    let height = legend_y + 40.0 + 14.0 * scenario.elections as f64;
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
    let bar = |svg: &mut String,
               node: usize,
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
    let mut registered: BTreeMap<(usize, u32), Duration> = BTreeMap::new();
    let mut leading: BTreeMap<(usize, u32, usize), (Duration, i64)> = BTreeMap::new();
    let mut faults = Vec::new();
    for r in &history.records {
        match &r.what {
            Happening::Registered(w, _) => {
                registered.entry((w.node, w.inc)).or_insert(r.at);
            }
            Happening::Unregistered(w) => {
                if let Some(from) = registered.remove(&(w.node, w.inc)) {
                    bar(
                        &mut svg,
                        w.node,
                        0,
                        from,
                        r.at,
                        "#7fbf7f",
                        format!("{w} registered"),
                    );
                }
            }
            Happening::LeaderStart {
                who,
                election,
                token,
            } => {
                leading.insert((who.node, who.inc, *election), (r.at, *token));
            }
            Happening::LeaderEnd { who, election, .. } => {
                if let Some((from, token)) = leading.remove(&(who.node, who.inc, *election)) {
                    let c = COLOURS[election % COLOURS.len()];
                    bar(
                        &mut svg,
                        who.node,
                        1,
                        from,
                        r.at,
                        c,
                        format!("{who} leads e{election} (token {token})"),
                    );
                }
            }
            Happening::Crashed(w) => {
                if let Some(from) = registered.remove(&(w.node, w.inc)) {
                    bar(
                        &mut svg,
                        w.node,
                        0,
                        from,
                        r.at,
                        "#7fbf7f",
                        format!("{w} registered"),
                    );
                }
                let open: Vec<_> = leading
                    .keys()
                    .filter(|k| k.0 == w.node && k.1 == w.inc)
                    .copied()
                    .collect();
                for k in open {
                    let (from, token) = leading.remove(&k).expect("listed");
                    bar(
                        &mut svg,
                        w.node,
                        1,
                        from,
                        r.at,
                        COLOURS[k.2 % COLOURS.len()],
                        format!("{w} leads e{} (token {token})", k.2),
                    );
                }
            }
            Happening::FaultStart(f) => faults.push((r.at, f.clone())),
            _ => {}
        }
    }
    for ((node, inc), from) in registered {
        bar(
            &mut svg,
            node,
            0,
            from,
            end,
            "#7fbf7f",
            format!("n{node}.{inc} registered"),
        );
    }
    for ((node, inc, e), (from, token)) in leading {
        bar(
            &mut svg,
            node,
            1,
            from,
            end,
            COLOURS[e % COLOURS.len()],
            format!("n{node}.{inc} leads e{e} (token {token})"),
        );
    }
    for (at, f) in faults {
        let (y1, y2) = if f.kind.targets_node() {
            (lane_y(f.node, 0), lane_y(f.node, 1) + LANE)
        } else {
            (20.0, legend_y - 10.0)
        };
        let w = if f.kind.lasts() {
            (x(at + f.length) - x(at)).max(1.5)
        } else {
            1.5
        };
        let _ = writeln!(
            svg,
            r##"<rect x="{:.1}" y="{y1:.1}" width="{w:.1}" height="{:.1}" fill="#d62728" opacity="0.25"><title>{f}</title></rect>"##,
            x(at),
            y2 - y1
        );
    }
    let heal = scenario.heal_at();
    let _ = writeln!(
        svg,
        r##"<line x1="{0:.1}" y1="20" x2="{0:.1}" y2="{1:.1}" stroke="#000" stroke-dasharray="4"/><text x="{0:.1}" y="{2:.1}">heal</text>"##,
        x(heal),
        legend_y - 10.0,
        legend_y
    );
    let _ = writeln!(
        svg,
        r##"<text x="4" y="{:.1}">green: registered; red: faults (hover for details); dashed: heal; leadership colour by election:</text>"##,
        legend_y + 14.0
    );
    for e in 0..scenario.elections {
        let _ = writeln!(
            svg,
            r#"<rect x="4" y="{:.1}" width="10" height="10" fill="{}"/><text x="18" y="{:.1}">e{e}</text>"#,
            legend_y + 20.0 + 14.0 * e as f64,
            COLOURS[e % COLOURS.len()],
            legend_y + 29.0 + 14.0 * e as f64
        );
    }
    svg.push_str("</svg>\n");
    svg
}

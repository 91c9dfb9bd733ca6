//! The `stop` fault reaches a service through `Node::take_part_stops`, and is counted only
//! when it did: a service that never takes the requests gets none, and the summary says so.

use std::time::Duration;

use coord_chaos::{Fault, FaultKind, Node, Runner, Scenario, Service};
use futures::future::BoxFuture;

/// Notes each part-stop request it gets, if it takes them at all.
struct Parts {
    takes: bool,
}

impl Service for Parts {
    fn name(&self) -> &str {
        "parts"
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        let takes = self.takes;
        Box::pin(async move {
            node.ready();
            if !takes {
                return node.stopping().await;
            }
            let mut stops = node.take_part_stops().expect("taken once, here");
            assert!(node.take_part_stops().is_none(), "taken twice");
            loop {
                tokio::select! {
                    _ = node.stopping() => return,
                    Some(stop) = stops.recv() => {
                        node.note("part-stop", format!("pick {} for {:?}", stop.pick, stop.length));
                    }
                }
            }
        })
    }
}

/// A stop of node 1's part every 5 s from 10 s to 20 s.
fn stops() -> Vec<Fault> {
    (0..3)
        .map(|i| Fault {
            at: Duration::from_secs(10 + 5 * i),
            kind: FaultKind::Stop,
            node: 1,
            length: Duration::from_secs(1),
            pick: i,
        })
        .collect()
}

fn run(takes: bool) -> (u64, usize) {
    let mut scenario = Scenario::default();
    scenario.hosts = 2;
    scenario.duration = Duration::from_secs(40);
    let runner = Runner::new(Parts { takes }).scenario(scenario);
    let (outcome, history) = runner.run_schedule(1, &stops());
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let counted = outcome.faults.get(&FaultKind::Stop).copied().unwrap_or(0);
    (counted, history.notes("part-stop").count())
}

#[test]
fn a_part_stop_reaches_a_service_that_takes_them() {
    assert_eq!(run(true), (3, 3), "(counted, received)");
}

#[test]
fn a_part_stop_nobody_takes_is_not_counted() {
    assert_eq!(run(false), (0, 0), "(counted, received)");
}

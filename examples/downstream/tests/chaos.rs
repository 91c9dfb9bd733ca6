//! The ticker under coord-chaos, from a user's crate: its own invariants besides the generic
//! ones, and its bug (ticks written without the fence) caught.

use coord_api::Revision;
use coord_chaos::{FencedWrites, Invariant, Node, Run, Runner, Scenario, Service, Violation};
use coord_downstream::{parse_tick, Ticker, ELECTION, HOSTS, TICKS};
use futures::future::BoxFuture;

struct TickerService {
    fenced: bool,
}

impl Service for TickerService {
    fn name(&self) -> &str {
        "ticker"
    }

    fn operator_prefixes(&self) -> Vec<String> {
        // The hosts' registrations and the candidates' keys: an operator may revoke or
        // delete either.
        vec![HOSTS.to_owned(), format!("{ELECTION}/")]
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        let fenced = self.fenced;
        Box::pin(async move {
            let ttl = node.scenario().ttl;
            let ticker = Ticker {
                store: node.store().clone(),
                fenced,
                every: ttl / 5,
            };
            let observer = node.clone();
            let running = ticker.start(&node.who().to_string(), ttl, move |ticker, term| {
                let node = observer.clone();
                async move {
                    node.leader_start(ELECTION, term.token());
                    let _work = node.work_started(ELECTION, term.token());
                    ticker.term(&term).await;
                    node.leader_end(ELECTION, term.token(), term.loss().is_none());
                }
            });
            node.stopping().await;
            let _ = running.stop().await;
        })
    }

    fn invariants(&self, _: &Scenario) -> Vec<Box<dyn Invariant>> {
        vec![
            Box::new(FencedWrites::new(ELECTION, TICKS, |v| {
                parse_tick(v).map(|t| Revision(t.0))
            })),
            Box::new(Consecutive),
        ]
    }
}

/// Ticks are created in order, 0, 1, 2..., each once and never overwritten.
struct Consecutive;

impl Invariant for Consecutive {
    fn name(&self) -> &str {
        "consecutive-ticks"
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let mut next = 0;
        for c in run.commits() {
            for e in c
                .events
                .iter()
                .filter(|e| e.kv.key.starts_with(TICKS.as_bytes()))
            {
                let n = parse_tick(&e.kv.value).map(|t| t.1);
                if e.kv.version != 1 || n != Some(next) {
                    out.push(run.violation(
                        self.name(),
                        c.at,
                        &[],
                        format!(
                            "{} at revision {}: tick {n:?}, version {}, expected tick {next} once",
                            e.kv.key_str(),
                            c.revision,
                            e.kv.version
                        ),
                    ));
                }
                next = n.unwrap_or(next) + 1;
            }
        }
    }
}

#[test]
fn the_ticker_keeps_its_promises() {
    let runner = Runner::new(TickerService { fenced: true });
    let seeds = runner.seeds_from_env(0..40);
    runner.run(seeds).assert_clean();
}

#[test]
fn ticks_written_without_the_fence_are_caught() {
    let report = Runner::new(TickerService { fenced: false }).run(0..40);
    let caught = report
        .failed()
        .flat_map(|o| o.violations.iter())
        .find(|v| v.invariant == "S1");
    let Some(caught) = caught else {
        panic!("the unfenced ticker went uncaught:\n{}", report.summary());
    };
    // The violation names its culprit: the node whose client wrote the tick.
    assert_eq!(caught.nodes.len(), 1, "{caught}");
    assert!(caught.nodes[0].starts_with('n'), "{caught}");
}

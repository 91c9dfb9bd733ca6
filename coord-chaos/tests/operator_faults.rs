//! An operator's revoke and delete faults act on the keys a service names as its own, and a
//! fault that found nothing to act on is neither recorded nor counted.

use std::time::Duration;

use coord_api::recipes::{Election, Session, SessionConfig};
use coord_chaos::{Fault, FaultKind, Node, Runner, Scenario, Service};
use futures::future::BoxFuture;

/// Each node campaigns in `mine` and holds the leadership until it loses it.
struct Mine {
    prefixes: Vec<String>,
}

impl Service for Mine {
    fn name(&self) -> &str {
        "mine"
    }

    fn operator_prefixes(&self) -> Vec<String> {
        self.prefixes.clone()
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let ttl = node.scenario().ttl;
            while !node.is_stopping() {
                let config = SessionConfig::default().with_ttl(ttl);
                let Ok(session) = Session::new(node.store().clone(), config).await else {
                    continue;
                };
                let election = Election::new(&session, "mine");
                if let Ok(lead) = election.campaign(node.who().to_string()).await {
                    node.leader_start("mine", lead.token());
                    tokio::select! {
                        _ = lead.lost() => node.leader_end("mine", lead.token(), false),
                        _ = node.stopping() => {
                            node.leader_end("mine", lead.token(), true);
                            let _ = lead.resign().await;
                        }
                    }
                }
            }
        })
    }
}

/// A revoke and a delete every 5 s from 10 s to 35 s: the nodes campaign from the start, so
/// there is always a candidate key to act on.
fn operator_faults() -> Vec<Fault> {
    (0..6)
        .map(|i| Fault {
            at: Duration::from_secs(10 + 5 * i),
            kind: if i % 2 == 0 {
                FaultKind::Revoke
            } else {
                FaultKind::Delete
            },
            node: 0,
            length: Duration::ZERO,
            pick: 7 * i + 1,
        })
        .collect()
}

fn scenario() -> Scenario {
    let mut s = Scenario::default();
    s.hosts = 3;
    s.duration = Duration::from_secs(60);
    s
}

fn counted(prefixes: &[&str]) -> (u64, u64, bool) {
    let runner = Runner::new(Mine {
        prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
    })
    .scenario(scenario());
    let (outcome, _) = runner.run_schedule(1, &operator_faults());
    let count = |k| outcome.faults.get(&k).copied().unwrap_or(0);
    (
        count(FaultKind::Revoke),
        count(FaultKind::Delete),
        outcome.violations.is_empty(),
    )
}

#[test]
fn operator_faults_act_on_the_keys_a_service_names() {
    let (revokes, deletes, clean) = counted(&["mine/"]);
    assert_eq!((revokes, deletes), (3, 3), "every operator fault acted");
    assert!(clean, "the election rode through its operator faults");
}

#[test]
fn an_operator_fault_with_nothing_to_act_on_is_not_counted() {
    // No prefixes: nothing to act on.
    assert_eq!(counted(&[]), (0, 0, true));
    // A prefix with no keys under it: the same.
    assert_eq!(counted(&["nobody/"]), (0, 0, true));
}

//! The helpers a service's own invariants read a run with: the keys under a prefix at an
//! instant, and the service's notes.

use std::time::Duration;

use coord_api::{DeleteRequest, KvLeaseStore, PutRequest};
use coord_chaos::{Node, Run, Runner, Scenario, Service};
use futures::future::BoxFuture;

/// Each node puts `k/<node>` at once and deletes it at 20 s, noting each.
struct Writes;

impl Service for Writes {
    fn name(&self) -> &str {
        "writes"
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let key = format!("k/{}", node.who().node);
            node.store()
                .put(PutRequest::new(key.clone(), "v"))
                .await
                .expect("no faults");
            node.note("wrote", key.clone());
            tokio::time::sleep(Duration::from_secs(20)).await;
            node.store()
                .delete(DeleteRequest::key(key.clone()))
                .await
                .expect("no faults");
            node.note("deleted", key);
            node.stopping().await;
        })
    }
}

#[test]
fn keys_at_and_notes_read_the_run() {
    let mut scenario = Scenario::default();
    scenario.hosts = 3;
    scenario.duration = Duration::from_secs(40);
    let runner = Runner::new(Writes).scenario(scenario.clone());
    let (outcome, history) = runner.run_schedule(1, &[]);
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let run = Run::new(&scenario, &history);
    let at = |secs| run.keys_at("k/", Duration::from_secs(secs));
    let standing = at(10);
    assert_eq!(
        standing.keys().map(String::as_str).collect::<Vec<_>>(),
        ["k/0", "k/1", "k/2"]
    );
    assert!(standing.values().all(|kv| kv.value.as_ref() == b"v"));
    assert!(at(30).is_empty(), "deleted at 20 s: {:?}", at(30));
    assert!(run.keys_at("other/", Duration::from_secs(10)).is_empty());
    assert_eq!(run.notes("wrote").count(), 3);
    let deleted: Vec<_> = run.notes("deleted").collect();
    assert_eq!(deleted.len(), 3);
    assert!(deleted
        .iter()
        .all(|(t, _, _)| *t >= Duration::from_secs(20)));
}

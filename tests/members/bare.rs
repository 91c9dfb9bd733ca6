//! Bare requests on a sick member: an `EtcdStore` given every member, with no session and no
//! watcher of coord's on it (nothing else to move its pool), whose member is cut off from its
//! peers or stalled. Its own reads, writes, transactions and watches must leave that member
//! within a stated bound, on real etcd (`members_etcd.rs`) as on the simulator
//! (`members_sim.rs`): the same case, the same assertions.

use std::time::Duration;

use coord_api::{
    Compare, CompareOp, ErrorClass, GetRequest, KvLeaseStore, PutRequest, TxnRequest, WatchRequest,
};
use coord_etcd::EtcdStore;
use futures::StreamExt;
use tokio::time::Instant;

use super::cluster::Members;

/// How a request on a healthy member is answered: at once. Slack for a loaded machine.
const PROMPT: Duration = Duration::from_secs(1);

/// How long a member that accepts and answers nothing keeps a bare read: the store asks a
/// member holding a request for its status after it has answered nothing for 1 s, and leaves
/// it when that goes unanswered for 1 s more (coord-etcd's liveness); 1 s of slack.
const LEAVES_A_STALLED_MEMBER: Duration = Duration::from_secs(3);

/// The store's request timeout, at the library's defaults.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// What the case measured, one row each.
#[derive(Debug, Default)]
pub(crate) struct Bare {
    pub(crate) rows: Vec<(String, String)>,
}

impl Bare {
    fn row(&mut self, what: &str, figure: String) {
        self.rows.push((what.to_owned(), figure));
    }
}

/// The store, given every member starting from `first`, answers a put (warming its
/// connection to `first`); returns it.
async fn store_on(m: &dyn Members, first: usize) -> EtcdStore {
    let store = m.store(first).await;
    store
        .put(PutRequest::new("bare/warm", "v"))
        .await
        .expect("a put on a healthy cluster");
    store
}

/// Runs `f`, panicking with `what` unless it succeeds within `bound`; returns how long it
/// took.
async fn within<T, F>(what: &str, bound: Duration, f: F) -> Duration
where
    F: std::future::Future<Output = coord_api::Result<T>>,
{
    let start = Instant::now();
    match tokio::time::timeout(bound, f).await {
        Ok(Ok(_)) => start.elapsed(),
        Ok(Err(e)) => panic!("{what}: failed after {:?}: {e}", start.elapsed()),
        Err(_) => panic!("{what}: not answered within {bound:?}"),
    }
}

/// Reads, a write, a transaction and a watch, on a store whose first member (a follower) is
/// cut off from its peers, then on one whose first member is stalled.
pub(crate) async fn bare_requests(m: &dyn Members) -> Bare {
    let mut out = Bare::default();
    let et = m.election_timeout();

    // Cut off: once the member knows it has no leader (it answers `no leader` from then on,
    // three election timeouts after the cut on etcd 3.4 and 3.5 alike), the store moves to
    // the next member on that answer; nothing waits for a timeout.
    let f = (m.leader().await + 1) % 3;
    let store = store_on(m, f).await;
    let mut watch = store
        .watch(WatchRequest::prefix("bare/cut"))
        .await
        .expect("a watch on a healthy cluster");
    m.isolate(f).await;
    tokio::time::sleep(et * 3).await;
    let put = within("a put on a store whose member is cut off", PROMPT, async {
        store.put(PutRequest::new("bare/cut", "1")).await
    })
    .await;
    out.row("cut off: put", secs(put));
    let get = within("a get after it", PROMPT, async {
        store.get(GetRequest::key("bare/cut")).await
    })
    .await;
    out.row("cut off: get", secs(get));
    let txn = within("a transaction after it", PROMPT, async {
        store
            .txn(
                TxnRequest::new()
                    .when([Compare::version("bare/cut", CompareOp::Greater, 0)])
                    .and_then([PutRequest::new("bare/cut", "2")]),
            )
            .await
    })
    .await;
    out.row("cut off: txn", secs(txn));
    // The watch opened on the cut-off member hears nothing more from it: it must end (for
    // its consumer to resume elsewhere) or deliver the write, not hang. etcd itself ends a
    // require-leader watch on a member without a leader a few election timeouts after the
    // cut; the store ends it as soon as it leaves the member.
    let watched = watch_moves(&mut watch, et * 8 + PROMPT).await;
    out.row("cut off: watch opened before", watched);
    m.rejoin().await;
    drop((store, watch));
    tokio::time::sleep(et * 4).await;

    // Stalled: the member accepts and answers nothing, not even its status. A read sent at
    // the stall goes again on the next member once the store gives the stalled one up; what
    // follows goes there at once. A write sent at the stall is held to the request timeout
    // and answered then, applied or of unknown outcome, never failed: the member may apply it
    // when it thaws, and a caller told sooner would move on while it is still on the wire.
    let f = (m.leader().await + 1) % 3;
    let store = store_on(m, f).await;
    let mut watch = store
        .watch(WatchRequest::prefix("bare/stall"))
        .await
        .expect("a watch on a healthy cluster");
    m.stall(f).await;
    let held = async {
        let start = Instant::now();
        let r = tokio::time::timeout(
            REQUEST_TIMEOUT + PROMPT,
            store.put(PutRequest::new("bare/stall", "1")),
        )
        .await;
        (start.elapsed(), r)
    };
    let rest = async {
        let get = within("a get sent at the stall", LEAVES_A_STALLED_MEMBER, async {
            store.get(GetRequest::key("bare/stall")).await
        })
        .await;
        let put = within(
            "a put after the store left the stalled member",
            PROMPT,
            async { store.put(PutRequest::new("bare/stall", "2")).await },
        )
        .await;
        let watched = watch_moves(&mut watch, PROMPT).await;
        (get, put, watched)
    };
    let ((held_for, held), (get, put, watched)) = tokio::join!(held, rest);
    out.row("stalled: get sent at the stall", secs(get));
    out.row("stalled: put after it", secs(put));
    out.row("stalled: watch opened before", watched);
    let held = match held {
        Ok(Ok(_)) => "ok".to_owned(),
        Ok(Err(e)) if e.class() == ErrorClass::Indeterminate => "indeterminate".to_owned(),
        Ok(Err(e)) => panic!(
            "a put held on a stalled member must end applied or indeterminate, not: {e}"
        ),
        Err(_) => panic!(
            "a put on a stalled member must be answered by the request timeout ({REQUEST_TIMEOUT:?})"
        ),
    };
    out.row(
        "stalled: put sent at the stall",
        format!("{} {held}", secs(held_for)),
    );
    m.thaw(f).await;
    out
}

/// Waits up to `bound` for `watch` to deliver an event or end; panics if it does neither.
async fn watch_moves(watch: &mut coord_api::WatchStream, bound: Duration) -> String {
    let start = Instant::now();
    loop {
        match tokio::time::timeout_at(start + bound, watch.next()).await {
            Ok(Some(Ok(r))) if r.events.is_empty() => continue,
            Ok(Some(Ok(_))) => return format!("{:.3}s event", start.elapsed().as_secs_f64()),
            Ok(Some(Err(e))) => {
                assert!(
                    e.is_retryable(),
                    "a watch left on a sick member must end with a retryable error, not: {e}"
                );
                return format!("{:.3}s ended ({:?})", start.elapsed().as_secs_f64(), e.class());
            }
            Ok(None) => return format!("{:.3}s ended", start.elapsed().as_secs_f64()),
            Err(_) => panic!(
                "a watch opened on a sick member neither delivered the write nor ended within {bound:?}"
            ),
        }
    }
}

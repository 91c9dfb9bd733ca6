//! The chaos runner's history checkers, on real servers: a witness records the store's
//! history (every change, from observers watching from the first revision they see) beside
//! what the test's nodes believed and what their watchers emitted, and holds it to the safety
//! invariants that need no lease grants (a watch does not show those): S1 and S2 (tokens
//! grow, one believer at a time), S3 (no phantom leadership), S4/S5 (every view equals the
//! store at its revision; every event agrees with the store; no change lost or doubled) and
//! C1; and to the test's own (a fence's writes, `also_check`).
//!
//! The checkers compare times: a belief must begin after the change that made it true. A
//! change's time is when an observer received it. On etcd one observer per member watches,
//! each on a connection to its member alone, and a change counts from its earliest receipt: a
//! member the test stops or cuts off delays only its own observer. On PostgreSQL (one server)
//! the observers share a store of the witness's own, connected straight to it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::recipes::ClusterWatcher;
use coord_api::{
    DynKvLeaseStore, Event, EventKind, GetRequest, KeyValue, KvLeaseStore, LeaseId, PutRequest,
    Revision, WatchRequest,
};
use coord_chaos::{
    check, record_watcher, CoordService, Fault, FaultKind, FencedWrites, Happening, History,
    Incarnation, Invariant, Recorder, Scenario, Service, Violation,
};
use coord_sim::journal::{Entry, Origin};
use etcd_client::{Client, EventType, WatchOptions};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The key the witness writes at the end: every change before it has been observed once the
/// observer sees it. Outside every prefix the tests use.
const SENTINEL: &str = "~witness/end";
const SENTINEL_PREFIX: &str = "~witness/";

/// Every change observed, by revision: its earliest receipt, and its events.
type Observed = Arc<Mutex<BTreeMap<i64, (Instant, Vec<Event>)>>>;

/// The invariants a real-etcd history can be held to.
const APPLICABLE: [&str; 5] = ["S1", "S2", "S3", "S4/S5", "C1"];

/// Records a real cluster's history for the checkers.
pub(crate) struct Witness {
    recorder: Recorder,
    source: Source,
    /// The first revision observed.
    first: Revision,
    /// Every change observed, by revision: its earliest receipt, and its events.
    observed: Observed,
    observers: Mutex<Vec<JoinHandle<()>>>,
    stop: CancellationToken,
    followers: Mutex<Vec<JoinHandle<()>>>,
    /// Who is who: each name the test uses, as a node of the history.
    names: Mutex<BTreeMap<String, Incarnation>>,
    /// Per leadership begun (its node and token): the store's revision just after, once read.
    pins: Arc<Mutex<Vec<(Incarnation, Revision, i64)>>>,
    pinning: Mutex<Vec<JoinHandle<()>>>,
    ttl: Duration,
    /// Operator actions recorded, to tell their faults apart.
    operator_acts: AtomicU64,
    /// The test's own invariants, beside the applicable ones.
    also: Mutex<Vec<FencedWrites>>,
}

impl Witness {
    /// Starts observing the cluster at `endpoints` (sessions there have `ttl`).
    pub(crate) async fn start(endpoints: Vec<String>, ttl: Duration) -> Witness {
        Witness::observing(Source::Etcd(endpoints), ttl).await
    }

    /// Starts observing through `store`, a connection of the witness's own to a server the
    /// test does not cut it off from, every key under `prefixes` (the contract has no watch
    /// of the whole keyspace; a revision that changes nothing under them is reported as
    /// missed). Sessions there have `ttl`.
    pub(crate) async fn on_store(
        store: Arc<DynKvLeaseStore>,
        prefixes: &[&'static str],
        ttl: Duration,
    ) -> Witness {
        let mut prefixes = prefixes.to_vec();
        prefixes.push(SENTINEL_PREFIX);
        // A write of unknown outcome (the server killed under it) is fenced there.
        prefixes.push(coord_api::elections::FENCE_PREFIX);
        Witness::observing(Source::Store(store, prefixes), ttl).await
    }

    async fn observing(source: Source, ttl: Duration) -> Witness {
        let recorder = Recorder::starting_now();
        let observed = Observed::default();
        let stop = CancellationToken::new();
        let first = Revision(
            source
                .revision()
                .await
                .expect("the witness reads the revision")
                + 1,
        );
        let observers = source.observers(first, &observed, &stop);
        Witness {
            recorder,
            source,
            first,
            observed,
            observers: Mutex::new(observers),
            stop,
            followers: Mutex::default(),
            names: Mutex::default(),
            pins: Arc::default(),
            pinning: Mutex::default(),
            ttl,
            operator_acts: AtomicU64::new(0),
            also: Mutex::default(),
        }
    }

    /// Holds the history to `fenced` as well.
    pub(crate) fn also_check(&self, fenced: FencedWrites) {
        self.also.lock().unwrap().push(fenced);
    }

    /// The history node standing for the test's `name` (a host, a candidate).
    pub(crate) fn who(&self, name: &str) -> Incarnation {
        let mut names = self.names.lock().unwrap();
        let next = names.len();
        *names
            .entry(name.to_owned())
            .or_insert(Incarnation { node: next, inc: 0 })
    }

    /// Records that `name` believes it leads `election` with `token`.
    ///
    /// The observers date a change by when their task got to it, which on a loaded machine
    /// can trail the node that acted on it; so the belief is also pinned to the store's
    /// revision read right after it, and is dated no earlier than the observers' receipt of
    /// that revision (a belief is judged against a store that has caught up with it).
    pub(crate) fn leader_start(&self, name: &str, election: &str, token: Revision) {
        let who = self.who(name);
        self.recorder.record(Happening::LeaderStart {
            who,
            election: election.to_owned(),
            token,
        });
        let (source, pins) = (self.source.clone(), self.pins.clone());
        let pin = tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Some(revision) = source.revision().await {
                    pins.lock().unwrap().push((who, token, revision));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        self.pinning.lock().unwrap().push(pin);
    }

    /// Records that the test, as an operator, is about to delete or revoke keys: a leader so
    /// deposed learns it from its watch just as its successor does, so S2 excuses their
    /// beliefs' overlap (as it excuses the chaos runner's operator faults), while S3 still
    /// bounds how long the deposed one believes.
    pub(crate) fn operator_acts(&self) {
        let fault = Fault {
            at: Duration::ZERO,
            kind: FaultKind::Delete,
            node: 0,
            length: Duration::ZERO,
            pick: self.operator_acts.fetch_add(1, Ordering::Relaxed),
        };
        self.recorder.record(Happening::FaultStart(fault.clone()));
        self.recorder.record(Happening::FaultEnd(fault));
    }

    /// Records that `name` no longer believes it leads.
    pub(crate) fn leader_end(&self, name: &str, election: &str, token: Revision) {
        self.recorder.record(Happening::LeaderEnd {
            who: self.who(name),
            election: election.to_owned(),
            token,
            resigned: false,
        });
    }

    /// Records every view and event of `watcher`, as `name`'s, until the witness checks;
    /// hands each record to `also` as well.
    pub(crate) fn follow(
        &self,
        name: &str,
        watcher: ClusterWatcher,
        also: impl Fn(&Happening) + Send + Sync + 'static,
    ) {
        let (recorder, stop, who) = (self.recorder.clone(), self.stop.clone(), self.who(name));
        let task = tokio::spawn(async move {
            record_watcher(
                watcher,
                who,
                |h| {
                    also(&h);
                    recorder.record(h)
                },
                async move { stop.cancelled().await },
            )
            .await
        });
        self.followers.lock().unwrap().push(task);
    }

    /// Stops recording once the observer has every change up to now, and holds the history
    /// to the applicable invariants; panics with the violations and the timeline otherwise.
    pub(crate) async fn check(&self) {
        let (violations, history) = self.violations().await;
        assert!(
            violations.is_empty(),
            "the history breaks invariants:\n{}\n\n{}\nthe store's changes, as first observed:\n{}",
            violations
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
            coord_chaos::timeline(&history),
            changes(&history)
        );
        let count =
            |f: fn(&Happening) -> bool| history.records.iter().filter(|r| f(&r.what)).count();
        println!(
            "witness: {} commits, {} leaderships, {} watcher views and {} events held to {APPLICABLE:?} and {:?}: none broken",
            count(|h| matches!(h, Happening::Store(_))),
            count(|h| matches!(h, Happening::LeaderStart { .. })),
            count(|h| matches!(h, Happening::View { .. })),
            count(|h| matches!(h, Happening::Emitted(..))),
            self.also.lock().unwrap(),
        );
    }

    /// Stops recording once the observer has every change up to now; the history's
    /// violations of the applicable invariants, and the history.
    pub(crate) async fn violations(&self) -> (Vec<Violation>, History) {
        let deadline = Instant::now() + Duration::from_secs(10);
        // etcd-client's balancer may pick a member the test killed: try until one answers.
        let end = loop {
            match self.source.sentinel().await {
                Ok(revision) => break revision,
                Err(failed) => assert!(
                    Instant::now() < deadline,
                    "the witness's sentinel write failed for 10 s: {failed}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        while !self.observed.lock().unwrap().contains_key(&end) {
            assert!(
                Instant::now() < deadline,
                "no observer of the witness reached revision {end} within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pinning: Vec<_> = self.pinning.lock().unwrap().drain(..).collect();
        for p in pinning {
            let _ = p.await;
        }
        self.stop.cancel();
        let followers: Vec<_> = self.followers.lock().unwrap().drain(..).collect();
        for f in followers {
            let _ = f.await;
        }
        let observers: Vec<_> = self.observers.lock().unwrap().drain(..).collect();
        for o in observers {
            let _ = o.await;
        }
        // Every revision changes at least one key, so the observed revisions run without a
        // gap from the first to the last one seen, or the history is incomplete. The last may
        // come after the sentinel's: the test's parts write on (a lease expires, a candidate
        // campaigns) until the observers stop, and each observer sees its stream in order.
        let observed = std::mem::take(&mut *self.observed.lock().unwrap());
        let revisions: Vec<i64> = observed.keys().copied().collect();
        let last = revisions.last().copied().unwrap_or(end).max(end);
        let expected: Vec<i64> = (self.first.0..=last).collect();
        assert_eq!(revisions, expected, "the observers missed revisions");
        for (revision, (at, events)) in observed {
            self.recorder.record_at(
                at,
                Happening::Store(Entry::Commit {
                    revision: Revision(revision),
                    origin: Origin::Store,
                    events,
                }),
            );
        }
        let mut history = self.recorder.history();
        // A leadership counts from when the observers had the revision pinned to it (see
        // `leader_start`), and ends no earlier than it begins.
        let observed_at: BTreeMap<i64, Duration> = history
            .records
            .iter()
            .filter_map(|r| match &r.what {
                Happening::Store(Entry::Commit { revision, .. }) => Some((revision.0, r.at)),
                _ => None,
            })
            .collect();
        let pins = std::mem::take(&mut *self.pins.lock().unwrap());
        for (who, token, revision) in pins {
            let Some(seen) = observed_at.get(&revision).copied() else {
                continue;
            };
            for r in history.records.iter_mut() {
                match &r.what {
                    Happening::LeaderStart {
                        who: w, token: t, ..
                    }
                    | Happening::LeaderEnd {
                        who: w, token: t, ..
                    } if *w == who && *t == token => {
                        r.at = r.at.max(seen);
                    }
                    _ => {}
                }
            }
        }
        // Observed and believed were recorded by different tasks: put them in time order.
        history.records.sort_by_key(|r| r.at);
        let mut scenario = Scenario::default();
        scenario.ttl = self.ttl;
        let also: Vec<Box<dyn Invariant>> = self
            .also
            .lock()
            .unwrap()
            .iter()
            .map(|f| Box::new(f.clone()) as Box<dyn Invariant>)
            .collect();
        let invariants: Vec<_> = CoordService
            .invariants(&scenario)
            .into_iter()
            .chain(coord_chaos::generic())
            .filter(|i| APPLICABLE.contains(&i.name()))
            .chain(also)
            .collect();
        (check(&scenario, &history, &invariants), history)
    }

    /// Records `what` as happening now (for a test that plants a wrong belief).
    pub(crate) fn record(&self, what: Happening) {
        self.recorder.record(what);
    }
}

/// Where the witness reads the store's history.
#[derive(Clone)]
enum Source {
    /// Real etcd members, each observed on a connection to it alone.
    Etcd(Vec<String>),
    /// A store of the witness's own (one PostgreSQL server), one observer per prefix.
    Store(Arc<DynKvLeaseStore>, Vec<&'static str>),
}

impl Source {
    /// The store's revision now, if it answers within a second.
    async fn revision(&self) -> Option<i64> {
        let read = async {
            match self {
                Source::Etcd(endpoints) => {
                    let mut c = Client::connect(endpoints.clone(), None).await.ok()?;
                    let r = c
                        .get("\0", Some(etcd_client::GetOptions::new().with_limit(1)))
                        .await
                        .ok()?;
                    r.header().map(|h| h.revision())
                }
                Source::Store(store, _) => {
                    let r = store.get(GetRequest::key(SENTINEL)).await.ok()?;
                    Some(r.revision.get())
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(1), read)
            .await
            .ok()
            .flatten()
    }

    /// Writes the sentinel; its revision.
    async fn sentinel(&self) -> Result<i64, String> {
        let put = async {
            match self {
                Source::Etcd(endpoints) => {
                    let mut client = Client::connect(endpoints.clone(), None)
                        .await
                        .map_err(|e| e.to_string())?;
                    let r = client
                        .put(SENTINEL, "", None)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(r.header().map_or(0, |h| h.revision()))
                }
                Source::Store(store, _) => store
                    .put(PutRequest::new(SENTINEL, ""))
                    .await
                    .map(|r| r.revision.get())
                    .map_err(|e| e.to_string()),
            }
        };
        tokio::time::timeout(Duration::from_secs(2), put)
            .await
            .map_err(|_| "no answer in 2 s".to_owned())?
    }

    /// The observers, from revision `from` on.
    fn observers(
        &self,
        from: Revision,
        observed: &Observed,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        match self {
            Source::Etcd(endpoints) => endpoints
                .iter()
                .map(|e| tokio::spawn(observe(e.clone(), from, observed.clone(), stop.clone())))
                .collect(),
            Source::Store(store, prefixes) => prefixes
                .iter()
                .map(|p| {
                    tokio::spawn(observe_store(
                        store.clone(),
                        p,
                        from,
                        observed.clone(),
                        stop.clone(),
                    ))
                })
                .collect(),
        }
    }
}

/// The store's changes in a history, one line each (time, revision, what changed), the last
/// 200: what a failed check is judged against.
fn changes(history: &History) -> String {
    let lines: Vec<String> = history
        .records
        .iter()
        .filter_map(|r| match &r.what {
            Happening::Store(Entry::Commit {
                revision, events, ..
            }) => Some(format!(
                "{:>10.3}s  rev {:>5}  {}",
                r.at.as_secs_f64(),
                revision.0,
                events
                    .iter()
                    .map(|e| format!(
                        "{:?} {} (lease {:x}, created {})",
                        e.kind,
                        String::from_utf8_lossy(&e.kv.key),
                        e.kv.lease.0,
                        e.kv.create_revision.0
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => None,
        })
        .collect();
    lines[lines.len().saturating_sub(200)..].join("\n")
}

/// Watches every key from `from` on through `endpoint` alone, adding each revision's changes
/// to `observed` (keeping the earliest receipt); re-opens from the next revision when the
/// stream breaks (a member killed). A change is dated when it is received: later than it was
/// made, by as much as the observer's task lagged (see [`Witness::leader_start`]).
async fn observe(
    endpoint: String,
    mut from: Revision,
    observed: Observed,
    stop: CancellationToken,
) {
    loop {
        let opened = async {
            let options =
                etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_millis(250));
            let mut c = Client::connect([endpoint.as_str()], Some(options)).await?;
            let opts = WatchOptions::new()
                .with_from_key()
                .with_prev_key()
                .with_start_revision(from.0);
            c.watch("\0", Some(opts)).await
        };
        // A dead member can hold an attempt (the client's balancer waits for it): try again.
        let opened = tokio::time::timeout(Duration::from_millis(500), opened);
        let mut stream = tokio::select! {
            _ = stop.cancelled() => return,
            s = opened => match s {
                Ok(Ok(s)) => s,
                _ => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.message() => m,
            };
            let Ok(Some(resp)) = msg else { break };
            assert!(
                resp.compact_revision() == 0,
                "a witness's observer fell behind a compaction at {}: the history is incomplete",
                resp.compact_revision()
            );
            let at = Instant::now();
            let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                let kind = match e.event_type() {
                    EventType::Put => EventKind::Put,
                    EventType::Delete => EventKind::Delete,
                };
                by_revision
                    .entry(kv.mod_revision())
                    .or_default()
                    .push(Event {
                        kind,
                        kv: key_value(kv),
                        prev_kv: e.prev_kv().map(key_value),
                    });
            }
            let mut all = observed.lock().unwrap();
            for (revision, events) in by_revision {
                from = Revision(revision + 1);
                all.entry(revision)
                    .and_modify(|(earliest, _)| *earliest = (*earliest).min(at))
                    .or_insert((at, events));
            }
        }
    }
}

/// As [`observe`], through the trait's watch on `store`, of the keys under `prefix`: each
/// revision's events join those other prefixes' observers found in it, in key order.
async fn observe_store(
    store: Arc<DynKvLeaseStore>,
    prefix: &'static str,
    mut from: Revision,
    observed: Observed,
    stop: CancellationToken,
) {
    loop {
        let opened = store.watch(
            WatchRequest::prefix(prefix)
                .with_start_revision(from)
                .with_prev_kv(),
        );
        let opened = tokio::time::timeout(Duration::from_secs(1), opened);
        let mut stream = tokio::select! {
            _ = stop.cancelled() => return,
            s = opened => match s {
                Ok(Ok(s)) => s,
                _ => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.next() => m,
            };
            let resp = match msg {
                Some(Ok(resp)) => resp,
                Some(Err(coord_api::Error::Compacted { compact_revision, .. })) => panic!(
                    "a witness's observer fell behind a compaction at {compact_revision}: the history is incomplete"
                ),
                _ => break,
            };
            let at = Instant::now();
            let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
            for e in resp.events {
                by_revision
                    .entry(e.kv.mod_revision.get())
                    .or_default()
                    .push(e);
            }
            let mut all = observed.lock().unwrap();
            for (revision, events) in by_revision {
                from = Revision(revision + 1);
                let (earliest, known) = all.entry(revision).or_insert((at, Vec::new()));
                *earliest = (*earliest).min(at);
                known.extend(events);
                known.sort_by(|a, b| a.kv.key.cmp(&b.kv.key));
            }
        }
    }
}

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec().into(),
        value: kv.value().to_vec().into(),
        create_revision: Revision(kv.create_revision()),
        mod_revision: Revision(kv.mod_revision()),
        version: kv.version(),
        lease: LeaseId(kv.lease()),
    }
}

//! The differential test's sequences: generated operations run on `SimStore` and on a real
//! store (etcd, or PostgreSQL through `PostgresStore`), compared after normalising what
//! legitimately differs (see `differential_etcd.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use coord_api::{
    Compare, CompareOp, DeleteRequest, Error, Event, EventKind, GetRequest, KeyRange, KeyValue,
    KvLeaseStore, KvLeaseStoreExt, LeaseId, PutRequest, Revision, SortOrder, SortTarget, TxnOp,
    TxnOpResponse, TxnRequest, WatchRequest, WatchResponse, WatchStream,
};
use coord_etcd::testing::EtcdCluster;
use coord_postgres::testing::PostgresServer;
use coord_sim::SimStore;
use futures::StreamExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

const KEYS: [&str; 5] = ["a", "b", "c/1", "c/2", "c/3/x"];
const PREFIXES: [&str; 3] = ["c/", "c/3/", ""];
/// The prefixes compares range over: those of reads and deletes, and one no key ever has.
const CMP_PREFIXES: [&str; 4] = ["c/", "c/3/", "", "d/"];
const LEASE_TTL: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
enum Target {
    Key(u8),
    Prefix(u8),
}

/// A revision relative to the latest one a side has seen.
#[derive(Debug, Clone, Copy)]
enum Rev {
    Latest,
    Back(u8),
    Ahead(u8),
}

#[derive(Debug, Clone)]
enum Simple {
    Put {
        key: u8,
        value: u8,
        lease: Option<u8>,
    },
    Get {
        target: Target,
    },
    Delete {
        target: Target,
    },
}

#[derive(Debug, Clone, Copy)]
enum CmpTarget {
    Value(u8),
    Version(u8),
    CreateRevision(Rev),
    ModRevision(Rev),
    Lease(Option<u8>),
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        value: u8,
        lease: Option<u8>,
        prev_kv: bool,
    },
    Get {
        target: Target,
        at: Rev,
        limit: Option<u8>,
        /// Sort by target 0..5 (key, version, create, mod, value), descending if set.
        sort: Option<(u8, bool)>,
        /// Filter kind 0..4 (min create, max create, min mod, max mod) at a revision.
        filter: Option<(u8, Rev)>,
    },
    Delete {
        target: Target,
        prev_kv: bool,
    },
    Txn {
        /// Each compare: on one key or every key under a prefix (empty or not), by which
        /// relation (0..4), of which field.
        compares: Vec<(Target, u8, CmpTarget)>,
        then: Vec<Simple>,
        otherwise: Vec<Simple>,
    },
    Grant,
    Revoke {
        lease: u8,
    },
    TimeToLive {
        lease: u8,
    },
    Compact {
        at: Rev,
    },
    Watch {
        target: Target,
        from: u8,
        prev_kv: bool,
    },
    /// A progress request on the open watch with this index (modulo their number).
    Progress {
        watch: u8,
    },
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => (0..KEYS.len() as u8).prop_map(Target::Key),
        1 => (0..PREFIXES.len() as u8).prop_map(Target::Prefix),
    ]
}

fn rev() -> impl Strategy<Value = Rev> {
    prop_oneof![
        2 => Just(Rev::Latest),
        3 => (0..8u8).prop_map(Rev::Back),
        1 => (1..3u8).prop_map(Rev::Ahead),
    ]
}

fn lease_ref() -> impl Strategy<Value = Option<u8>> {
    prop_oneof![2 => Just(None), 1 => any::<u8>().prop_map(Some)]
}

fn simple() -> impl Strategy<Value = Simple> {
    prop_oneof![
        (0..KEYS.len() as u8, 0..4u8, lease_ref()).prop_map(|(key, value, lease)| Simple::Put {
            key,
            value,
            lease
        }),
        target().prop_map(|target| Simple::Get { target }),
        target().prop_map(|target| Simple::Delete { target }),
    ]
}

fn cmp_target() -> impl Strategy<Value = CmpTarget> {
    prop_oneof![
        (0..4u8).prop_map(CmpTarget::Value),
        (0..4u8).prop_map(CmpTarget::Version),
        rev().prop_map(CmpTarget::CreateRevision),
        rev().prop_map(CmpTarget::ModRevision),
        lease_ref().prop_map(CmpTarget::Lease),
    ]
}

/// A compare of every shape the trait can express: one key (present or not) or every key
/// under a prefix (holding keys or none), any relation, any field. Prefixes in two of five,
/// so that well over a fifth of the transactions carry one.
fn compare() -> impl Strategy<Value = (Target, u8, CmpTarget)> {
    let on = prop_oneof![
        3 => (0..KEYS.len() as u8).prop_map(Target::Key),
        2 => (0..CMP_PREFIXES.len() as u8).prop_map(Target::Prefix),
    ];
    (on, 0..4u8, cmp_target())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (0..KEYS.len() as u8, 0..4u8, lease_ref(), any::<bool>())
            .prop_map(|(key, value, lease, prev_kv)| Op::Put { key, value, lease, prev_kv }),
        15 => (target(), rev(), prop::option::of(1..4u8),
               prop::option::of((0..5u8, any::<bool>())), prop::option::of((0..4u8, rev())))
            .prop_map(|(target, at, limit, sort, filter)| Op::Get { target, at, limit, sort, filter }),
        10 => (target(), any::<bool>()).prop_map(|(target, prev_kv)| Op::Delete { target, prev_kv }),
        15 => (prop::collection::vec(compare(), 1..3),
               prop::collection::vec(simple(), 0..3), prop::collection::vec(simple(), 0..3))
            .prop_map(|(compares, then, otherwise)| Op::Txn { compares, then, otherwise }),
        7 => Just(Op::Grant),
        5 => any::<u8>().prop_map(|lease| Op::Revoke { lease }),
        4 => any::<u8>().prop_map(|lease| Op::TimeToLive { lease }),
        4 => rev().prop_map(|at| Op::Compact { at }),
        10 => (target(), 0..6u8, any::<bool>())
            .prop_map(|(target, from, prev_kv)| Op::Watch { target, from, prev_kv }),
        4 => any::<u8>().prop_map(|watch| Op::Progress { watch }),
    ]
}

/// A key-value with revisions relative to the sequence start and the lease by grant order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NKv {
    key: String,
    value: String,
    create: i64,
    modified: i64,
    version: i64,
    lease: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Get {
        rev: i64,
        kvs: Vec<NKv>,
        count: u64,
        more: bool,
    },
    Put {
        rev: i64,
        prev: Option<NKv>,
    },
    Delete {
        rev: i64,
        deleted: u64,
        prev: Vec<NKv>,
    },
    Txn {
        rev: i64,
        succeeded: bool,
        responses: Vec<Outcome>,
    },
    Grant {
        ttl: Duration,
    },
    Revoke {
        rev: i64,
    },
    TimeToLive {
        granted: Duration,
        keys: Vec<String>,
        ttl_plausible: bool,
    },
    Done,
    Err(String),
    Watch {
        events: Vec<(EventKind, NKv, Option<NKv>)>,
        end: Option<String>,
    },
    /// The answer to a progress request: its revision, or how the watch ended before it.
    Progress(std::result::Result<i64, String>),
}

/// An open watch, and what a progress request read off it before its answer.
struct Watching {
    target: Target,
    stream: WatchStream,
    read: Vec<coord_api::Result<WatchResponse>>,
    /// The latest revision (absolute) when the watch was opened: events up to it are history
    /// the watch catches up on.
    opened_at: i64,
    /// How many of the side's compactions came before the watch was opened.
    compacted_before: usize,
}

/// One side's run of a sequence.
struct Exec<'a> {
    store: &'a dyn KvLeaseStore,
    prefix: String,
    /// The side's revision before the sequence's first write.
    base: i64,
    /// The latest revision (absolute) seen in a response.
    latest: i64,
    leases: Vec<LeaseId>,
    watches: Vec<Watching>,
    /// Revisions (absolute) this side compacted at.
    compactions: Vec<Revision>,
}

impl Exec<'_> {
    fn norm(&self, rev: impl Into<i64>) -> i64 {
        let rev: i64 = rev.into();
        if rev == 0 {
            0
        } else {
            rev - self.base + 1
        }
    }

    fn abs(&self, sel: Rev) -> Revision {
        let r = match sel {
            Rev::Latest => self.latest,
            Rev::Back(n) => self.latest - i64::from(n),
            Rev::Ahead(n) => self.latest + i64::from(n),
        };
        Revision(r.max(self.base))
    }

    fn seen(&mut self, rev: impl Into<i64>) {
        self.latest = self.latest.max(rev.into());
    }

    fn key(&self, i: u8) -> String {
        format!("{}{}", self.prefix, KEYS[usize::from(i) % KEYS.len()])
    }

    fn range(&self, t: Target) -> KeyRange {
        match t {
            Target::Key(i) => KeyRange::Key(self.key(i).into()),
            Target::Prefix(i) => KeyRange::Prefix(
                format!(
                    "{}{}",
                    self.prefix,
                    PREFIXES[usize::from(i) % PREFIXES.len()]
                )
                .into(),
            ),
        }
    }

    fn lease(&self, i: u8) -> LeaseId {
        if self.leases.is_empty() {
            LeaseId(0x7eed_beef_0042)
        } else {
            self.leases[usize::from(i) % self.leases.len()]
        }
    }

    fn lease_name(&self, id: LeaseId) -> String {
        if id.is_none() {
            return "none".into();
        }
        match self.leases.iter().position(|l| *l == id) {
            Some(i) => format!("lease#{i}"),
            None => "unknown lease".into(),
        }
    }

    fn nkv(&self, kv: &KeyValue) -> NKv {
        NKv {
            key: String::from_utf8_lossy(&kv.key)
                .trim_start_matches(self.prefix.as_str())
                .to_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
            create: self.norm(kv.create_revision),
            modified: self.norm(kv.mod_revision),
            version: kv.version,
            lease: self.lease_name(kv.lease),
        }
    }

    fn err(&self, e: &Error) -> Outcome {
        Outcome::Err(match e {
            Error::Compacted {
                requested,
                compact_revision,
            } => format!(
                "Compacted(requested {}, at {})",
                self.norm(*requested),
                self.norm(*compact_revision)
            ),
            Error::FutureRevision { requested, current } => format!(
                "FutureRevision(requested {}, current {})",
                self.norm(*requested),
                self.norm(*current)
            ),
            Error::LeaseNotFound { lease } => format!("LeaseNotFound({})", self.lease_name(*lease)),
            other => format!("{:?}", other.class()),
        })
    }

    fn put_req(&self, key: u8, value: u8, lease: Option<u8>) -> PutRequest {
        let mut p = PutRequest::new(self.key(key), format!("v{value}"));
        if let Some(l) = lease {
            p = p.with_lease(self.lease(l));
        }
        p
    }

    fn simple(&self, s: &Simple) -> TxnOp {
        match s {
            Simple::Put { key, value, lease } => TxnOp::Put(self.put_req(*key, *value, *lease)),
            Simple::Get { target } => TxnOp::Get(GetRequest::range(self.range(*target))),
            Simple::Delete { target } => TxnOp::Delete(DeleteRequest::range(self.range(*target))),
        }
    }

    fn compare(&self, on: Target, op: u8, cmp: CmpTarget) -> Compare {
        let op = [
            CompareOp::Equal,
            CompareOp::NotEqual,
            CompareOp::Greater,
            CompareOp::Less,
        ][usize::from(op) % 4];
        let k = match on {
            Target::Key(i) => self.key(i),
            Target::Prefix(i) => format!(
                "{}{}",
                self.prefix,
                CMP_PREFIXES[usize::from(i) % CMP_PREFIXES.len()]
            ),
        };
        let compare = match cmp {
            CmpTarget::Value(v) => Compare::value(k, op, format!("v{v}")),
            CmpTarget::Version(v) => Compare::version(k, op, i64::from(v)),
            CmpTarget::CreateRevision(r) => Compare::create_revision(k, op, self.abs(r)),
            CmpTarget::ModRevision(r) => Compare::mod_revision(k, op, self.abs(r)),
            CmpTarget::Lease(l) => {
                // Lease ids are random on both sides, so only (in)equality compares alike.
                let op = if op == CompareOp::Equal {
                    op
                } else {
                    CompareOp::NotEqual
                };
                Compare::lease(k, op, l.map_or(LeaseId::NONE, |l| self.lease(l)))
            }
        };
        match on {
            Target::Key(_) => compare,
            Target::Prefix(_) => compare.with_prefix(),
        }
    }

    fn txn_outcome(&self, r: &coord_api::TxnResponse) -> Outcome {
        let responses = r
            .responses
            .iter()
            .map(|o| match o {
                TxnOpResponse::Get(g) => Outcome::Get {
                    rev: self.norm(g.revision),
                    kvs: g.kvs.iter().map(|kv| self.nkv(kv)).collect(),
                    count: g.count,
                    more: g.more,
                },
                TxnOpResponse::Put(p) => Outcome::Put {
                    rev: self.norm(p.revision),
                    prev: p.prev_kv.as_ref().map(|kv| self.nkv(kv)),
                },
                TxnOpResponse::Delete(d) => Outcome::Delete {
                    rev: self.norm(d.revision),
                    deleted: d.deleted,
                    prev: d.prev_kvs.iter().map(|kv| self.nkv(kv)).collect(),
                },
            })
            .collect();
        Outcome::Txn {
            rev: self.norm(r.revision),
            succeeded: r.succeeded,
            responses,
        }
    }

    async fn run(&mut self, op: &Op) -> Outcome {
        let s = self.store;
        match op {
            Op::Put {
                key,
                value,
                lease,
                prev_kv,
            } => {
                let mut req = self.put_req(*key, *value, *lease);
                req.prev_kv = *prev_kv;
                match s.put(req).await {
                    Ok(r) => {
                        self.seen(r.revision);
                        Outcome::Put {
                            rev: self.norm(r.revision),
                            prev: r.prev_kv.as_ref().map(|kv| self.nkv(kv)),
                        }
                    }
                    Err(e) => self.err(&e),
                }
            }
            Op::Get {
                target,
                at,
                limit,
                sort,
                filter,
            } => {
                let mut req = GetRequest::range(self.range(*target));
                if !matches!(at, Rev::Latest) {
                    req = req.with_revision(self.abs(*at));
                }
                if let Some(l) = limit {
                    req = req.with_limit(u64::from(*l));
                }
                if let Some((target, desc)) = sort {
                    let target = [
                        SortTarget::Key,
                        SortTarget::Version,
                        SortTarget::Create,
                        SortTarget::Mod,
                        SortTarget::Value,
                    ][usize::from(*target) % 5];
                    let order = if *desc {
                        SortOrder::Descend
                    } else {
                        SortOrder::Ascend
                    };
                    req = req.with_sort(target, order);
                }
                if let Some((kind, at)) = filter {
                    let rev = self.abs(*at);
                    req = match kind % 4 {
                        0 => req.with_min_create_revision(rev),
                        1 => req.with_max_create_revision(rev),
                        2 => req.with_min_mod_revision(rev),
                        _ => req.with_max_mod_revision(rev),
                    };
                }
                match s.get(req).await {
                    Ok(r) => Outcome::Get {
                        rev: self.norm(r.revision),
                        kvs: r.kvs.iter().map(|kv| self.nkv(kv)).collect(),
                        count: r.count,
                        more: r.more,
                    },
                    Err(e) => self.err(&e),
                }
            }
            Op::Delete { target, prev_kv } => {
                let mut req = DeleteRequest::range(self.range(*target));
                req.prev_kv = *prev_kv;
                match s.delete(req).await {
                    Ok(r) => {
                        self.seen(r.revision);
                        Outcome::Delete {
                            rev: self.norm(r.revision),
                            deleted: r.deleted,
                            prev: r.prev_kvs.iter().map(|kv| self.nkv(kv)).collect(),
                        }
                    }
                    Err(e) => self.err(&e),
                }
            }
            Op::Txn {
                compares,
                then,
                otherwise,
            } => {
                let req = TxnRequest::new()
                    .when(
                        compares
                            .iter()
                            .map(|(on, op, cmp)| self.compare(*on, *op, *cmp))
                            .collect::<Vec<_>>(),
                    )
                    .and_then(then.iter().map(|o| self.simple(o)).collect::<Vec<_>>())
                    .or_else(otherwise.iter().map(|o| self.simple(o)).collect::<Vec<_>>());
                let leases: std::collections::BTreeSet<LeaseId> = req
                    .success
                    .iter()
                    .chain(&req.failure)
                    .filter_map(|op| match op {
                        TxnOp::Put(p) => p.lease,
                        _ => None,
                    })
                    .collect();
                match s.txn(req).await {
                    Ok(r) => {
                        self.seen(r.revision);
                        self.txn_outcome(&r)
                    }
                    // etcd names no lease and no branch in this error; with several leases
                    // in play, which one the adapter reports is not comparable.
                    Err(Error::LeaseNotFound { .. }) if leases.len() > 1 => {
                        Outcome::Err("LeaseNotFound(one of the txn's leases)".into())
                    }
                    Err(e) => self.err(&e),
                }
            }
            Op::Grant => match s.grant(LEASE_TTL).await {
                Ok(g) => {
                    self.leases.push(g.id);
                    Outcome::Grant { ttl: g.ttl }
                }
                Err(e) => self.err(&e),
            },
            Op::Revoke { lease } => match s.revoke(self.lease(*lease)).await {
                Ok(rev) => {
                    self.seen(rev);
                    Outcome::Revoke {
                        rev: self.norm(rev),
                    }
                }
                Err(e) => self.err(&e),
            },
            Op::TimeToLive { lease } => match s.time_to_live(self.lease(*lease)).await {
                Ok(t) => Outcome::TimeToLive {
                    granted: t.granted_ttl,
                    keys: t
                        .keys
                        .iter()
                        .map(|k| {
                            String::from_utf8_lossy(k)
                                .trim_start_matches(self.prefix.as_str())
                                .to_owned()
                        })
                        .collect(),
                    // Real time passes on etcd, virtual-or-not time on the sim: only the
                    // bound is comparable.
                    ttl_plausible: t.ttl <= t.granted_ttl
                        && t.ttl + Duration::from_secs(5) >= t.granted_ttl,
                },
                Err(e) => self.err(&e),
            },
            Op::Compact { at } => match s.compact(self.abs(*at)).await {
                Ok(()) => {
                    self.compactions.push(self.abs(*at));
                    Outcome::Done
                }
                Err(e) => self.err(&e),
            },
            Op::Watch {
                target,
                from,
                prev_kv,
            } => {
                let start = (self.latest + 1 - i64::from(*from)).max(self.base);
                let mut req = WatchRequest::range(self.range(*target)).with_start_revision(start);
                req.prev_kv = *prev_kv;
                match s.watch(req).await {
                    Ok(stream) => {
                        self.watches.push(Watching {
                            target: *target,
                            stream,
                            read: Vec::new(),
                            opened_at: self.latest,
                            compacted_before: self.compactions.len(),
                        });
                        Outcome::Done
                    }
                    Err(e) => self.err(&e),
                }
            }
            Op::Progress { watch } => {
                if self.watches.is_empty() {
                    return Outcome::Done;
                }
                let i = usize::from(*watch) % self.watches.len();
                let answer = self.progress(i).await;
                Outcome::Progress(answer.map(|rev| self.norm(rev)))
            }
        }
    }

    /// Asks watch `i` for progress and reads up to the answer, keeping what came before it
    /// for [`drain_watches`](Self::drain_watches).
    async fn progress(&mut self, i: usize) -> std::result::Result<Revision, String> {
        let w = &mut self.watches[i];
        if let Some(Err(e)) = w.read.last() {
            return Err(format!("ended before: {}", end_kind(e)));
        }
        if let Err(e) = w.stream.request_progress() {
            return Err(format!("not sent: {e}"));
        }
        loop {
            match tokio::time::timeout(Duration::from_secs(5), w.stream.next()).await {
                Err(_) => return Err("no answer within 5 s".to_owned()),
                Ok(None) => return Err("ended".to_owned()),
                Ok(Some(Ok(batch))) if batch.is_progress_answer() => {
                    if !batch.events.is_empty() {
                        return Err(format!("an answer with events: {batch:?}"));
                    }
                    return Ok(batch.revision);
                }
                Ok(Some(item)) => {
                    let end = match &item {
                        Err(e) => Some(end_kind(e)),
                        Ok(_) => None,
                    };
                    w.read.push(item);
                    if let Some(end) = end {
                        return Err(end);
                    }
                }
            }
        }
    }

    /// Writes one sentinel key inside every watched range, then reads each watch up to the
    /// sentinel's revision: the events before it are the watch's whole output.
    async fn drain_watches(&mut self) -> Vec<Outcome> {
        let mut keys: Vec<String> = self
            .watches
            .iter()
            .map(|w| match self.range(w.target) {
                KeyRange::Key(k) => String::from_utf8_lossy(&k).into_owned(),
                KeyRange::Prefix(p) => format!("{}~end", String::from_utf8_lossy(&p)),
            })
            .collect();
        keys.sort();
        keys.dedup();
        let sentinel = if keys.is_empty() {
            return Vec::new();
        } else {
            let txn = TxnRequest::new().and_then(
                keys.iter()
                    .map(|k| PutRequest::new(k.clone(), "end"))
                    .collect::<Vec<_>>(),
            );
            self.store.txn(txn).await.expect("sentinel write").revision
        };
        let mut out = Vec::new();
        for w in std::mem::take(&mut self.watches) {
            let raced =
                |e: &Event| raced_prev(e, w.opened_at, &self.compactions[w.compacted_before..]);
            let mut w = futures::stream::iter(w.read).chain(w.stream);
            let mut events: Vec<Event> = Vec::new();
            let mut end = None;
            loop {
                match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
                    Err(_) => {
                        end = Some("no sentinel within 5 s".to_owned());
                        break;
                    }
                    Ok(None) => {
                        end = Some("ended".to_owned());
                        break;
                    }
                    Ok(Some(Err(e))) => {
                        end = Some(format!("{:?}", self.err(&e)));
                        break;
                    }
                    Ok(Some(Ok(batch))) => {
                        let done = batch.events.iter().any(|e| e.kv.mod_revision == sentinel);
                        // etcd#19179: a delete at exactly a compaction revision may or may not
                        // reach a watch from that revision (etcd drops the tombstone from its
                        // index at once, from its backend later). Not comparable; left out.
                        let compactions = &self.compactions;
                        events.extend(batch.events.into_iter().filter(|e| {
                            e.kv.mod_revision != sentinel
                                && !(e.kind == EventKind::Delete
                                    && compactions.contains(&e.kv.mod_revision))
                        }));
                        if done {
                            break;
                        }
                    }
                }
            }
            out.push(Outcome::Watch {
                events: events
                    .iter()
                    .map(|e| {
                        (
                            e.kind,
                            self.nkv(&e.kv),
                            e.prev_kv
                                .as_ref()
                                .filter(|_| !raced(e))
                                .map(|kv| self.nkv(kv)),
                        )
                    })
                    .collect(),
                end,
            });
        }
        out
    }

    async fn cleanup(&mut self) {
        for l in std::mem::take(&mut self.leases) {
            let _ = self.store.revoke(l).await;
        }
    }
}

async fn run_sequence(store: &dyn KvLeaseStore, prefix: String, ops: &[Op]) -> Vec<Outcome> {
    // One write outside the sequence's prefix first: on the shared etcd, an earlier sequence
    // may have compacted at exactly the current revision, and the fresh simulator has no such
    // compaction. After this write every earlier compaction is below the sequence's revisions.
    store
        .put_value("diff-fence", "x")
        .await
        .expect("fence write");
    let base = store.current_revision().await.expect("start revision");
    let mut exec = Exec {
        store,
        prefix,
        base: base.get(),
        latest: base.get(),
        leases: Vec::new(),
        watches: Vec::new(),
        compactions: Vec::new(),
    };
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(exec.run(op).await);
    }
    out.extend(exec.drain_watches().await);
    exec.cleanup().await;
    out
}

/// True when `e`'s previous value may or may not come with it, by timing alone.
///
/// A watch opened in the past catches up later (etcd: from a loop every 100 ms; PostgreSQL:
/// when the stream is first read), and each event's previous value is looked up then, at
/// `mod_revision - 1`. A compaction issued after the watch was opened, at or above an event
/// of its history, makes that lookup fail if it lands first: the event then comes without
/// its previous value. Either is etcd's behaviour, so neither side's is compared.
fn raced_prev(e: &Event, opened_at: i64, later_compactions: &[Revision]) -> bool {
    let rev = e.kv.mod_revision.get();
    rev <= opened_at && later_compactions.iter().any(|c| rev <= c.get())
}

/// How a watch ended, in terms both sides share.
fn end_kind(e: &Error) -> String {
    match e {
        Error::Compacted { .. } => "Compacted".to_owned(),
        other => format!("{:?}", other.class()),
    }
}

/// True for a watch that ended with `Compacted` before delivering anything, or a progress
/// request on one.
fn overtaken(o: &Outcome) -> bool {
    match o {
        Outcome::Watch {
            events,
            end: Some(end),
        } => events.is_empty() && end.contains("Compacted"),
        Outcome::Progress(Err(end)) => end.contains("Compacted"),
        _ => false,
    }
}

/// The index of the first outcome on which the two sides disagree.
///
/// One disagreement is legitimate: etcd catches up a watch that starts in the past from a
/// loop every 100 ms, so a compaction issued right after it may or may not overtake it. The
/// contract is "its whole history, or `Compacted`", and either side may land on either.
fn divergence(sim: &[Outcome], etcd: &[Outcome]) -> Option<usize> {
    if sim.len() != etcd.len() {
        return Some(sim.len().min(etcd.len()));
    }
    sim.iter().zip(etcd).position(|(a, b)| {
        let raced = matches!(
            (a, b),
            (Outcome::Watch { .. }, Outcome::Watch { .. })
                | (Outcome::Progress(_), Outcome::Progress(_))
        ) && (overtaken(a) || overtaken(b));
        a != b && !raced
    })
}

/// What a passing run covered.
pub(crate) struct Covered {
    pub(crate) sequences: u64,
    pub(crate) operations: u64,
    pub(crate) transactions: u64,
    pub(crate) prefix_transactions: u64,
}

/// Runs `cases` generated sequences on a fresh `SimStore` each and on one real etcd (started
/// here), drawing them from `rng`; the first divergence, shrunk (up to `shrink` steps) to a
/// minimal sequence, with both sides' outcomes, or what the run covered.
#[allow(dead_code)] // Each test binary that includes this module runs one of the two.
pub(crate) fn sim_and_etcd_agree(cases: u32, rng: TestRng, shrink: u32) -> Result<Covered, String> {
    let rt = runtime();
    let cluster = rt
        .block_on(EtcdCluster::single())
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let etcd = rt.block_on(cluster.store());
    sim_and_store_agree(&rt, &etcd, "etcd", cases, rng, shrink)
}

/// As [`sim_and_etcd_agree`], on one PostgreSQL server (started here) through `PostgresStore`.
#[allow(dead_code)] // Each test binary that includes this module runs one of the two.
pub(crate) fn sim_and_postgres_agree(
    cases: u32,
    rng: TestRng,
    shrink: u32,
) -> Result<Covered, String> {
    let rt = runtime();
    let server = rt
        .block_on(PostgresServer::start())
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
    let store = rt.block_on(server.store());
    sim_and_store_agree(&rt, &store, "postgres", cases, rng, shrink)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn sim_and_store_agree(
    rt: &tokio::runtime::Runtime,
    etcd: &dyn KvLeaseStore,
    side: &str,
    cases: u32,
    rng: TestRng,
    shrink: u32,
) -> Result<Covered, String> {
    let sequence = AtomicU64::new(0);
    let ops_run = AtomicU64::new(0);
    let (txns, prefix_txns) = (AtomicU64::new(0), AtomicU64::new(0));
    let config = Config {
        cases,
        max_shrink_iters: shrink,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&prop::collection::vec(op(), 30..46), |ops| {
        let n = sequence.fetch_add(1, Ordering::Relaxed);
        ops_run.fetch_add(ops.len() as u64, Ordering::Relaxed);
        for op in &ops {
            if let Op::Txn { compares, .. } = op {
                txns.fetch_add(1, Ordering::Relaxed);
                if compares
                    .iter()
                    .any(|(on, ..)| matches!(on, Target::Prefix(_)))
                {
                    prefix_txns.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let prefix = format!("diff/{n}/");
        let (sim_out, etcd_out) = rt.block_on(async {
            let sim = SimStore::new();
            let a = run_sequence(&sim, prefix.clone(), &ops).await;
            let b = run_sequence(etcd, prefix, &ops).await;
            (a, b)
        });
        if let Some(first) = divergence(&sim_out, &etcd_out) {
            return Err(TestCaseError::fail(format!(
                "sim and {side} diverge at outcome {first}:\n  sim:  {:?}\n  {side}: {:?}",
                sim_out.get(first),
                etcd_out.get(first)
            )));
        }
        Ok(())
    });
    result.map_err(|e| e.to_string())?;
    Ok(Covered {
        sequences: sequence.into_inner(),
        operations: ops_run.into_inner(),
        transactions: txns.into_inner(),
        prefix_transactions: prefix_txns.into_inner(),
    })
}

/// proptest's generator, drawn from `seed` alone.
pub(crate) fn rng(seed: u64) -> TestRng {
    let bytes: Vec<u8> = (0..4).flat_map(|_| seed.to_le_bytes()).collect();
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// The number of sequences: `PROPTEST_CASES`, or `default`.
#[allow(dead_code)] // Not every test binary that includes this module asks.
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run's seed: `COORD_DIFF_SEED`, or a fresh one (each run explores sequences no
/// earlier one did), printed by the caller so that a divergence replays.
#[allow(dead_code)] // Not every test binary that includes this module asks.
pub(crate) fn seed() -> u64 {
    std::env::var("COORD_DIFF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

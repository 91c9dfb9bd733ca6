//! The parts the fault tests run on any backend, and what they record: hosts registered, a
//! watcher's events, candidates campaigning and writing through their fence, each
//! leadership as its candidate believed it; all of it witnessed (`witness.rs`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::recipes::{
    ClusterWatcher, ClusterWatcherConfig, Election, HostRegistration, RegistrationConfig,
    RegistrationStatus, Session, SessionConfig,
};
use coord_api::testkit::eventually;
use coord_api::testkit::proxy::TcpProxy;
use coord_api::{DynKvLeaseStore, KvLeaseStoreExt, PutRequest, Revision, TxnRequest};
use coord_chaos::{Emitted, FencedWrites, Happening};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::witness::Witness;

/// Every session's TTL.
pub(crate) const TTL: Duration = Duration::from_secs(3);
/// Slack for the server's own timers and a loaded 2-core machine.
pub(crate) const SLACK: Duration = Duration::from_secs(1);
/// The election the candidates campaign in.
pub(crate) const ELECTION: &str = "jobs";
/// The key a leader writes its token to, through its fence, every [`WORK_EVERY`].
pub(crate) const WORK: &str = "work/jobs";
/// How often a leader writes.
const WORK_EVERY: Duration = Duration::from_millis(100);

pub(crate) fn register(host: &str) -> RegistrationConfig {
    register_on(host).with_ttl(TTL)
}

/// [`register`] for a host session's lease, whose TTL is the session's.
pub(crate) fn register_on(host: &str) -> RegistrationConfig {
    RegistrationConfig::new(format!("hosts/{host}"), host.to_owned())
        .with_backoff(Duration::from_millis(100), Duration::from_secs(1))
}

/// A watcher's events, each with when it arrived.
#[derive(Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<Vec<(Instant, Emitted)>>>);

impl Seen {
    pub(crate) fn downs(&self, host: &str) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| matches!(e, Emitted::Down(h, _) if h == host))
            .map(|(t, _)| *t)
            .collect()
    }

    pub(crate) fn ups(&self, host: &str) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| matches!(e, Emitted::Up(h, ..) if h == host))
            .map(|(t, _)| *t)
            .collect()
    }

    /// Whether the watcher emitted `host` up at `revision` or later.
    pub(crate) fn up_since(&self, host: &str, revision: Revision) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|(_, e)| matches!(e, Emitted::Up(h, _, r) if h == host && *r >= revision))
    }

    /// How many times the watcher re-listed.
    /// When the latest event was emitted.
    pub(crate) fn last_event(&self) -> Option<Instant> {
        self.0.lock().unwrap().last().map(|(at, _)| *at)
    }

    pub(crate) fn relists(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| matches!(e, Emitted::Resynced(_)))
            .count()
    }

    /// The events applied in order to an empty set: what the watcher's consumer believes.
    pub(crate) fn replayed(&self) -> BTreeSet<String> {
        let mut up = BTreeSet::new();
        for (_, e) in self.0.lock().unwrap().iter() {
            match e {
                Emitted::Up(host, ..) => {
                    assert!(up.insert(host.clone()), "HostUp {host} twice in a row");
                }
                Emitted::Down(host, _) => {
                    assert!(up.remove(host), "HostDown {host} while it was down");
                }
                _ => {}
            }
        }
        up
    }
}

/// A watcher on `store`, its events collected and its views and events witnessed.
pub(crate) async fn observe(store: &Arc<DynKvLeaseStore>, witness: &Witness) -> Seen {
    observe_as("watcher", store, witness).await
}

/// As [`observe`], the watcher witnessed as `who`.
pub(crate) async fn observe_as(who: &str, store: &Arc<DynKvLeaseStore>, witness: &Witness) -> Seen {
    let watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("hosts/"))
        .await
        .unwrap();
    let seen = Seen::default();
    let log = seen.clone();
    witness.follow(who, watcher, move |h| {
        if let Happening::Emitted(_, e) = h {
            log.0.lock().unwrap().push((Instant::now(), e.clone()));
        }
    });
    seen
}

/// One leadership: who, its token, from when, until when (`None` while it lasts).
type Belief = (String, Revision, Instant, Option<Instant>);

/// Leadership beliefs of one election, as each candidate held them, and when an operator
/// deposed a leader.
#[derive(Clone)]
pub(crate) struct Leaders(
    Arc<Mutex<Vec<Belief>>>,
    Arc<Witness>,
    Arc<Mutex<Vec<Instant>>>,
);

impl std::fmt::Debug for Leaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.lock().unwrap().iter())
            .finish()
    }
}

impl Leaders {
    /// Beliefs in the election [`ELECTION`], witnessed; the witness also holds the store to
    /// the leaders' fence: every write of [`WORK`] it accepted carries the token of the leader
    /// at that revision, and tokens there never go back.
    pub(crate) fn new(witness: &Arc<Witness>) -> Self {
        witness.also_check(FencedWrites::new(ELECTION, WORK, |value| {
            std::str::from_utf8(value).ok()?.parse().ok().map(Revision)
        }));
        Leaders(Arc::default(), witness.clone(), Arc::default())
    }

    /// Notes that the test, as an operator, is about to delete the leader's key: the leader
    /// learns it from its watch as its successor does, and which of the two tasks records it
    /// first is the scheduler's choice, so their beliefs may overlap by that much. The
    /// deposed one must have let go within [`SLACK`] of the delete (S3's side of it).
    pub(crate) fn deposing(&self) {
        self.1.operator_acts();
        self.2.lock().unwrap().push(Instant::now());
    }

    /// A candidate that campaigns for as long as the task runs, recording each leadership;
    /// while it leads, it writes its token to [`WORK`] through its fence every 100 ms.
    pub(crate) fn candidate(&self, store: Arc<DynKvLeaseStore>, who: &str) -> JoinHandle<()> {
        let (log, who) = (self.clone(), who.to_owned());
        tokio::spawn(async move {
            loop {
                let Ok(session) =
                    Session::new(store.clone(), SessionConfig::default().with_ttl(TTL)).await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let Ok(lead) = Election::new(&session, ELECTION)
                    .campaign(who.clone())
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let i = {
                    let mut l = log.0.lock().unwrap();
                    l.push((who.clone(), lead.token(), Instant::now(), None));
                    log.1.leader_start(&who, ELECTION, lead.token());
                    l.len() - 1
                };
                let work = async {
                    loop {
                        tokio::time::sleep(WORK_EVERY).await;
                        let write = PutRequest::new(WORK, lead.token().to_string());
                        // Refused once the term is over (the fence), or lost in a fault.
                        let _ = lead.txn(TxnRequest::new().and_then([write])).await;
                    }
                };
                tokio::select! {
                    _ = lead.lost() => {}
                    _ = work => {}
                }
                let mut l = log.0.lock().unwrap();
                l[i].3 = Some(Instant::now());
                log.1.leader_end(&who, ELECTION, lead.token());
            }
        })
    }

    /// S1/S2: leaderships never overlap, and tokens only grow.
    pub(crate) fn assert_exclusive(&self) {
        let l = self.0.lock().unwrap();
        let mut sorted: Vec<_> = l.iter().cloned().collect();
        sorted.sort_by_key(|x| x.2);
        for w in sorted.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            assert!(b.1 > a.1, "token {} after token {}", b.1, a.1);
            let a_end = a.3.expect("an earlier leadership has ended");
            let deposed = self
                .2
                .lock()
                .unwrap()
                .iter()
                .any(|&d| d <= b.2 && a_end <= d + SLACK);
            assert!(
                a_end <= b.2 || deposed,
                "{} (token {}) and {} (token {}) both led for {:?}",
                a.0,
                a.1,
                b.0,
                b.1,
                a_end - b.2
            );
        }
    }

    /// The leadership believed now, if any.
    pub(crate) fn current(&self) -> Option<(String, Revision)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|x| x.3.is_none())
            .map(|x| (x.0.clone(), x.1))
    }

    /// How many leaderships began.
    pub(crate) fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

pub(crate) async fn all_registered(
    regs: &[HostRegistration],
    store: &Arc<DynKvLeaseStore>,
) -> bool {
    for r in regs {
        let lease = r.lease_id();
        let ok = matches!(r.status(), RegistrationStatus::Registered { .. })
            && store
                .get_key(r.key())
                .await
                .ok()
                .flatten()
                .is_some_and(|kv| kv.lease == lease);
        if !ok {
            return false;
        }
    }
    true
}

/// Hosts a, b and c registered, and candidates x and y campaigning, one of them leading.
pub(crate) async fn hosts_and_an_election(
    store: &Arc<DynKvLeaseStore>,
    witness: &Arc<Witness>,
) -> (Vec<HostRegistration>, Leaders, [JoinHandle<()>; 2]) {
    let mut regs = Vec::new();
    for h in ["a", "b", "c"] {
        regs.push(
            HostRegistration::start(store.clone(), register(h))
                .await
                .unwrap(),
        );
    }
    let leaders = Leaders::new(witness);
    let candidates = [
        leaders.candidate(store.clone(), "x"),
        leaders.candidate(store.clone(), "y"),
    ];
    eventually(SLACK * 3, "a leader", || async {
        leaders.current().is_some()
    })
    .await;
    (regs, leaders, candidates)
}

/// What a fault the recipes ride through must leave as it was: the leader, how many
/// leaderships began, and each host's HostDown count.
#[derive(Debug, PartialEq)]
pub(crate) struct Standing {
    leader: Option<(String, Revision)>,
    leaderships: usize,
    downs: Vec<usize>,
}

pub(crate) fn standing(regs: &[HostRegistration], seen: &Seen, leaders: &Leaders) -> Standing {
    Standing {
        leader: leaders.current(),
        leaderships: leaders.count(),
        downs: regs
            .iter()
            .map(|r| seen.downs(&r.key()["hosts/".len()..]).len())
            .collect(),
    }
}

/// After a TTL and a second of quiet: every registration healthy, and nothing changed since
/// `before` (no HostDown, the same leader, no leadership begun).
pub(crate) async fn assert_ridden_through(
    what: &str,
    store: &Arc<DynKvLeaseStore>,
    regs: &[HostRegistration],
    seen: &Seen,
    leaders: &Leaders,
    before: Standing,
) {
    tokio::time::sleep(TTL + SLACK).await;
    assert!(
        all_registered(regs, store).await,
        "a registration unhealthy after {what}"
    );
    assert_eq!(
        standing(regs, seen, leaders),
        before,
        "HostDown or a leadership change on {what}: {leaders:?}"
    );
    leaders.assert_exclusive();
}

/// Host p, registered and leading through `client` (a proxy of its own, so it alone can be cut
/// off); candidate q queued behind it on `store`, direct; a watcher on `store`.
pub(crate) struct Partitionable {
    /// A direct client.
    pub(crate) store: Arc<DynKvLeaseStore>,
    pub(crate) witness: Arc<Witness>,
    pub(crate) seen: Seen,
    pub(crate) proxy: TcpProxy,
    pub(crate) reg: HostRegistration,
    pub(crate) leaders: Leaders,
    _candidates: [JoinHandle<()>; 2],
}

pub(crate) async fn partitionable(
    store: Arc<DynKvLeaseStore>,
    client: Arc<DynKvLeaseStore>,
    proxy: TcpProxy,
    witness: Arc<Witness>,
) -> Partitionable {
    let seen = observe(&store, &witness).await;
    let reg = HostRegistration::start(client.clone(), register("p"))
        .await
        .unwrap();
    let leaders = Leaders::new(&witness);
    let p = leaders.candidate(client.clone(), "p");
    eventually(SLACK * 3, "p to lead", || async {
        leaders.current().is_some()
    })
    .await;
    let q = leaders.candidate(store.clone(), "q");
    eventually(SLACK, "q to queue", || async {
        store.get_prefix("jobs/").await.unwrap().count == 2
    })
    .await;
    Partitionable {
        store,
        witness,
        seen,
        proxy,
        reg,
        leaders,
        _candidates: [p, q],
    }
}

/// p cut off for less than TTL - 2 x (TTL/3): no HostDown, no leader change.
pub(crate) async fn a_partition_shorter_than_the_ttl_is_ridden_through(setup: &Partitionable) {
    let Partitionable {
        witness,
        seen,
        proxy,
        reg,
        leaders,
        ..
    } = setup;
    let before = leaders.current();
    // A renewal period of margin on each side.
    let cut = TTL / 3 - Duration::from_millis(200);
    proxy.blackhole();
    tokio::time::sleep(cut).await;
    proxy.heal();
    tokio::time::sleep(TTL + SLACK).await;
    assert!(
        seen.downs("p").is_empty(),
        "HostDown for a {cut:?} partition"
    );
    assert_eq!(
        leaders.current(),
        before,
        "the leader changed over a {cut:?} partition"
    );
    assert!(matches!(
        reg.status(),
        RegistrationStatus::Registered { .. }
    ));
    leaders.assert_exclusive();
    witness.check().await;
    println!("measured: a {cut:?} partition: no HostDown, no leader change");
}

/// p cut off for two TTLs: HostDown and q's leadership within the TTL, the server's expiry
/// granularity (`expiry`) and the slack of the cut; HostUp soon after the heal.
pub(crate) async fn a_partition_longer_than_the_ttl_expires_then_heals(
    setup: &Partitionable,
    expiry: Duration,
) {
    let Partitionable {
        store,
        witness,
        seen,
        proxy,
        reg,
        leaders,
        ..
    } = setup;
    proxy.blackhole();
    let cut = Instant::now();
    // L3: the key goes by the last renewal + TTL + the expiry granularity; the watcher says
    // so at once.
    let down_bound = TTL + expiry + SLACK;
    eventually(down_bound, "HostDown for p", || async {
        !seen.downs("p").is_empty()
    })
    .await;
    let down = cut.elapsed();
    eventually(down_bound, "q to take over", || async {
        leaders.current().is_some_and(|(w, _)| w == "q")
    })
    .await;
    let failover = cut.elapsed();
    tokio::time::sleep((TTL * 2).saturating_sub(cut.elapsed())).await;
    proxy.heal();
    let healed_at = Instant::now();
    // L1: back within the backoff and a couple of requests.
    let up_bound = Duration::from_secs(1) + TTL / 3 * 2 + SLACK;
    eventually(up_bound, "HostUp for p again", || async {
        seen.ups("p").len() >= 2
    })
    .await;
    let up = healed_at.elapsed();
    // The watcher (on another connection) may see the key land before p reads the reply
    // that tells it so: p's status must follow within the slack, not at the same instant.
    eventually(SLACK, "p's registration to say Registered", || async {
        matches!(reg.status(), RegistrationStatus::Registered { .. })
    })
    .await;
    // Watch after the heal: a TTL and a second with nothing changing.
    let regs = std::slice::from_ref(reg);
    let before = standing(regs, seen, leaders);
    assert_ridden_through("the heal", store, regs, seen, leaders, before).await;
    witness.check().await;
    println!(
        "measured: partition of {:?}: HostDown {down:?} after the cut (bound {down_bound:?}), q leads {failover:?} after; HostUp {up:?} after the heal (bound {up_bound:?})",
        TTL * 2
    );
}

/// A middlebox forgets every connection of p's client (`client`, through `proxies`) at once,
/// twice: they stay open and carry nothing, either way (a partition that outlived TCP's
/// retransmissions). Only timeouts tell, and the client, at the library's default timeouts,
/// must replace them before its sessions' deadlines: no HostDown for p, no leader change,
/// and the watcher on p's client sees a host that registers afterwards.
pub(crate) async fn connections_that_die_without_a_reset_are_replaced(
    store: Arc<DynKvLeaseStore>,
    client: Arc<DynKvLeaseStore>,
    proxies: &[TcpProxy],
    witness: Arc<Witness>,
) {
    let seen = observe(&store, &witness).await;
    let reg = HostRegistration::start(client.clone(), register("p"))
        .await
        .unwrap();
    let seen_by_p = observe_as("p's watcher", &client, &witness).await;
    let leaders = Leaders::new(&witness);
    let _p = leaders.candidate(client.clone(), "p");
    eventually(SLACK * 3, "p to lead", || async {
        leaders.current().is_some()
    })
    .await;
    let _q = leaders.candidate(store.clone(), "q");
    let before = leaders.current();
    for wave in 1..=2 {
        for proxy in proxies {
            proxy.freeze_connections();
        }
        tokio::time::sleep(TTL + SLACK).await;
        assert!(seen.downs("p").is_empty(), "HostDown for p in wave {wave}");
        assert_eq!(
            leaders.current(),
            before,
            "the leader changed in wave {wave}"
        );
        assert!(
            matches!(reg.status(), RegistrationStatus::Registered { .. }),
            "p unregistered in wave {wave}: {:?}",
            reg.status()
        );
    }
    let after = HostRegistration::start(store.clone(), register("after"))
        .await
        .unwrap();
    let registered = Instant::now();
    eventually(
        TTL + SLACK,
        "the watcher on p's client to see a new host",
        || async { !seen_by_p.ups("after").is_empty() },
    )
    .await;
    let took = registered.elapsed();
    drop(after);
    leaders.assert_exclusive();
    witness.check().await;
    println!("measured: every connection of p's client frozen, twice, {:?} apart: no HostDown, no leader change; its watcher saw a new host {took:?} after", TTL + SLACK);
}

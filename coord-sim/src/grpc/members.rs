//! What each member of a simulated etcd cluster answers while members fail: who leads, who
//! is cut off, when an election ends, and so whether a request is served, refused or held.
//! The rules are etcd's as a client sees them (3.5's or 3.4's, as chosen), measured on real
//! three-member clusters of both (`tests/members_etcd.rs`; the simulator runs the same probe
//! in `tests/members_sim.rs`).
//! Times are simulated time since the start of the run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::Status;

/// Which etcd a [`SimCluster`](super::SimCluster)'s members answer as, where a client can tell
/// the versions apart (`docs/ETCD-BEHAVIOUR.md` 3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EtcdVersion {
    /// etcd 3.4 (measured on 3.4.23): no pre-vote, so a member cut off from its peers forces
    /// an election when it rejoins (its lone campaigns raised its term).
    V3_4,
    /// etcd 3.5 (measured on 3.5.1), what most production runs: pre-vote, so a rejoining
    /// member leaves the leader be.
    #[default]
    V3_5,
}

impl EtcdVersion {
    /// The version a member's status reports.
    pub fn reported(self) -> &'static str {
        match self {
            EtcdVersion::V3_4 => "3.4.23 (coord-sim)",
            EtcdVersion::V3_5 => "3.5.1 (coord-sim)",
        }
    }

    fn pre_vote(self) -> bool {
        self == EtcdVersion::V3_5
    }

    /// Whether a raft leader paused and replaced revokes, on resuming, the leases it saw
    /// overdue (etcd#15247, fixed in 3.4.24 and 3.5.8): seen on 3.4.23 (`docs/ETCD-BEHAVIOUR.md`
    /// 3.9), modelled there, at every such resume.
    pub(crate) fn revokes_on_resume(self) -> bool {
        self == EtcdVersion::V3_4
    }
}

/// What a request does at a member, for the rules below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// A proposal: put, delete, a txn that writes, grant, revoke, compact.
    Write,
    /// A linearizable read (a range, a read-only txn, a lease's time to live).
    Read,
    /// A lease renewal (forwarded to the leader).
    Renew,
    /// Opening a watch or keep-alive stream, or a status request: served by the member
    /// itself.
    Local,
}

/// A member's answer to a request, decided from the cluster's state when asked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Go,
    Refuse(Refusal),
    /// Held, then refused at the instant: the request is lost (a proposal to a dead or
    /// unreachable leader), whatever happens meanwhile.
    FailAt(Duration, Refusal),
    /// Held until the instant or until the cluster changes, then asked again.
    WaitUntil(Duration),
}

/// An election in progress: followers keep following the old leader until `believed_until`
/// (an election timeout after it was lost), then campaign; `next` leads from `elected_at`.
#[derive(Debug, Clone, Copy)]
struct Election {
    believed_until: Duration,
    elected_at: Duration,
    next: usize,
}

#[derive(Debug)]
struct State {
    up: Vec<bool>,
    leader: usize,
    term: u64,
    /// The member cut off from its peers, and since when.
    isolated: Option<(usize, Duration)>,
    /// Members stalled (a paused process: its kernel accepts connections and keeps what is
    /// sent, nothing answers, its peers count it gone) until thawed.
    stalled: Vec<bool>,
    /// How late each member answers (a slow member: every answer, each stream's every
    /// message).
    slow: Vec<Duration>,
    election: Option<Election>,
    /// The leader that stalled, and when its successor leads: what it revokes on thawing
    /// (see [`EtcdVersion::revokes_on_resume`]).
    stalled_leader: Option<(usize, Duration)>,
}

/// The cluster's membership state, shared by its members' services and the test's driver.
#[derive(Debug, Clone)]
pub(crate) struct Members {
    state: Arc<Mutex<State>>,
    /// Bumped on every change, so that held requests look again.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    election_timeout: Duration,
    version: EtcdVersion,
}

/// How a member refuses a request, in etcd's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    NoLeader,
    TimedOut,
    TimedOutLeaderFailed,
    DeadlineExceeded,
    LeaderChanged,
}

impl Refusal {
    pub(crate) fn status(self) -> Status {
        match self {
            Refusal::NoLeader => Status::unavailable("etcdserver: no leader"),
            Refusal::TimedOut => Status::unavailable("etcdserver: request timed out"),
            Refusal::TimedOutLeaderFailed => Status::unavailable(
                "etcdserver: request timed out, possibly due to previous leader failure",
            ),
            Refusal::DeadlineExceeded => Status::unknown("context deadline exceeded"),
            Refusal::LeaderChanged => Status::unavailable("etcdserver: leader changed"),
        }
    }
}

impl Members {
    pub(crate) fn new(members: usize, election_timeout: Duration, version: EtcdVersion) -> Self {
        Members {
            state: Arc::new(Mutex::new(State {
                up: vec![true; members],
                leader: 0,
                term: 2,
                isolated: None,
                stalled: vec![false; members],
                slow: vec![Duration::ZERO; members],
                election: None,
                stalled_leader: None,
            })),
            changed: Arc::new(tokio::sync::watch::Sender::new(0)),
            election_timeout,
            version,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// etcd's own request timeout: 5 s plus two election timeouts. A request held by the
    /// server is answered by it at the latest.
    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_secs(5) + self.election_timeout * 2
    }

    pub(crate) fn election_timeout(&self) -> Duration {
        self.election_timeout
    }

    /// The etcd the members answer as.
    pub(crate) fn version(&self) -> EtcdVersion {
        self.version
    }

    /// The leader at `now`, if one is elected.
    pub(crate) fn leader(&self, now: Duration) -> Option<usize> {
        let mut s = self.lock();
        settle(&mut s, now);
        s.election.is_none().then_some(s.leader)
    }

    /// The leader member `i` knows of at `now` (`None` when it knows it has none), and the
    /// raft term, as its status reports them.
    pub(crate) fn status(&self, i: usize, now: Duration) -> (Option<usize>, u64) {
        let mut s = self.lock();
        settle(&mut s, now);
        let cut_off = s
            .isolated
            .is_some_and(|(m, since)| m == i && now >= since + self.election_timeout);
        let leader = match s.election {
            _ if cut_off => None,
            Some(e) if now >= e.believed_until => None,
            _ => Some(s.leader),
        };
        // Followers keep the old term until they campaign, an election timeout after they
        // last heard the lost leader.
        let term = match s.election {
            Some(e) if now < e.believed_until => s.term - 1,
            _ => s.term,
        };
        (leader, term)
    }

    /// Whether member `i` is up.
    pub(crate) fn is_up(&self, i: usize) -> bool {
        self.lock().up[i]
    }

    /// The leader is lost at `now` (killed, or cut off): the others elect the next member
    /// that is up and reachable after two election timeouts. Returns when it leads.
    fn lose_leader(&self, s: &mut State, now: Duration) -> Duration {
        let n = s.up.len();
        let cut = s.isolated.map(|(m, _)| m);
        let next = (1..n)
            .map(|k| (s.leader + k) % n)
            .find(|&m| s.up[m] && Some(m) != cut && !s.stalled[m])
            .unwrap_or(s.leader);
        let et = self.election_timeout;
        let e = Election {
            believed_until: now + et,
            elected_at: now + et * 2,
            next,
        };
        s.election = Some(e);
        s.term += 1;
        e.elected_at
    }

    /// Member `i` killed at `now`. Returns when a new leader is elected, if it led.
    pub(crate) fn kill(&self, i: usize, now: Duration) -> Option<Duration> {
        let mut s = self.lock();
        settle(&mut s, now);
        s.up[i] = false;
        let led = s.leader == i && s.election.is_none();
        let elected = led.then(|| self.lose_leader(&mut s, now));
        drop(s);
        self.bump();
        elected
    }

    /// Member `i` started again: it catches up from the leader and follows.
    pub(crate) fn restart(&self, i: usize) {
        self.lock().up[i] = true;
        self.bump();
    }

    /// Every member down (a power cut), or every member back; the leader stays the same.
    pub(crate) fn set_all_up(&self, up: bool) {
        self.lock().up.iter_mut().for_each(|u| *u = up);
        self.bump();
    }

    /// Member `i` cut off from its peers at `now`. Returns when a new leader is elected, if
    /// it led.
    pub(crate) fn isolate(&self, i: usize, now: Duration) -> Option<Duration> {
        let mut s = self.lock();
        settle(&mut s, now);
        s.isolated = Some((i, now));
        let led = s.leader == i && s.election.is_none();
        let elected = led.then(|| self.lose_leader(&mut s, now));
        drop(s);
        self.bump();
        elected
    }

    /// The cut-off member rejoins at `now`. On etcd 3.4 its campaigns while cut off raised its
    /// term, and without pre-vote the leader steps down and the cluster elects again,
    /// everyone campaigning at once (no leader known, no proposal lost); returns when the new
    /// leader leads. On etcd 3.5 pre-vote kept its term, and it follows the leader.
    pub(crate) fn rejoin(&self, now: Duration) -> Option<Duration> {
        let mut s = self.lock();
        settle(&mut s, now);
        s.isolated.take()?;
        let elected = if s.election.is_none() && !self.version.pre_vote() {
            let et = self.election_timeout;
            let e = Election {
                believed_until: now,
                elected_at: now + et,
                next: s.leader,
            };
            s.election = Some(e);
            s.term += 1;
            Some(e.elected_at)
        } else {
            None
        };
        drop(s);
        self.bump();
        elected
    }

    /// Member `i` stalled at `now` (SIGSTOP): it answers nothing until thawed, while its
    /// kernel keeps accepting and buffering; its peers stop hearing it. Returns when a new
    /// leader is elected, if it led.
    pub(crate) fn stall(&self, i: usize, now: Duration) -> Option<Duration> {
        let mut s = self.lock();
        settle(&mut s, now);
        s.stalled[i] = true;
        let led = s.leader == i && s.election.is_none();
        let elected = led.then(|| self.lose_leader(&mut s, now));
        if let Some(at) = elected {
            s.stalled_leader = Some((i, at));
        }
        drop(s);
        self.bump();
        elected
    }

    /// Member `i` thawed (SIGCONT): it reads what was sent meanwhile and answers it; a
    /// leader that was replaced meanwhile learns the newer term from its peers and follows.
    /// Returns when its successor began to lead, if it led when it stalled and its version
    /// then revokes what it saw overdue (the caller revokes it, if that instant has passed).
    pub(crate) fn thaw(&self, i: usize) -> Option<Duration> {
        let mut s = self.lock();
        s.stalled[i] = false;
        let stale = match s.stalled_leader {
            Some((m, at)) if m == i => {
                s.stalled_leader = None;
                self.version.revokes_on_resume().then_some(at)
            }
            _ => None,
        };
        drop(s);
        self.bump();
        stale
    }

    /// Whether member `i` is stalled.
    pub(crate) fn is_stalled(&self, i: usize) -> bool {
        self.lock().stalled[i]
    }

    /// Member `i` answers `late` late from now on (zero: on time).
    pub(crate) fn slow(&self, i: usize, late: Duration) {
        self.lock().slow[i] = late;
        self.bump();
    }

    /// How late member `i` answers.
    pub(crate) fn lateness(&self, i: usize) -> Duration {
        self.lock().slow[i]
    }

    /// Leadership handed to member `to` (`etcdctl move-leader`): it leads at once.
    pub(crate) fn transfer(&self, to: usize, now: Duration) -> bool {
        let mut s = self.lock();
        settle(&mut s, now);
        if s.election.is_some()
            || s.leader == to
            || !s.up[to]
            || s.isolated.is_some()
            || s.stalled.contains(&true)
        {
            return false;
        }
        s.leader = to;
        s.term += 1;
        drop(s);
        self.bump();
        true
    }

    /// The answer of member `i` at `now` to a request of kind `call` that arrived at
    /// `arrived`, carrying require-leader or not.
    pub(crate) fn verdict(
        &self,
        i: usize,
        now: Duration,
        arrived: Duration,
        call: Call,
        require_leader: bool,
    ) -> Verdict {
        let mut s = self.lock();
        settle(&mut s, now);
        let et = self.election_timeout;
        let deadline = arrived + self.request_timeout();
        if let Some((_, since)) = s.isolated.filter(|(m, _)| *m == i) {
            // It follows its old leader for an election timeout, then knows it has none.
            let knew_leader = arrived < since + et;
            if require_leader && now >= since + et {
                return Verdict::Refuse(Refusal::NoLeader);
            }
            return match call {
                Call::Local => Verdict::Go,
                // A proposal sent to the unreachable leader is lost; without a leader, raft
                // takes no proposal until the server's deadline.
                Call::Write if knew_leader => Verdict::FailAt(deadline, Refusal::TimedOut),
                Call::Write => Verdict::FailAt(deadline, Refusal::DeadlineExceeded),
                Call::Read | Call::Renew if now >= deadline => Verdict::Refuse(Refusal::TimedOut),
                Call::Read | Call::Renew => Verdict::WaitUntil(deadline),
            };
        }
        if let Some(e) = s.election {
            let following_dead = arrived < e.believed_until;
            if require_leader && !following_dead {
                return Verdict::Refuse(Refusal::NoLeader);
            }
            return match call {
                Call::Local => Verdict::Go,
                Call::Write if following_dead => {
                    Verdict::FailAt(deadline, Refusal::TimedOutLeaderFailed)
                }
                // A read index asked of the dead leader ends with the election.
                Call::Read if following_dead => {
                    Verdict::FailAt(e.elected_at, Refusal::LeaderChanged)
                }
                Call::Write | Call::Read | Call::Renew => Verdict::WaitUntil(e.elected_at),
            };
        }
        Verdict::Go
    }

    /// When a require-leader stream on member `i` is ended with `no leader` (etcd's leader
    /// monitor: three checks an election timeout apart after the member lost its leader),
    /// if it is cut off.
    pub(crate) fn stream_end(&self, i: usize) -> Option<Duration> {
        let s = self.lock();
        s.isolated
            .filter(|(m, _)| *m == i)
            .map(|(_, since)| since + self.election_timeout * 4)
    }

    /// Whether member `i` sends its clients nothing new: cut off (its own state stops
    /// moving) or stalled.
    pub(crate) fn is_cut_off(&self, i: usize) -> bool {
        let s = self.lock();
        s.isolated.is_some_and(|(m, _)| m == i) || s.stalled[i]
    }

    /// A receiver that wakes on every change.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Ends an election whose time has come.
fn settle(s: &mut State, now: Duration) {
    if let Some(e) = s.election {
        if now >= e.elected_at {
            s.leader = e.next;
            s.election = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ET: Duration = Duration::from_millis(250);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_isolated_member_refuses_require_leader_only_once_it_knows() {
        let m = Members::new(3, ET, EtcdVersion::V3_4);
        m.isolate(1, ms(1000));
        assert!(matches!(
            m.verdict(1, ms(1100), ms(1100), Call::Write, true),
            Verdict::FailAt(_, _)
        ));
        assert!(matches!(
            m.verdict(1, ms(1300), ms(1300), Call::Write, true),
            Verdict::Refuse(_)
        ));
        assert_eq!(
            m.verdict(1, ms(1300), ms(1300), Call::Write, false),
            Verdict::FailAt(ms(1300) + m.request_timeout(), Refusal::DeadlineExceeded)
        );
        assert_eq!(
            m.verdict(0, ms(1300), ms(1300), Call::Write, true),
            Verdict::Go
        );
        assert_eq!(m.stream_end(1), Some(ms(2000)));
        assert_eq!(m.leader(ms(1300)), Some(0));
    }

    #[test]
    fn a_killed_leader_loses_forwarded_writes_and_fails_reads_at_the_election() {
        let m = Members::new(3, ET, EtcdVersion::V3_4);
        assert_eq!(m.kill(0, ms(1000)), Some(ms(1500)));
        assert_eq!(m.leader(ms(1200)), None);
        assert_eq!(
            m.verdict(1, ms(1000), ms(1000), Call::Write, true),
            Verdict::FailAt(
                ms(1000) + m.request_timeout(),
                Refusal::TimedOutLeaderFailed
            )
        );
        assert_eq!(
            m.verdict(1, ms(1000), ms(1000), Call::Read, true),
            Verdict::FailAt(ms(1500), Refusal::LeaderChanged)
        );
        assert!(matches!(
            m.verdict(1, ms(1300), ms(1300), Call::Read, true),
            Verdict::Refuse(_)
        ));
        assert_eq!(
            m.verdict(1, ms(1500), ms(1000), Call::Renew, true),
            Verdict::Go
        );
        assert_eq!(m.leader(ms(1500)), Some(1));
    }

    #[test]
    fn a_rejoin_on_3_5_keeps_the_leader() {
        let m = Members::new(3, ET, EtcdVersion::V3_5);
        m.isolate(2, ms(0));
        assert_eq!(m.rejoin(ms(5000)), None);
        assert_eq!(m.leader(ms(5000)), Some(0));
        assert_eq!(
            m.verdict(0, ms(5100), ms(5100), Call::Write, true),
            Verdict::Go
        );
    }

    #[test]
    fn a_stalled_leader_is_replaced_and_a_stalled_member_is_never_elected() {
        let m = Members::new(3, ET, EtcdVersion::V3_4);
        // Member 1 stalls; then the leader does: the others elect member 2, skipping 1.
        assert_eq!(m.stall(1, ms(0)), None);
        assert!(m.is_stalled(1) && m.is_cut_off(1));
        assert_eq!(m.stall(0, ms(1000)), Some(ms(1500)));
        assert_eq!(m.leader(ms(1500)), Some(2));
        assert!(
            !m.transfer(0, ms(2000)),
            "no transfer while a member is stalled"
        );
        // On 3.4 the replaced leader revokes what it saw overdue (etcd#15247), from when its
        // successor led; a follower revokes nothing.
        assert_eq!(m.thaw(0), Some(ms(1500)));
        assert_eq!(m.thaw(1), None);
        assert!(!m.is_cut_off(0) && !m.is_cut_off(1));
        assert_eq!(m.leader(ms(2000)), Some(2), "a thawed leader follows");
    }

    #[test]
    fn only_a_3_4_leader_replaced_while_stalled_revokes_on_resume() {
        for (version, revokes) in [(EtcdVersion::V3_4, true), (EtcdVersion::V3_5, false)] {
            let m = Members::new(3, ET, version);
            assert_eq!(m.stall(0, ms(0)), Some(ms(500)));
            assert_eq!(m.thaw(0), revokes.then_some(ms(500)), "{version:?}");
            assert_eq!(m.thaw(0), None, "{version:?}: once");
        }
    }

    #[test]
    fn a_rejoin_elects_again_and_a_transfer_moves_the_leader() {
        let m = Members::new(3, ET, EtcdVersion::V3_4);
        m.isolate(2, ms(0));
        assert_eq!(m.rejoin(ms(5000)), Some(ms(5250)));
        assert!(matches!(
            m.verdict(0, ms(5100), ms(5100), Call::Write, true),
            Verdict::Refuse(_)
        ));
        assert_eq!(
            m.verdict(0, ms(5100), ms(5100), Call::Write, false),
            Verdict::WaitUntil(ms(5250))
        );
        assert!(m.transfer(2, ms(6000)));
        assert_eq!(m.leader(ms(6000)), Some(2));
        let (_, t1) = m.status(0, ms(6000));
        assert!(t1 > 2);
    }
}

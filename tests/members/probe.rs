//! What a client sees of etcd's members when one fails: one probe, run on a real three-member
//! cluster (`members_etcd.rs`) and on the simulator's members under turmoil
//! (`members_sim.rs`), and one set of assertions both must meet. The figures print as the rows
//! of a table, real beside simulated.

use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions, WatchOptions};
use futures::StreamExt;
use tokio::time::Instant;

use super::cluster::Members;

/// How long the probe waits for any one answer.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// One request's fate: how long until it was answered, and with what.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) after: Duration,
    /// `ok`, the error's message, or `no answer` within [`PATIENCE`].
    pub(crate) answer: String,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.answer == "ok"
    }

    fn no_leader(&self) -> bool {
        self.answer.contains("no leader")
    }

    fn refused(&self) -> bool {
        // A refusal, not a connect timeout (which says "transport error" alone).
        let a = self.answer.to_lowercase();
        a.contains("connect error") || a.contains("refused")
    }

    fn row(&self) -> String {
        format!("{:>8.3}s {}", self.after.as_secs_f64(), self.answer)
    }
}

async fn timed<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Outcome {
    let start = Instant::now();
    let answer = match tokio::time::timeout(PATIENCE, f).await {
        Ok(Ok(_)) => "ok".to_owned(),
        Ok(Err(e)) => message(&e.to_string()),
        Err(_) => "no answer".to_owned(),
    };
    Outcome {
        after: start.elapsed(),
        answer,
    }
}

/// The server's message out of a client error's text (etcd-client prints the gRPC status
/// around it), with the status code when there is one.
fn message(error: &str) -> String {
    let code = error
        .split("code: '")
        .nth(1)
        .and_then(|s| s.split('\'').next());
    let text = error
        .split("message: \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or(error);
    match code {
        Some(code) => format!("{text} ({code})"),
        None => text.to_owned(),
    }
}

/// What the probe measured.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    /// The etcd version the members report.
    pub(crate) version: String,
    /// A new connection to a killed member.
    pub(crate) crashed_connect: Outcome,
    /// A restarted member, read right after it answers: whether it has the write made while
    /// it was down.
    pub(crate) restarted_read: Outcome,
    /// On a member just cut off from its peers: a write with require-leader, sent at the cut.
    pub(crate) isolated_write_at_cut: Outcome,
    /// The same, three election timeouts after the cut (it knows it has no leader).
    pub(crate) isolated_write_later: Outcome,
    /// A write without require-leader, three election timeouts after the cut.
    pub(crate) isolated_plain_write: Outcome,
    /// A linearizable read without require-leader, three election timeouts after the cut.
    pub(crate) isolated_plain_read: Outcome,
    /// A read-only transaction (a compare and a range) the same way: etcd serves it as a read.
    pub(crate) isolated_plain_txn_read: Outcome,
    /// A watch with require-leader opened before the cut: when it ends.
    pub(crate) isolated_watch_ends: Outcome,
    /// A progress request on a watch without require-leader opened before the cut, asked an
    /// election timeout after it: answered from the member's own state, at once.
    pub(crate) isolated_progress: Outcome,
    /// Whether the rejoined member's return moved the raft term on (an election: etcd 3.4
    /// runs without pre-vote, so the member's campaigns while cut off unseat the leader).
    pub(crate) rejoin_moved_term: bool,
    /// A write on a follower sent right after the raft leader is killed.
    pub(crate) leader_killed_write: Outcome,
    /// A read on a follower sent right after the raft leader is killed.
    pub(crate) leader_killed_read: Outcome,
    /// A lease's remaining TTL, granted at 10 s, read after its leader was killed (2 s after
    /// the grant), as a fraction of the TTL plus the election timeout's extension.
    pub(crate) lease_after_leader_kill: i64,
    /// The same after a leader transfer (2 s after the grant).
    pub(crate) lease_after_transfer: i64,
    /// A status request to a stalled follower, on a connection opened before the stall,
    /// given [`STALL`]: no answer.
    pub(crate) stalled_status: Outcome,
    /// A write sent to a stalled follower right after the stall, which lasts [`STALL`]: when
    /// it is answered, from its send.
    pub(crate) stalled_write: Outcome,
    /// A write sent to a stalled follower and given up by its client half a second on (the
    /// request cancelled, its connection kept): whether it was applied after the thaw.
    pub(crate) stalled_write_cancelled: bool,
    /// The same, with the client's connection closed too before the thaw.
    pub(crate) stalled_write_closed: bool,
    /// With the raft leader stalled, a write on a follower sent four election timeouts later
    /// (a new leader elected meanwhile).
    pub(crate) stalled_leader_write_elsewhere: Outcome,
}

/// How long the probe stalls a member.
pub(crate) const STALL: Duration = Duration::from_secs(2);

impl Figures {
    /// The table's rows, one per behaviour.
    pub(crate) fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("etcd version", self.version.clone()),
            ("connect to a killed member", self.crashed_connect.row()),
            (
                "read on a restarted member (has the write made while down)",
                self.restarted_read.row(),
            ),
            (
                "isolated member: write, require-leader, at the cut",
                self.isolated_write_at_cut.row(),
            ),
            (
                "isolated member: write, require-leader, 3 election timeouts on",
                self.isolated_write_later.row(),
            ),
            (
                "isolated member: write, no require-leader",
                self.isolated_plain_write.row(),
            ),
            (
                "isolated member: linearizable read, no require-leader",
                self.isolated_plain_read.row(),
            ),
            (
                "isolated member: read-only txn, no require-leader",
                self.isolated_plain_txn_read.row(),
            ),
            (
                "isolated member: require-leader watch opened before the cut ends",
                self.isolated_watch_ends.row(),
            ),
            (
                "isolated member: progress request on a watch opened before the cut",
                self.isolated_progress.row(),
            ),
            (
                "isolated member rejoins: the raft term moves on (3.4 only)",
                format!("{}", self.rejoin_moved_term),
            ),
            (
                "leader killed: write on a follower",
                self.leader_killed_write.row(),
            ),
            (
                "leader killed: read on a follower",
                self.leader_killed_read.row(),
            ),
            (
                "leader killed: 10 s lease granted 2 s before, TTL left",
                format!("{} s", self.lease_after_leader_kill),
            ),
            (
                "leader transferred: 10 s lease granted 2 s before, TTL left",
                format!("{} s", self.lease_after_transfer),
            ),
            (
                "stalled follower: status, given the 2 s stall",
                self.stalled_status.row(),
            ),
            (
                "stalled follower: write sent at the stall (thawed 2 s on)",
                self.stalled_write.row(),
            ),
            (
                "stalled follower: write given up (cancelled) before the thaw, applied after it",
                format!("{}", self.stalled_write_cancelled),
            ),
            (
                "stalled follower: write given up and its connection closed before the thaw, applied after it",
                format!("{}", self.stalled_write_closed),
            ),
            (
                "stalled leader: write on a follower, 4 election timeouts on",
                self.stalled_leader_write_elsewhere.row(),
            ),
        ]
    }

    /// What etcd does, as the simulator must too (measured on etcd 3.4.23 and 3.5.1, which
    /// differ in one row; the bounds' slack is stated with each).
    pub(crate) fn assert_like_etcd(&self, request_timeout: Duration, election_timeout: Duration) {
        let et = election_timeout;
        let c = &self.crashed_connect;
        assert!(
            !c.ok() && c.refused() && c.after < Duration::from_secs(1),
            "a killed member must refuse connections at once: {c:?}"
        );
        let r = &self.restarted_read;
        assert!(
            r.ok(),
            "a restarted member must serve the writes it missed: {r:?}"
        );
        // A write at the cut: the member still believes in its leader, its proposal is lost
        // on the cut link, and it is answered only by etcd's own request timeout (5 s plus
        // two election timeouts), never with success.
        let w = &self.isolated_write_at_cut;
        assert!(
            !w.ok() && w.after >= request_timeout,
            "a write on a member cut off at the time must be held, not answered: {w:?}"
        );
        let w = &self.isolated_write_later;
        assert!(
            w.no_leader() && w.after < Duration::from_millis(500),
            "a member that knows it has no leader must refuse require-leader requests at once: {w:?}"
        );
        // Held until etcd's request timeout: a proposal waits for a leader (raft takes none
        // without one) and is answered `context deadline exceeded`; a read (a read-only txn
        // too) waits for a read index that never comes and is answered `request timed out`
        // when its round of the read loop times out (a read that joined a round late waits
        // for the next one, past the probe's patience: measured both ways).
        let w = &self.isolated_plain_write;
        assert!(
            w.answer.contains("context deadline exceeded") && w.after >= request_timeout,
            "an isolated member must hold a write without require-leader, then answer `context deadline exceeded`: {w:?}"
        );
        for (what, o) in [
            ("read", &self.isolated_plain_read),
            ("read-only txn", &self.isolated_plain_txn_read),
        ] {
            assert!(
                (o.answer.contains("request timed out") || o.answer == "no answer")
                    && o.after >= request_timeout,
                "an isolated member must hold a {what} without require-leader, then answer `request timed out`: {o:?}"
            );
        }
        let w = &self.isolated_watch_ends;
        assert!(
            w.no_leader() && w.after >= et && w.after <= et * 8 + Duration::from_secs(1),
            "a require-leader watch on an isolated member must end with `no leader` a few election timeouts after the cut: {w:?}"
        );
        // Its watches hear nothing the others commit, yet the stream looks alive: a client
        // cannot tell a cut-off member by its progress answers.
        let p = &self.isolated_progress;
        assert!(
            p.ok() && p.after < Duration::from_secs(1),
            "an isolated member must answer a progress request from its own state, at once: {p:?}"
        );
        let w = &self.leader_killed_write;
        assert!(
            !w.ok() && w.after >= request_timeout,
            "a write forwarded to a killed leader must be held: {w:?}"
        );
        // The read waits on the dead leader's read index; the election ends the wait.
        let r = &self.leader_killed_read;
        assert!(
            (r.ok() || r.answer.contains("leader changed"))
                && r.after < et * 8 + Duration::from_secs(1),
            "a read on a follower must be answered once a new leader is elected: {r:?}"
        );
        // etcd 3.4 runs without pre-vote: the member's lone campaigns raised its term, and its
        // return unseats the leader. 3.5 runs pre-vote: its term stayed, the leader stays.
        let pre_vote = !self.version.starts_with("3.4");
        assert_eq!(
            self.rejoin_moved_term, !pre_vote,
            "an isolated member's return must move the raft term on in etcd 3.4, and not in 3.5 ({})",
            self.version
        );
        let s = &self.stalled_status;
        assert!(
            s.answer == "no answer",
            "a stalled member must answer nothing, not even its status: {s:?}"
        );
        // Kept by its kernel, read and answered once it thaws; the stall is timed on the
        // probe's side, so allow 1 s either way on a loaded machine.
        let w = &self.stalled_write;
        assert!(
            w.ok()
                && w.after + Duration::from_secs(1) >= STALL
                && w.after <= STALL + Duration::from_secs(1),
            "a write sent to a stalled member must be applied and answered when it thaws: {w:?}"
        );
        let w = &self.stalled_leader_write_elsewhere;
        assert!(
            w.ok() && w.after < Duration::from_secs(1),
            "the others must elect a leader without a stalled one and serve writes: {w:?}"
        );
        for (what, ttl) in [
            ("leader killed", self.lease_after_leader_kill),
            ("leader transferred", self.lease_after_transfer),
        ] {
            // Refreshed to its TTL (plus the extension) by the new leader: at least 9 of its
            // 10 s left, where 8 would be left without the refresh.
            assert!(
                ttl >= 9,
                "{what}: a lease must be refreshed by the new leader, {ttl} s left"
            );
        }
    }
}

async fn put(c: &mut Client, key: &str) -> Result<(), etcd_client::Error> {
    c.put(key, "v", None::<PutOptions>).await.map(|_| ())
}

async fn get(c: &mut Client, key: &str) -> Result<(), etcd_client::Error> {
    c.get(key, None::<GetOptions>).await.map(|_| ())
}

async fn read_only_txn(c: &mut Client, key: &str) -> Result<(), etcd_client::Error> {
    let txn = etcd_client::Txn::new()
        .when([etcd_client::Compare::version(
            key,
            etcd_client::CompareOp::Greater,
            0,
        )])
        .and_then([etcd_client::TxnOp::get(key, None)]);
    c.txn(txn).await.map(|_| ())
}

/// A client of `i`, or a panic that says which.
async fn connected(m: &dyn Members, i: usize, require_leader: bool) -> Client {
    m.client(i, require_leader)
        .await
        .unwrap_or_else(|e| panic!("member {i}: {e}"))
}

/// Runs the probe on a healthy three-member cluster. Each step heals what it did and waits
/// for a leader before the next.
pub(crate) async fn probe(m: &dyn Members) -> Figures {
    let et = m.election_timeout();
    let settle = || tokio::time::sleep(et * 4);

    let version = {
        let mut c = connected(m, m.leader().await, true).await;
        let status = c.status().await.expect("a member's status");
        status.version().to_owned()
    };

    // A killed follower: connections refused; a write made meanwhile is there on restart.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let g = (leader + 2) % 3;
    m.kill(f).await;
    let crashed_connect = timed(async {
        let mut c = m.client(f, false).await?;
        c.status().await.map(|_| ()).map_err(|e| e.to_string())
    })
    .await;
    put(&mut connected(m, g, true).await, "probe/missed")
        .await
        .expect("a write on the majority");
    m.restart(f).await;
    let mut back = connected(m, f, true).await;
    let restarted_read = timed(async {
        let r = back
            .get("probe/missed", None)
            .await
            .map_err(|e| e.to_string())?;
        if r.kvs().is_empty() {
            return Err("the write made while down is missing".to_owned());
        }
        Ok::<_, String>(())
    })
    .await;
    settle().await;

    // An isolated follower.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let mut rl = connected(m, f, true).await;
    let mut plain = connected(m, f, false).await;
    let mut watching = connected(m, f, true).await;
    let mut events = watching
        .watch("probe/watched", None::<WatchOptions>)
        .await
        .expect("a watch");
    // A watch without require-leader (etcd never ends it), confirmed before the cut.
    let mut progress = plain
        .clone()
        .watch("probe/progress", None::<WatchOptions>)
        .await
        .expect("a watch");
    progress
        .message()
        .await
        .expect("the watch confirmed")
        .expect("the watch confirmed");
    m.isolate(f).await;
    let cut = Instant::now();
    // Asked an election timeout after the cut; nothing is written under the key, so the
    // first message after the request is its answer.
    let progress_answered = tokio::spawn(async move {
        tokio::time::sleep(et).await;
        let (mut sender, mut stream) = progress.split();
        timed(async move {
            sender.request_progress().await?;
            match stream.message().await? {
                Some(_) => Ok(()),
                None => Err(etcd_client::Error::WatchError("the watch ended".into())),
            }
        })
        .await
    });
    let watch_ends = tokio::spawn(async move {
        let end = tokio::time::timeout(PATIENCE, async {
            loop {
                match events.next().await {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => break message(&e.to_string()),
                    None => break "ended".to_owned(),
                }
            }
        })
        .await
        .unwrap_or_else(|_| "no answer".to_owned());
        Outcome {
            after: cut.elapsed(),
            answer: end,
        }
    });
    let mut rl_at_cut = rl.clone();
    let at_cut = tokio::spawn(async move { timed(put(&mut rl_at_cut, "probe/at-cut")).await });
    tokio::time::sleep(et * 3).await;
    let isolated_write_later = timed(put(&mut rl, "probe/later")).await;
    let (mut plain_read, mut plain_txn) = (plain.clone(), plain.clone());
    let (isolated_plain_write, isolated_plain_read, isolated_plain_txn_read) = tokio::join!(
        timed(put(&mut plain, "probe/plain")),
        timed(get(&mut plain_read, "probe/plain")),
        timed(read_only_txn(&mut plain_txn, "probe/plain")),
    );
    let isolated_write_at_cut = at_cut.await.expect("the probe's task");
    let isolated_watch_ends = watch_ends.await.expect("the probe's task");
    let isolated_progress = progress_answered.await.expect("the probe's task");
    let before = term(&mut connected(m, leader, true).await).await;
    m.rejoin().await;
    settle().await;
    let rejoin_moved_term = term(&mut connected(m, f, true).await).await > before;

    // The raft leader killed, a follower asked at once; a lease refreshed by the next leader.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let mut on_f = connected(m, f, true).await;
    let lease = on_f.lease_grant(10, None).await.expect("a lease").id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    m.kill(leader).await;
    let mut read_f = on_f.clone();
    let (leader_killed_write, (leader_killed_read, lease_after_leader_kill)) =
        tokio::join!(timed(put(&mut on_f, "probe/forwarded")), async {
            let read = timed(get(&mut read_f, "probe/forwarded")).await;
            settle().await;
            (read, remaining(&mut read_f, lease).await)
        },);
    m.restart(leader).await;
    settle().await;

    // A leader transfer.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let mut on_f = connected(m, f, true).await;
    let lease = on_f.lease_grant(10, None).await.expect("a lease").id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    m.move_leader(f).await;
    settle().await;
    let lease_after_transfer = remaining(&mut on_f, lease).await;

    // A stalled follower: its status unanswered, a write sent to it answered on thawing.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let mut on_f = connected(m, f, true).await;
    get(&mut on_f, "probe/warm")
        .await
        .expect("a read before the stall");
    let (mut cancelling, mut closing) = (connected(m, f, true).await, connected(m, f, true).await);
    for c in [&mut cancelling, &mut closing] {
        get(c, "probe/warm").await.expect("a read before the stall");
    }
    m.stall(f).await;
    let stalled = Instant::now();
    let (mut asked, mut written) = (on_f.clone(), on_f.clone());
    let status = tokio::spawn(async move {
        let start = Instant::now();
        let answer = match tokio::time::timeout(STALL, asked.status()).await {
            Ok(Ok(_)) => "ok".to_owned(),
            Ok(Err(e)) => message(&e.to_string()),
            Err(_) => "no answer".to_owned(),
        };
        Outcome {
            after: start.elapsed(),
            answer,
        }
    });
    let write = tokio::spawn(async move { timed(put(&mut written, "probe/stalled")).await });
    // Two writes given up by their clients half a second in, while the member is stalled:
    // one on a connection that stays, one whose connection closes too.
    let given_up = |mut c: Client, key: &'static str| async move {
        let _ = tokio::time::timeout(Duration::from_millis(500), put(&mut c, key)).await;
        c
    };
    let (cancelled, closed) = tokio::join!(
        given_up(cancelling, "probe/stalled-cancelled"),
        given_up(closing, "probe/stalled-closed"),
    );
    drop(closed);
    tokio::time::sleep(STALL.saturating_sub(stalled.elapsed())).await;
    m.thaw(f).await;
    let stalled_status = status.await.expect("the probe's task");
    let stalled_write = write.await.expect("the probe's task");
    settle().await;
    drop(cancelled);
    let reader = connected(m, m.leader().await, true).await;
    let applied = |key: &'static str| {
        let mut reader = reader.clone();
        async move {
            let r = reader.get(key, None).await.expect("a read on the leader");
            !r.kvs().is_empty()
        }
    };
    let stalled_write_cancelled = applied("probe/stalled-cancelled").await;
    let stalled_write_closed = applied("probe/stalled-closed").await;
    drop(reader);

    // The raft leader stalled: the others elect another and serve writes.
    let leader = m.leader().await;
    let f = (leader + 1) % 3;
    let mut on_f = connected(m, f, true).await;
    m.stall(leader).await;
    tokio::time::sleep(et * 4).await;
    let stalled_leader_write_elsewhere = timed(put(&mut on_f, "probe/elsewhere")).await;
    m.thaw(leader).await;
    settle().await;

    Figures {
        version,
        crashed_connect,
        restarted_read,
        isolated_write_at_cut,
        isolated_write_later,
        isolated_plain_write,
        isolated_plain_read,
        isolated_plain_txn_read,
        isolated_watch_ends,
        isolated_progress,
        rejoin_moved_term,
        leader_killed_write,
        leader_killed_read,
        lease_after_leader_kill,
        lease_after_transfer,
        stalled_status,
        stalled_write,
        stalled_write_cancelled,
        stalled_write_closed,
        stalled_leader_write_elsewhere,
    }
}

/// The raft term member `c` reports.
async fn term(c: &mut Client) -> u64 {
    c.status().await.expect("a member's status").raft_term()
}

/// A lease's remaining TTL, asked until a leader answers. Right after an election the new
/// leader can report a lease as never expiring (measured: `i64::MAX` nanoseconds, before it
/// promotes its leases), so such an answer is asked again.
async fn remaining(c: &mut Client, lease: i64) -> i64 {
    for _ in 0..100 {
        if let Ok(Ok(t)) =
            tokio::time::timeout(Duration::from_secs(1), c.lease_time_to_live(lease, None)).await
        {
            if t.ttl() < 3600 {
                return t.ttl();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no member answered a lease's time to live");
}

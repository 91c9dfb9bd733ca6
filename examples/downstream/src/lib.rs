//! A ticker: every node runs a candidate for `ticker`; in each term it wins, the work appends
//! tick `n` to `ticks/` (one key per tick, valued `<token>:<n>`), each only if it is not there
//! yet, through the term's fence. Built on coord's published API only: one `HostSession` per
//! node (its registration and its candidate share the lease), a `Candidate` for the loop.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    Candidate, CandidateConfig, ElectionPool, HostRegistration, HostSession, RegistrationConfig,
    SessionConfig, Term,
};
use coord_api::{
    Compare, CompareOp, DynKvLeaseStore, Error, GetRequest, KvLeaseStore, PutRequest, TxnRequest,
};

/// The election the ticker's nodes campaign in.
pub const ELECTION: &str = "ticker";
/// Where ticks go.
pub const TICKS: &str = "ticks/";
/// Where nodes register.
pub const HOSTS: &str = "hosts/";

/// The key of tick `n`.
pub fn tick_key(n: u64) -> String {
    format!("{TICKS}{n:08}")
}

/// The tick number and the token in a tick's value.
pub fn parse_tick(value: &[u8]) -> Option<(i64, u64)> {
    let (token, n) = std::str::from_utf8(value).ok()?.split_once(':')?;
    Some((token.parse().ok()?, n.parse().ok()?))
}

/// What one node needs to tick.
#[derive(Clone)]
pub struct Ticker {
    /// The store.
    pub store: Arc<DynKvLeaseStore>,
    /// Write through the fence (false: the bug the chaos test catches).
    pub fenced: bool,
    /// How often the leader ticks.
    pub every: Duration,
}

/// A running ticker node: its registration and its candidate, on one lease.
pub struct TickerNode {
    host: HostSession,
    registration: HostRegistration,
    candidate: Candidate,
}

impl Ticker {
    /// Starts a node named `who`: registers it under `hosts/` and runs a candidate whose work
    /// is [`term`](Self::term), both on one lease of `ttl`. Returns at once; both come up
    /// whenever the store answers. `work` wraps each term's work (to observe it).
    pub fn start<W, F>(&self, who: &str, ttl: Duration, work: W) -> TickerNode
    where
        W: FnMut(Ticker, Term) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let host = HostSession::new(self.store.clone(), SessionConfig::default().with_ttl(ttl));
        let registration = HostRegistration::spawn_on(
            &host,
            RegistrationConfig::new(format!("{HOSTS}{who}"), who.to_owned()),
        )
        .expect("a valid key");
        let pool = ElectionPool::on(&host);
        let ticker = self.clone();
        let mut work = work;
        let candidate = Candidate::spawn(
            &pool,
            CandidateConfig::new(ELECTION, who.to_owned()),
            move |term| work(ticker.clone(), term),
        );
        TickerNode {
            host,
            registration,
            candidate,
        }
    }

    /// The work of one term: ticks until the term is over.
    pub async fn term(&self, term: &Term) {
        tokio::select! {
            _ = term.over() => {}
            _ = self.ticks(term) => {}
        }
    }

    async fn ticks(&self, term: &Term) {
        let Ok(done) = self.store.get(GetRequest::prefix(TICKS)).await else {
            return;
        };
        let mut next = done.count;
        loop {
            tokio::time::sleep(self.every).await;
            let key = tick_key(next);
            let txn = TxnRequest::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([PutRequest::new(key, format!("{}:{next}", term.token()))]);
            let written = if self.fenced {
                term.txn(txn).await
            } else {
                self.store.txn(txn).await
            };
            match written {
                Ok(_) => next += 1,
                Err(Error::FencedOut { .. }) => return,
                Err(_) => {}
            }
        }
    }
}

impl TickerNode {
    /// Stops ticking (the term's work ends, the leadership is handed over), removes the
    /// registration, and revokes the node's lease.
    ///
    /// # Errors
    /// The first clean-up that failed; every step is tried.
    pub async fn stop(self) -> Result<(), Error> {
        let candidate = self.candidate.stop().await;
        let registration = self.registration.stop().await;
        let host = self.host.stop().await;
        candidate.and(registration).and(host)
    }
}

//! A ticker: every node campaigns for `ticker`; the leader appends tick `n` to `ticks/` (one
//! key per tick, valued `<token>:<n>`), each only if it is not there yet, through its
//! leadership's fence. Built on coord's published API only.

use std::time::Duration;

use coord_api::recipes::{Election, Leadership, Session, SessionConfig};
use coord_api::{
    Compare, CompareOp, DynKvLeaseStore, Error, GetRequest, KvLeaseStore, PutRequest, TxnRequest,
};

/// The election the ticker's nodes campaign in.
pub const ELECTION: &str = "ticker";
/// Where ticks go.
pub const TICKS: &str = "ticks/";

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
pub struct Ticker<'a> {
    /// The store.
    pub store: &'a std::sync::Arc<DynKvLeaseStore>,
    /// Write through the fence (false: the bug the chaos test catches).
    pub fenced: bool,
    /// How often the leader ticks.
    pub every: Duration,
}

impl Ticker<'_> {
    /// Campaigns with `session` and ticks while leading; returns the leadership's token once
    /// it is lost (or `Err` if it could not lead).
    pub async fn lead_once(&self, session: &Session, who: &str) -> Result<Leadership, Error> {
        Election::new(session, ELECTION)
            .campaign(who.to_owned())
            .await
    }

    /// Ticks while `lead` leads; returns when it is lost.
    pub async fn tick(&self, lead: &Leadership) {
        tokio::select! {
            _ = lead.lost() => {}
            _ = self.ticks(lead) => {}
        }
    }

    async fn ticks(&self, lead: &Leadership) {
        let Ok(done) = self.store.get(GetRequest::prefix(TICKS)).await else {
            return;
        };
        let mut next = done.count;
        loop {
            tokio::time::sleep(self.every).await;
            let key = tick_key(next);
            let txn = TxnRequest::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([PutRequest::new(key, format!("{}:{next}", lead.token()))]);
            let written = if self.fenced {
                lead.txn(txn).await
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

/// A session for a ticker node.
pub async fn session(
    store: &std::sync::Arc<DynKvLeaseStore>,
    ttl: Duration,
) -> Result<Session, Error> {
    Session::new(store.clone(), SessionConfig::default().with_ttl(ttl)).await
}

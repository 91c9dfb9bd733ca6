//! The keep-alive channel on etcd's bidirectional LeaseKeepAlive stream.

use std::sync::Arc;

use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use coord_api::{Error, KeepAlive, LeaseId, Result};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio_util::sync::CancellationToken;

use crate::error::with_lease;
use crate::error::{from_member, map, Kind};
use crate::pool::Pool;

/// One lease's keep-alive stream, opened on the first renewal and re-opened (on the current
/// endpoint) on the renewal after it broke.
pub(crate) struct EtcdKeepAlive {
    pool: Arc<Pool>,
    lease: LeaseId,
    stream: Option<Open>,
}

/// The stream, on the connection of endpoint `endpoint`, which `replaced` says was replaced.
struct Open {
    endpoint: usize,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    replaced: CancellationToken,
}

impl std::fmt::Debug for EtcdKeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKeepAlive")
            .field("lease", &self.lease)
            .field("open", &self.stream.is_some())
            .finish()
    }
}

impl EtcdKeepAlive {
    pub(crate) fn new(pool: Arc<Pool>, lease: LeaseId) -> Self {
        EtcdKeepAlive {
            pool,
            lease,
            stream: None,
        }
    }

    fn closed(&mut self, source: impl Into<coord_api::BoxError>) -> Error {
        let source = source.into();
        if let Some(open) = self.stream.take() {
            self.pool.fail_over_after(open.endpoint, source.as_ref());
        }
        Error::StreamClosed {
            stream: "keep-alive",
            source: Some(source),
        }
    }

    /// Opens the stream. etcd-client sends one renewal to do so and reads its answer (a
    /// lease gone is [`Error::LeaseNotFound`]); the caller does not count it, since its TTL is
    /// not handed back.
    pub(crate) async fn open(&mut self) -> Result<()> {
        let endpoint = self.pool.current();
        let (mut client, replaced) = match self.pool.connection_at(endpoint).await {
            Ok(c) => c,
            Err(e) => {
                self.pool.fail_over(endpoint);
                return Err(Error::StreamClosed {
                    stream: "keep-alive",
                    source: Some(Box::new(e)),
                });
            }
        };
        let in_flight = InFlight::sent(&self.pool, endpoint);
        let opened = tokio::select! {
            biased;
            r = client.lease_keep_alive(self.lease.0) => r,
            _ = replaced.cancelled() => {
                in_flight.finish();
                return Err(replaced_under_it());
            }
        };
        let sent = in_flight.finish();
        if opened.as_ref().is_err_and(from_member) {
            self.pool.answered(endpoint, sent);
        }
        match opened {
            Ok((keeper, stream)) => {
                self.pool.answered(endpoint, sent);
                self.stream = Some(Open {
                    endpoint,
                    keeper,
                    stream,
                    replaced,
                });
                Ok(())
            }
            // etcd-client's word for a first answer of TTL 0: the lease is gone.
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("lease not found") => {
                self.pool.answered(endpoint, sent);
                Err(Error::LeaseNotFound { lease: self.lease })
            }
            Err(e) => match map("keep-alive", Kind::Write, e) {
                e @ (Error::LeaseNotFound { .. } | Error::PermissionDenied { .. }) => {
                    Err(with_lease(e, Some(self.lease)))
                }
                other => {
                    self.pool.fail_over_after(endpoint, &other);
                    Err(Error::StreamClosed {
                        stream: "keep-alive",
                        source: Some(Box::new(other)),
                    })
                }
            },
        }
    }

    async fn renew_once(&mut self) -> Result<Duration> {
        if self.stream.is_none() {
            self.open().await?;
        }
        let open = self.stream.as_mut().expect("opened above");
        let endpoint = open.endpoint;
        let replaced = open.replaced.clone();
        // A renewal abandoned before its answer (the caller gave up waiting, as a session
        // does when the next renewal is due) may say the connection is dead without a reset:
        // replace it then, unless it answered anything meanwhile.
        let in_flight = InFlight::sent(&self.pool, endpoint);
        let exchange = async {
            open.keeper.keep_alive().await?;
            open.stream.message().await
        };
        let answer = tokio::select! {
            biased;
            r = exchange => r,
            // Found dead by another request: the session renews again after its backoff,
            // on a fresh connection, rather than wait out its deadline on this one.
            _ = replaced.cancelled() => {
                in_flight.finish();
                self.stream = None;
                return Err(replaced_under_it());
            }
        };
        let sent = in_flight.finish();
        if matches!(answer, Ok(Some(_))) || answer.as_ref().is_err_and(from_member) {
            self.pool.answered(endpoint, sent);
        }
        match answer {
            // A revoked or expired lease is answered with TTL 0 on a stream that stays open.
            Ok(Some(resp)) if resp.ttl() <= 0 => Err(Error::LeaseNotFound { lease: self.lease }),
            Ok(Some(resp)) => Ok(Duration::from_secs(resp.ttl() as u64)),
            Ok(None) => Err(self.closed("the server ended the stream")),
            Err(e) => Err(self.closed(e)),
        }
    }
}

#[async_trait]
impl KeepAlive for EtcdKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        let timeout = self.pool.request_timeout();
        match tokio::time::timeout(timeout, self.renew_once()).await {
            Ok(r) => r,
            Err(_) => {
                // Moved on before the connection goes (see `Pool::abandon_if_silent_since`).
                let endpoint = self.stream.as_ref().map(|open| open.endpoint);
                let closed = self.closed(format!("no answer within {timeout:?}"));
                if let Some(endpoint) = endpoint {
                    self.pool.reconnect(endpoint);
                }
                Err(closed)
            }
        }
    }
}

/// The error of a renewal whose connection was replaced while it waited: nothing to fail
/// over from (the pool moved on when it replaced it), and the renewal may go again at once.
fn replaced_under_it() -> Error {
    Error::StreamClosed {
        stream: "keep-alive",
        source: Some("its connection was found dead and replaced".into()),
    }
}

/// Leaves the member of a renewal dropped before its answer came: requests move to the next
/// member, so the renewal that goes instead goes elsewhere, and the connection is replaced if
/// it answered nothing since (see [`Pool::unanswered`]). A
/// stalled member (a paused process whose kernel still accepts connections) answers a fresh
/// connection no better: a renewal re-sent to it was abandoned again a renewal period later,
/// and a 3 s session expired 2-2.3 s after its member stopped, two healthy members beside it.
struct InFlight<'a> {
    pool: &'a Pool,
    endpoint: usize,
    sent: Instant,
    done: bool,
}

impl<'a> InFlight<'a> {
    /// A renewal sent on `endpoint`'s connection just now.
    fn sent(pool: &'a Pool, endpoint: usize) -> Self {
        let sent = Instant::now();
        pool.asked(endpoint, sent);
        InFlight {
            pool,
            endpoint,
            sent,
            done: false,
        }
    }

    /// The renewal was answered (or failed on its own): returns when it was sent.
    fn finish(mut self) -> Instant {
        self.done = true;
        self.sent
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            use coord_api::hooks::planted::{enabled, Bug};
            // The connection goes if it answered nothing since (dead, or the member stalled);
            // the renewal goes elsewhere either way, and the member's streams with it
            // (`Pool::fail_over`): a member that answers other requests yet holds renewals
            // (cut off from its peers, its leader lost) is no use for them (turmoil seed
            // 50677: a member cut off while it still answered its status held the re-sent
            // renewal too, and the session expired), and its watches hear nothing the others
            // commit.
            if !enabled(Bug::AbandonedRenewalStaysOnMember) {
                self.pool.fail_over(self.endpoint);
            }
            self.pool.unanswered(self.endpoint, self.sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EtcdConfig;

    /// The request timeout of the pools below: far above any bound a test asserts.
    const TIMEOUT: Duration = Duration::from_secs(60);

    /// A pool of `members` members that accept connections and answer nothing, and a renewal
    /// of lease 1 on it, once on the wire (sent on member 0's connection).
    async fn renewal_on_a_silent_member(
        members: usize,
    ) -> (Arc<Pool>, tokio::task::JoinHandle<Result<Duration>>) {
        let (silent, channel) = Pool::silent_member();
        let pool = Pool::new(
            EtcdConfig::new(["unused:1"]).with_request_timeout(TIMEOUT),
            vec![channel; members],
        );
        let mut keep_alive = EtcdKeepAlive::new(pool.clone(), LeaseId(1));
        let renewal = tokio::spawn(async move {
            let _silent = silent;
            keep_alive.renew().await
        });
        coord_api::testkit::within(TIMEOUT / 6, "the renewal on the wire", async {
            while !pool.is_waited_on(0) {
                tokio::task::yield_now().await;
            }
        })
        .await;
        (pool, renewal)
    }

    /// A renewal abandoned unanswered (the session's next renewal fell due) on a member that
    /// accepted the connection and answers nothing moves requests to the next member: the
    /// renewal sent instead opens there, not on a fresh connection to the same stalled one.
    #[tokio::test]
    async fn an_abandoned_renewal_moves_to_the_next_member() {
        let (pool, renewal) = renewal_on_a_silent_member(2).await;
        assert_eq!(pool.current(), 0);
        // The session gives up waiting: it drops the renewal where it waits.
        renewal.abort();
        assert!(renewal.await.unwrap_err().is_cancelled());
        assert_eq!(
            pool.current(),
            1,
            "the next renewal goes to the next member"
        );
        assert!(!pool.is_waited_on(0), "the stalled connection was replaced");
    }

    /// The same when the member answered something else since the renewal was sent (a member
    /// cut off from its peers answers its status, yet holds renewals): the renewal still goes
    /// elsewhere (turmoil seed 50677), the connection, alive, is kept, and the streams on it
    /// end, to resume on the next member: they hear nothing the others commit (turmoil seed
    /// 80271).
    #[tokio::test]
    async fn a_renewal_abandoned_on_a_member_that_answers_else_moves_too() {
        let (pool, renewal) = renewal_on_a_silent_member(2).await;
        let streams = pool.connection_at(0).await.unwrap().1;
        pool.answered(0, Instant::now());
        renewal.abort();
        assert!(renewal.await.unwrap_err().is_cancelled());
        assert_eq!(pool.current(), 1, "the renewal goes to the next member");
        assert!(streams.is_cancelled(), "the member's streams ended");
        assert!(
            pool.open_at(0).is_some(),
            "a connection that answered is kept"
        );
        let fresh = pool.connection_at(0).await.unwrap().1;
        assert!(
            !fresh.is_cancelled(),
            "streams opened on it afterwards carry on"
        );
    }

    /// A keep-alive whose opening hangs on a member that accepted the connection and answers
    /// nothing ends as soon as another request finds the connection dead and replaces it,
    /// not at the request timeout: the session renews again at once, on a fresh connection.
    #[tokio::test]
    async fn a_renewal_whose_connection_is_replaced_ends_at_once() {
        let start = Instant::now();
        let (pool, renewal) = renewal_on_a_silent_member(1).await;
        // Once the renewal is on the wire, another request gives up on the connection.
        pool.reconnect(0);
        let result = renewal.await.unwrap();
        assert!(
            matches!(result, Err(Error::StreamClosed { .. })),
            "{result:?}"
        );
        // Far below the 60 s request timeout it would otherwise wait out, whatever the load.
        assert!(start.elapsed() < TIMEOUT / 6, "{:?}", start.elapsed());
        // The fresh connection is left be: the abandoned renewal counts against nothing.
        assert!(!pool.is_waited_on(0));
    }
}

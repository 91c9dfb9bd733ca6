//! [`PostgresStore`]: the contract over a connection pool, each request one transaction with
//! a deadline, and the two background tasks (lease sweep, watch wake-ups) a store runs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use coord_api::{
    elections, validate, Compare, DeleteRequest, DeleteResponse, DynKvLeaseStore, Error,
    GetRequest, GetResponse, KeepAlive, KeyValue, KvLeaseStore, LeaderKey, LeaderStream,
    LeaseGrant, LeaseId, LeaseTimeToLive, Limits, PutRequest, PutResponse, Result, Revision, TxnOp,
    TxnOpResponse, TxnRequest, TxnResponse, WatchRequest, WatchStream,
};
use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::conn::{self, failed_link, Checkout};
use crate::error::{from_pg, timed_out, Stage};
use crate::kv::{self, Writer};
use crate::tls::Connector;
use crate::{lease, schema, PostgresConfig, BACKEND};

/// A [`KvLeaseStore`] on PostgreSQL. Cheap to clone: clones share the pool and the background
/// tasks, which end when the last clone is dropped.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// Connections for lease renewals alone ([`RENEWAL_CONNECTIONS`]).
    renewals: Pool,
    config: PostgresConfig,
    known: watch::Receiver<i64>,
    _tasks: DropGuard,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool_size", &self.inner.config.pool_size)
            .finish_non_exhaustive()
    }
}

/// Connections kept for lease renewals, apart from the pool requests share: a renewal that
/// waited its turn behind a burst of requests came too late (200 writers at once on a pool of
/// 16, the machine busy: every session ended). Two, so that one frozen connection does not
/// hold every renewal until the request timeout.
const RENEWAL_CONNECTIONS: usize = 2;

/// The longest a client may leave its transaction idle, holding the writers' lock, before
/// the server ends its session (`idle_in_transaction_session_timeout`).
const LOCK_HELD_IDLE: Duration = Duration::from_secs(1);

/// A transaction's body: runs inside it, told whether its compares held, and returns its
/// answer (the caller commits).
type Body<T> =
    Box<dyn for<'a, 'b> FnOnce(&'b mut Writer<'a>, bool) -> BoxFuture<'b, Result<T>> + Send>;

impl PostgresStore {
    /// Connects, creates or migrates coord's tables, and starts the lease sweep and the watch
    /// listener.
    ///
    /// # Errors
    /// [`InvalidArgument`](Error::InvalidArgument) for a connection string that does not
    /// parse, or a schema written by a newer coord; [`Unavailable`](Error::Unavailable) when
    /// the server cannot be reached; [`PermissionDenied`](Error::PermissionDenied) for refused
    /// credentials.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        let mut pg: tokio_postgres::Config = config
            .connection
            .parse()
            .map_err(|e| Error::invalid(format!("PostgreSQL connection string: {e}")))?;
        // A client that stalls inside a transaction (a paused process, a cut link) holds the
        // writers' lock, and every writer of the store waits: the server ends such a session
        // after [`LOCK_HELD_IDLE`] (or the request timeout, when shorter), long before the
        // writers' own timeouts. A live client is never idle that long: it sends each
        // statement as soon as the one before is answered.
        let idle_ms = config
            .request_timeout
            .min(LOCK_HELD_IDLE)
            .as_millis()
            .max(1);
        let options = match pg.get_options() {
            Some(o) => format!("{o} -c idle_in_transaction_session_timeout={idle_ms}"),
            None => format!("-c idle_in_transaction_session_timeout={idle_ms}"),
        };
        pg.options(&options);
        let connector = Connector::new(config.tls.as_ref())?;
        let deadline = Instant::now() + config.request_timeout;
        let (mut client, mut messages) = timeout_at(deadline, connector.connect(&pg))
            .await
            .map_err(|_| timed_out("connect", Stage::Before))?
            .map_err(|e| from_pg("connect", Stage::Before, e))?;
        let driver = tokio::spawn(async move { while let Some(Ok(_)) = messages.next().await {} });
        let found = timeout_at(deadline, schema::migrate(&mut client))
            .await
            .map_err(|_| timed_out("migrate", Stage::Before))?
            .map_err(|e| from_pg("migrate", Stage::Before, e))?;
        if crate::kv::from_a_sequence() {
            // The planted bug's sequence, ahead of every revision written so far.
            client
                .batch_execute(
                    "CREATE SEQUENCE IF NOT EXISTS coord_planted_revision; \
                     SELECT setval('coord_planted_revision', \
                       greatest(revision, nextval('coord_planted_revision'))) \
                     FROM coord_meta WHERE id = 1",
                )
                .await
                .map_err(|e| from_pg("migrate", Stage::Before, e))?;
        }
        drop(client);
        let _ = driver.await;
        if found > schema::VERSION {
            return Err(Error::invalid(format!(
                "the database's coord schema is version {found}; this coord knows up to {}",
                schema::VERSION
            )));
        }
        let pool_of = |size: usize| {
            let manager = connector.manager(
                pg.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(config.request_timeout))
                .create_timeout(Some(config.request_timeout))
                .build()
                .map_err(|e| Error::invalid(format!("PostgreSQL pool: {e}")))
        };
        let pool = pool_of(config.pool_size)?;
        let renewals = pool_of(RENEWAL_CONNECTIONS)?;
        let stop = CancellationToken::new();
        let (known_tx, known) = watch::channel(0);
        tokio::spawn(crate::watch::listen(
            pg,
            connector,
            pool.clone(),
            known_tx,
            config.poll_interval,
            config.request_timeout,
            stop.clone(),
        ));
        tokio::spawn(sweep(pool.clone(), config.clone(), stop.clone()));
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                renewals,
                config,
                known,
                _tasks: stop.drop_guard(),
            }),
        })
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.request_timeout
    }

    /// Runs `body` in one transaction and commits it, all within the request timeout. A
    /// connection that failed or timed out is closed, never handed to the next request.
    async fn write<T: Send>(
        &self,
        operation: &'static str,
        compares: &[Compare],
        body: Body<T>,
    ) -> Result<T> {
        in_transaction(&self.inner.pool, self.deadline(), operation, compares, body).await
    }

    /// Runs one statement's worth of work (autocommit) within the request timeout (see
    /// [`conn::single`]).
    async fn single<T>(
        &self,
        operation: &'static str,
        stage: Stage,
        run: impl for<'a> FnOnce(&'a tokio_postgres::Client) -> BoxFuture<'a, Result<T>>,
    ) -> Result<T> {
        conn::single(&self.inner.pool, self.deadline(), operation, stage, run).await
    }

    pub(crate) async fn renew(&self, lease: LeaseId) -> Result<Duration> {
        // A renewal whose answer is lost is reported as not done: the caller keeps the
        // deadline of its last answered renewal, the safe side. On connections of its own:
        // never behind the requests (see `RENEWAL_CONNECTIONS`).
        conn::single(
            &self.inner.renewals,
            self.deadline(),
            "keep_alive",
            Stage::Before,
            move |c| Box::pin(async move { lease::renew(c, lease).await }),
        )
        .await
    }
}

/// See [`PostgresStore::write`]; the sweep uses it too.
async fn in_transaction<T: Send>(
    pool: &Pool,
    deadline: Instant,
    operation: &'static str,
    compares: &[Compare],
    body: Body<T>,
) -> Result<T> {
    let conn = Checkout::take(pool, operation, deadline).await?;
    let client: &tokio_postgres::Client = conn.client();
    let result = async {
        // Until COMMIT is sent nothing can apply: a failure or timeout before it rolls back.
        let (mut w, held) = timeout_at(deadline, Writer::begin(client, operation, compares))
            .await
            .map_err(|_| timed_out(operation, Stage::Before))??;
        // The body's last put may carry COMMIT with it (`put_last`): a timeout after that was
        // sent may have applied.
        let value = match timeout_at(deadline, body(&mut w, held)).await {
            Ok(value) => value?,
            Err(_) if w.commit_sent() => return Err(timed_out(operation, Stage::Commit)),
            Err(_) => return Err(timed_out(operation, Stage::Before)),
        };
        timeout_at(deadline, w.commit())
            .await
            .map_err(|_| timed_out(operation, Stage::Commit))??;
        Ok(value)
    }
    .await;
    let reusable = match &result {
        Ok(_) => true,
        // The connection's state is unknown: it is closed, never handed on.
        Err(e) if failed_link(e) => false,
        // An answer mid-transaction (a lease not found, a compacted read, a rejected
        // statement): roll back before the connection serves anyone else.
        Err(_) => matches!(
            timeout_at(deadline, client.batch_execute("ROLLBACK")).await,
            Ok(Ok(()))
        ),
    };
    if reusable {
        conn.give_back();
    }
    result
}

/// Expires leases past their deadline, every sweep interval, until `stop`.
async fn sweep(pool: Pool, config: PostgresConfig, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.sweep_interval) => {}
        }
        let deadline = Instant::now() + config.request_timeout;
        let due = conn::single(&pool, deadline, "expire", Stage::Before, |c| {
            Box::pin(async move { lease::expired(c, 64).await })
        })
        .await
        .unwrap_or_default();
        for id in due {
            let deadline = Instant::now() + config.request_timeout;
            let body: Body<bool> =
                Box::new(move |w, _| Box::pin(async move { lease::remove(w, id, true).await }));
            match in_transaction(&pool, deadline, "expire", &[], body).await {
                Ok(true) => tracing::debug!(lease = %id, "coord-postgres: lease expired"),
                Ok(false) => {}
                Err(e) => tracing::debug!(lease = %id, error = %e, "coord-postgres: sweep failed"),
            }
        }
    }
}

#[async_trait]
impl KvLeaseStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn limits(&self) -> Limits {
        self.inner.config.limits.clone()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        self.single("get", Stage::Before, move |c| {
            Box::pin(async move { kv::get(c, &req).await })
        })
        .await
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        validate::put(&req, &self.inner.config.limits)?;
        self.write(
            "put",
            &[],
            Box::new(move |w, _| Box::pin(async move { w.put_last(&req).await })),
        )
        .await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        self.write(
            "delete",
            &[],
            Box::new(move |w, _| Box::pin(async move { w.delete(&req).await })),
        )
        .await
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        if !coord_api::hooks::planted::enabled(
            coord_api::hooks::planted::Bug::PostgresRetriesUnknownCommit,
        ) {
            return self.txn_once(req).await;
        }
        match self.txn_once(req.clone()).await {
            Err(Error::Indeterminate { .. }) => self.txn_once(req).await,
            done => done,
        }
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        let limits = &self.inner.config.limits;
        validate::ttl(ttl, limits)?;
        let ttl = validate::granted_ttl(ttl, limits);
        self.single("grant", Stage::Commit, move |c| {
            Box::pin(async move { lease::grant(c, ttl).await })
        })
        .await
    }

    async fn revoke(&self, id: LeaseId) -> Result<Revision> {
        self.write(
            "revoke",
            &[],
            Box::new(move |w, _| {
                Box::pin(async move {
                    if !lease::remove(w, id, false).await? {
                        return Err(Error::LeaseNotFound { lease: id });
                    }
                    // The revision after: the revocation's own, if it deleted keys.
                    Ok(w.seen())
                })
            }),
        )
        .await
    }

    async fn time_to_live(&self, id: LeaseId) -> Result<LeaseTimeToLive> {
        self.single("time_to_live", Stage::Before, move |c| {
            Box::pin(async move { lease::time_to_live(c, id).await })
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        Ok(Box::new(lease::PgKeepAlive {
            store: self.clone(),
            lease,
        }))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        let source = crate::watch::Source {
            pool: self.inner.pool.clone(),
            known: self.inner.known.clone(),
            progress_interval: self.inner.config.limits.progress_notify_interval,
            timeout: self.inner.config.request_timeout,
        };
        timeout_at(self.deadline(), crate::watch::open(source, req))
            .await
            .map_err(|_| timed_out("watch", Stage::Before))?
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let retention = self.inner.config.history_retention;
        let purge = self
            .write(
                "compact",
                &[],
                Box::new(move |w, _| {
                    Box::pin(async move { crate::compact::compact(w, revision, retention).await })
                }),
            )
            .await?;
        if let Some(purge) = purge {
            let (pool, timeout) = (self.inner.pool.clone(), self.inner.config.request_timeout);
            tokio::spawn(crate::compact::purge(pool, purge, timeout));
        }
        Ok(())
    }

    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        elections::campaign(self, name, value, lease).await
    }

    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        elections::proclaim(self, leader, value).await
    }

    async fn leader(&self, name: &str) -> Result<KeyValue> {
        elections::leader(self, name).await
    }

    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        elections::observe(self.shared(), name)
    }

    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        elections::resign(self, leader).await
    }
}

impl PostgresStore {
    /// One transaction, sent once: an unknown outcome is the caller's to resolve.
    async fn txn_once(&self, mut req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, &self.inner.config.limits)?;
        let compares = std::mem::take(&mut req.compares);
        self.write(
            "txn",
            &compares,
            Box::new(move |w, succeeded| {
                Box::pin(async move {
                    let branch = if succeeded {
                        &req.success
                    } else {
                        &req.failure
                    };
                    // A read at a bad revision fails the whole transaction before anything
                    // is written, as in etcd.
                    for op in branch {
                        if let TxnOp::Get(get) = op {
                            if let Some(rev) = get.revision.filter(|r| *r > 0) {
                                w.meta().check_read(rev)?;
                            }
                        }
                    }
                    let mut responses = Vec::with_capacity(branch.len());
                    for (i, op) in branch.iter().enumerate() {
                        let last = i + 1 == branch.len();
                        responses.push(match op {
                            TxnOp::Get(get) => TxnOpResponse::Get(w.get(get).await?),
                            // The last write goes with the commit: one round trip fewer.
                            TxnOp::Put(put) if last => TxnOpResponse::Put(w.put_last(put).await?),
                            TxnOp::Put(put) => TxnOpResponse::Put(w.put(put).await?),
                            TxnOp::Delete(del) => TxnOpResponse::Delete(w.delete(del).await?),
                        });
                    }
                    Ok(TxnResponse::new(w.seen(), succeeded, responses))
                })
            }),
        )
        .await
    }
}

impl From<PostgresStore> for Arc<DynKvLeaseStore> {
    fn from(store: PostgresStore) -> Self {
        Arc::new(store)
    }
}

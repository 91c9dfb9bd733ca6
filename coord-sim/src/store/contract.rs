//! [`SimStore`] as a [`KvLeaseStore`]: each call checked, sent across the client's link,
//! applied to the state machine, and answered back across it.

use super::*;

#[async_trait]
impl KvLeaseStore for SimStore {
    fn backend(&self) -> &'static str {
        "sim"
    }

    fn limits(&self) -> Limits {
        self.limits_ref().clone()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        // The same client (same connection), as the trait asks.
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        self.call("get", Call::Read, move |c| {
            c.apply(|s, now| s.get(now, &req))
        })
        .await
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        validate::put(&req, self.limits_ref())?;
        self.call("put", Call::Write, move |c| {
            c.apply(|s, now| s.put(now, &req))
        })
        .await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        self.call("delete", Call::Write, move |c| {
            c.apply(|s, now| s.delete(now, &req))
        })
        .await
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, self.limits_ref())?;
        // A transaction that writes nothing is a read, as `EtcdStore` counts it.
        let kind = if req.writes() {
            Call::Write
        } else {
            Call::Read
        };
        self.call("txn", kind, move |c| c.apply(|s, now| s.txn(now, &req)))
            .await
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        validate::ttl(ttl, self.limits_ref())?;
        let ttl = validate::granted_ttl(ttl, self.limits_ref());
        self.call("grant", Call::Write, move |c| {
            let grant = c.apply(|s, now| s.grant(now, ttl));
            c.shared.deadlines_changed.notify_one();
            Ok(grant)
        })
        .await
    }

    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        self.call("revoke", Call::Write, move |c| {
            c.apply(|s, now| s.revoke(now, lease))
        })
        .await
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        self.call("time-to-live", Call::Read, move |c| {
            c.apply(|s, now| s.time_to_live(now, lease))
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        Ok(Box::new(SimKeepAlive::new(
            self.clone(),
            lease,
            self.shared.stream_epoch.load(Ordering::SeqCst),
            self.link.state().generation,
        )))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        // A confirmation that never comes back drops the stream, which cancels the watch.
        self.call("watch", Call::Read, move |c| {
            let generation = c.link.state().generation;
            let (tx, rx) = mailbox();
            let id = {
                let mut inner = c.shared.lock();
                let id = inner.state.watch(c.shared.now(), &req);
                let sink = Sink {
                    tx,
                    link: c.link.clone(),
                    latency: c.shared.config.latency,
                    last: None,
                };
                inner.sinks.insert(id, sink);
                c.shared.deliver(&mut inner);
                id
            };
            // It may need catching up: let the background task see it.
            c.shared.deadlines_changed.notify_one();
            let progress = req
                .progress_notify
                .then_some(c.limits_ref().progress_notify_interval);
            let link = StreamLink {
                link: c.link.clone(),
                generation,
                latency: c.shared.config.latency,
            };
            Ok(watch_stream(c.shared.clone(), id, rx, progress, link))
        })
        .await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.call("compact", Call::Write, move |c| {
            c.apply(|s, now| s.compact(now, revision))
        })
        .await
    }

    // No elections of its own: etcd's algorithm on the primitives above.
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

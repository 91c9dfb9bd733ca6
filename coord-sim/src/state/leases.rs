//! Leases: grants, renewals, revocations and expiry, each expiry in its own revision.

use super::*;

impl State {
    pub(super) fn next_lease_id(&mut self) -> LeaseId {
        loop {
            // splitmix64: ids look like etcd's (large, positive, unordered) yet follow from the seed.
            self.lease_rng = self.lease_rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.lease_rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let id = LeaseId((z >> 2) as i64);
            if !id.is_none() && !self.leases.contains_key(&id) {
                return id;
            }
        }
    }

    /// Grants a lease of `ttl` (already validated and rounded by the caller).
    pub fn grant(&mut self, now: Instant, ttl: Duration) -> LeaseGrant {
        self.expire(now);
        let ttl = ttl.max(self.min_ttl);
        let id = self.next_lease_id();
        let deadline = now + ttl;
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
        self.deadlines.set(deadline, id);
        let origin = self.origin;
        self.record(|| Entry::Grant {
            lease: id,
            ttl,
            origin,
        });
        LeaseGrant::new(id, ttl)
    }

    pub(super) fn remove_lease(&mut self, id: LeaseId) -> Option<Revision> {
        let lease = self.leases.remove(&id)?;
        self.deadlines.forget(id);
        let origin = self.origin;
        self.record(|| Entry::LeaseEnd { lease: id, origin });
        let mut p = self.begin();
        for key in &lease.keys {
            self.delete_key(&mut p, key);
        }
        self.commit(p);
        Some(self.revision)
    }

    /// Revokes a lease; returns the revision after its keys were deleted.
    pub fn revoke(&mut self, now: Instant, id: LeaseId) -> Result<Revision> {
        self.expire(now);
        self.remove_lease(id)
            .ok_or(Error::LeaseNotFound { lease: id })
    }

    /// Renews a lease to its full TTL.
    pub fn renew(&mut self, now: Instant, id: LeaseId) -> Result<Duration> {
        self.expire(now);
        let lease = self
            .leases
            .get_mut(&id)
            .ok_or(Error::LeaseNotFound { lease: id })?;
        lease.deadline = now + lease.ttl;
        self.deadlines.set(lease.deadline, id);
        let ttl = lease.ttl;
        let origin = self.origin;
        self.record(|| Entry::Renew { lease: id, origin });
        Ok(ttl)
    }

    /// Every lease's deadline, by lease id.
    pub(crate) fn lease_deadlines(&self) -> Vec<(LeaseId, Instant)> {
        let mut all: Vec<(LeaseId, Instant)> = self
            .leases
            .iter()
            .map(|(id, l)| (*id, l.deadline))
            .collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    /// A lease's deadline, for tests that check when a renewal applied.
    #[cfg(test)]
    pub(crate) fn lease_deadline(&self, id: LeaseId) -> Option<Instant> {
        self.leases.get(&id).map(|lease| lease.deadline)
    }

    /// Reports a lease's remaining time, in whole seconds rounded down, as etcd does.
    pub fn time_to_live(&mut self, now: Instant, id: LeaseId) -> Result<LeaseTimeToLive> {
        self.expire(now);
        let lease = self
            .leases
            .get(&id)
            .ok_or(Error::LeaseNotFound { lease: id })?;
        let remaining = lease.deadline.saturating_duration_since(now);
        Ok(LeaseTimeToLive::new(
            id,
            Duration::from_secs(remaining.as_secs()),
            lease.ttl,
            lease.keys.iter().cloned().collect(),
        ))
    }

    /// An etcd leader change as the leases see it: the new leader's lessor refreshes every
    /// lease to `now + extend + TTL` (etcd's `Promote`), so leases outlive their TTL. Leases
    /// past their deadline are refreshed too, not expired: after a restart, etcd's recovered
    /// leases all get a fresh TTL, whatever the downtime. (For a leader change without
    /// downtime, call [`expire`](Self::expire) first, as the old leader would have.)
    pub fn promote(&mut self, now: Instant, extend: Duration) {
        let mut ids: Vec<LeaseId> = self.leases.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let lease = self.leases.get_mut(&id).expect("listed");
            lease.deadline = now + extend + lease.ttl;
            self.deadlines.set(lease.deadline, id);
        }
        self.record(|| Entry::Promote { extend });
    }

    /// Expires every lease whose deadline is at or before `now`, oldest first, each in its
    /// own revision.
    pub fn expire(&mut self, now: Instant) {
        let origin = std::mem::replace(&mut self.origin, Origin::Expiry);
        // When first, then which: a tie is put in lease order only when it expires.
        while self.next_deadline().is_some_and(|deadline| deadline <= now) {
            let (_, id) = self.first_deadline().expect("a deadline in force");
            self.remove_lease(id);
        }
        self.origin = origin;
    }
}

//! Watches and compaction: registering, catching up, delivering in commit order, and
//! dropping history below the compaction point.

use super::*;

impl State {
    /// Registers a watch. A start revision in the past makes it unsynced: its history is sent
    /// by the next [`sync_watchers`](State::sync_watchers). A compacted start revision queues
    /// `Compacted` and registers nothing.
    pub fn watch(&mut self, now: Instant, req: &WatchRequest) -> WatchId {
        self.expire(now);
        let id = self.next_watch;
        self.next_watch += 1;
        let start = match req.start_revision {
            Some(r) if r > 0 => r,
            _ => self.revision + 1,
        };
        if start < self.compact_revision {
            self.outbox.push(Delivery {
                watch: id,
                item: Err(Error::Compacted {
                    requested: start,
                    compact_revision: self.compact_revision,
                }),
            });
            return id;
        }
        // A watch with history to replay starts unsynced, as in etcd: its history comes with
        // the next sync, and a compaction before then ends it.
        let w = Watcher {
            range: req.range.clone(),
            prev_kv: req.prev_kv,
            next_revision: start,
            synced: start > self.revision,
        };
        self.add_watcher(id, w);
        id
    }

    pub(super) fn add_watcher(&mut self, id: WatchId, w: Watcher) {
        match &w.range {
            KeyRange::Key(k) => {
                self.key_watchers.entry(k.clone()).or_default().insert(id);
            }
            KeyRange::Prefix(p) => {
                self.prefix_watchers.insert(id, p.clone());
            }
        }
        if !w.synced {
            self.unsynced.insert(id);
        }
        self.watchers.insert(id, w);
    }

    pub(super) fn remove_watcher(&mut self, id: WatchId) {
        let Some(w) = self.watchers.remove(&id) else {
            return;
        };
        if let KeyRange::Key(k) = &w.range {
            if let Some(set) = self.key_watchers.get_mut(k) {
                set.remove(&id);
                if set.is_empty() {
                    self.key_watchers.remove(k);
                }
            }
        }
        self.prefix_watchers.remove(&id);
        self.unsynced.remove(&id);
    }

    /// True while some watch still has history to catch up on.
    pub fn has_unsynced_watchers(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// Sends every unsynced watch its history, in one batch, or `Compacted` if a compaction
    /// overtook it; etcd does this from a loop every 100 ms (`syncWatchersLoop`).
    pub fn sync_watchers(&mut self, now: Instant) {
        self.expire(now);
        let ids: Vec<WatchId> = self.unsynced.iter().copied().collect();
        for id in ids {
            let w = &self.watchers[&id];
            if w.next_revision < self.compact_revision {
                self.outbox.push(Delivery {
                    watch: id,
                    item: Err(Error::Compacted {
                        requested: w.next_revision,
                        compact_revision: self.compact_revision,
                    }),
                });
                self.remove_watcher(id);
                continue;
            }
            let events: Vec<Event> = match &w.range {
                // The revisions that changed one key are in its history: a watch on it (a
                // recipe's follow, thousands at once in a large simulation) catches up in the
                // time of the key's changes, not of every write since it started.
                KeyRange::Key(k) => self
                    .changed_since(k, w.next_revision)
                    .filter_map(|rev| self.log.get(&rev))
                    .flat_map(|events| Self::matching(w, events, self.compact_revision))
                    .collect(),
                KeyRange::Prefix(_) => self
                    .log
                    .range(w.next_revision..)
                    .flat_map(|(_, events)| Self::matching(w, events, self.compact_revision))
                    .collect(),
            };
            if !events.is_empty() {
                self.outbox.push(Delivery {
                    watch: id,
                    item: Ok(WatchResponse::new(self.revision, events)),
                });
            }
            let w = self.watchers.get_mut(&id).expect("listed");
            w.next_revision = self.revision + 1;
            w.synced = true;
            self.unsynced.remove(&id);
        }
    }

    /// The revisions from `from` on at which `key` changed, in order. The key's history holds
    /// every change after the compaction point; a delete at the point itself is gone from it
    /// but may still be in the log (when compaction keeps it there), so the point is looked
    /// at too.
    pub(super) fn changed_since(
        &self,
        key: &Bytes,
        from: Revision,
    ) -> impl Iterator<Item = Revision> + '_ {
        let at_point = (from <= self.compact_revision).then_some(self.compact_revision);
        let later = self
            .keys
            .get(key)
            .into_iter()
            .flatten()
            .map(Version::revision)
            .filter(move |r| *r >= from && Some(*r) != at_point);
        at_point.into_iter().chain(later)
    }

    /// Forgets a watch.
    pub fn cancel_watch(&mut self, id: WatchId) {
        self.remove_watcher(id);
    }

    /// Discards history before `rev`.
    pub fn compact(&mut self, now: Instant, rev: Revision) -> Result<()> {
        self.expire(now);
        coord_api::validate::compaction(rev, self.revision, self.compact_revision)?;
        self.compact_revision = rev;
        self.record(|| Entry::Compact { revision: rev });
        self.keys.retain(|versions| {
            // Keep the version current at `rev` (unless it is a deletion) and all after it.
            let keep_from = versions.iter().rposition(|v| v.revision() <= rev);
            if let Some(i) = keep_from {
                let first_kept = if matches!(versions[i], Version::Tombstone(_)) {
                    i + 1
                } else {
                    i
                };
                versions.drain(..first_kept);
            }
            !versions.is_empty()
        });
        self.log = self.log.split_off(&rev);
        if self.compaction_drops_deletes_at_point {
            // etcd 3.4 (etcd#19179, fixed in later releases): compaction removes a tombstone
            // at the compaction revision itself, so a watch from that revision replays its
            // puts but not its deletes.
            if let Some(events) = self.log.get_mut(&rev) {
                events.retain(|e| e.kind != EventKind::Delete);
            }
        }
        Ok(())
    }
}

//! [`ClusterView`]: the membership as a watcher knows it, a snapshot that never changes once
//! published, and what changed between two of them.

use super::*;

/// The membership as the watcher knows it: the hosts and their metadata, current at a
/// revision.
///
/// A view is a snapshot: it never changes once published. Views share their structure, so
/// taking one is cheap whatever the cluster's size, and [`changes_since`](Self::changes_since)
/// finds what changed between two views of one watcher without walking what did not.
#[derive(Clone, Default)]
pub struct ClusterView {
    pub(super) revision: Revision,
    /// Shared names: a change copies the map's node it lands in, and each of that node's
    /// names is then a count bumped, not a string allocated.
    pub(super) hosts: OrdMap<Arc<str>, Bytes>,
    /// Which watcher published it, and when.
    pub(super) published: Published,
    /// How the watcher came to this view from the one it published before, when it knows.
    pub(super) step: Option<Arc<Step>>,
}

/// A watcher's publication: the watcher (numbered from 1 in the process) and the view's place
/// in what it published. The default is no watcher's: views built otherwise.
///
/// A view names the one before it by this, not by holding its hosts map: a map kept that way
/// lived until the next view was dropped too, and its nodes were freed two views later, long
/// after the change that copied them (their entries cold again by then).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Published {
    pub(super) watcher: u64,
    pub(super) seq: u64,
}

/// Numbers the watchers of this process, for [`Published`].
pub(super) static WATCHERS: AtomicU64 = AtomicU64::new(1);

/// The view a watcher published before, and what differs since: what
/// [`ClusterView::changes_since`] needs to answer for that view without walking both maps or
/// looking a host up in either.
pub(super) struct Step {
    pub(super) from: Published,
    /// The hosts whose metadata differs from `from`'s, in host order, each once, with their
    /// metadata now (`None`: gone).
    pub(super) changed: Vec<(String, Option<Bytes>)>,
}

/// A write the watcher applied since it last published: the host, and its metadata before
/// and after (`None`: not up).
pub(super) struct Written {
    pub(super) host: String,
    pub(super) before: Option<Bytes>,
    pub(super) after: Option<Bytes>,
}

impl PartialEq for ClusterView {
    fn eq(&self, other: &Self) -> bool {
        // How a view was reached is not part of it.
        self.revision == other.revision && self.hosts == other.hosts
    }
}

impl Eq for ClusterView {}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterView")
            .field("revision", &self.revision)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// A host that differs between two views: see [`ClusterView::changes_since`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostChange<'a> {
    /// The host.
    pub host: &'a str,
    /// Its metadata in the later view; `None` when it is gone from it.
    pub metadata: Option<&'a Bytes>,
}

impl ClusterView {
    /// The revision the view is current at.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The metadata of `host`, if it is up.
    pub fn get(&self, host: &str) -> Option<&Bytes> {
        self.hosts.get(host)
    }

    /// Whether `host` is up.
    pub fn contains(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// How many hosts are up.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no host is up.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The hosts and their metadata, in host order.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &Bytes)> + '_ {
        self.hosts.iter().map(|(h, m)| (&**h, m))
    }

    /// The hosts and their metadata, as a map of their own.
    pub fn to_map(&self) -> BTreeMap<String, Bytes> {
        self.hosts
            .iter()
            .map(|(h, m)| (h.to_string(), m.clone()))
            .collect()
    }

    /// Whether this view, read by a consumer on receiving `event`, already explains it: the
    /// view is not older than the event, and at the event's own revision it holds the event's
    /// change (a newer view may have moved on: the host back, or gone again). The watcher
    /// promises this of every event it emits.
    pub fn explains(&self, event: &ClusterEvent) -> bool {
        let (revision, holds) = match event {
            ClusterEvent::HostUp {
                host,
                metadata,
                revision,
            }
            | ClusterEvent::HostUpdated {
                host,
                metadata,
                revision,
            } => (*revision, self.get(host) == Some(metadata)),
            ClusterEvent::HostDown { host, revision, .. } => (*revision, !self.contains(host)),
            ClusterEvent::Resynced { revision } => (*revision, true),
        };
        self.revision > revision || (self.revision == revision && holds)
    }

    /// The hosts that differ from `earlier`: up in this view and not in `earlier`, gone from
    /// it, or with other metadata. In host order. Cheap between views of one watcher (they
    /// share what did not change), cheapest between a view and the one the watcher published
    /// just before it (the cost of the hosts written in between); any two views work.
    pub fn changes_since<'a>(
        &'a self,
        earlier: &'a ClusterView,
    ) -> impl Iterator<Item = HostChange<'a>> + 'a {
        match self.step.as_deref() {
            // `earlier` is the view the watcher published just before this one: the hosts it
            // wrote since are all that can differ (a walk of both maps still visits every
            // node on the edge of what they share, for each change).
            // (A step names a watcher's publication, never the default of views built
            // otherwise.)
            Some(step) if step.from == earlier.published => {
                let stepped = step.changed.iter().map(|(host, metadata)| HostChange {
                    host,
                    metadata: metadata.as_ref(),
                });
                debug_assert!(
                    stepped.clone().eq(Self::walk(&earlier.hosts, &self.hosts)),
                    "the watcher's step agrees with the walk"
                );
                Changes::Stepped(stepped)
            }
            _ => Changes::Walked(Self::walk(&earlier.hosts, &self.hosts)),
        }
    }

    pub(super) fn walk<'a>(
        earlier: &'a OrdMap<Arc<str>, Bytes>,
        later: &'a OrdMap<Arc<str>, Bytes>,
    ) -> impl Iterator<Item = HostChange<'a>> + 'a {
        earlier.diff(later).map(|d| match d {
            DiffItem::Add(h, m) | DiffItem::Update { new: (h, m), .. } => HostChange {
                host: h,
                metadata: Some(m),
            },
            DiffItem::Remove(h, _) => HostChange {
                host: h,
                metadata: None,
            },
        })
    }
}

/// [`ClusterView::changes_since`]'s answer, from the watcher's step or from a walk.
pub(super) enum Changes<S, W> {
    Stepped(S),
    Walked(W),
}

impl<'a, S, W> Iterator for Changes<S, W>
where
    S: Iterator<Item = HostChange<'a>>,
    W: Iterator<Item = HostChange<'a>>,
{
    type Item = HostChange<'a>;

    fn next(&mut self) -> Option<HostChange<'a>> {
        match self {
            Changes::Stepped(s) => s.next(),
            Changes::Walked(w) => w.next(),
        }
    }
}

//! What a cluster watcher did, as the history records it: each view it published (the hosts
//! that changed) and each event it emitted, with a check at each event that the view already
//! holds it (C1). Used by coord's nodes, and by tests that record a watcher on a real store.

use std::future::Future;
use std::sync::Arc;

use coord_api::recipes::{ClusterEvent, ClusterView, ClusterWatcher};

use crate::history::{Emitted, Happening, Incarnation};

/// Records, through `record`, every view `watcher` publishes and every event it emits, as
/// incarnation `who`'s, until `stop` completes (then the events it had not handed out) or the
/// watcher ends.
pub async fn record_watcher(
    mut watcher: ClusterWatcher,
    who: Incarnation,
    record: impl Fn(Happening),
    stop: impl Future<Output = ()>,
) {
    let mut views = watcher.subscribe_view();
    let mut recorded: Option<Arc<ClusterView>> = None;
    tokio::pin!(stop);
    loop {
        // Record the view first: the watcher publishes a view before the event it explains.
        let view = views.get_and_update();
        if recorded.as_ref().map(|v| v.revision()) != Some(view.revision()) {
            let empty = ClusterView::default();
            let earlier = recorded.as_deref().unwrap_or(&empty);
            record(Happening::View {
                who,
                revision: view.revision(),
                changes: changes(&view, earlier),
            });
            recorded = Some(view.clone());
        }
        tokio::select! {
            biased;
            _ = &mut stop => {
                // What the view already holds was emitted too: read it to the end.
                for event in watcher.stop().await {
                    record(Happening::Emitted(who, emitted(event)));
                }
                return;
            }
            changed = views.changed() => if changed.is_err() { return },
            event = watcher.next() => {
                let Some(event) = event else { return };
                if let Some(wrong) = view_disagrees(&event, &watcher.view()) {
                    record(Happening::Inconsistent { who, detail: wrong });
                }
                record(Happening::Emitted(who, emitted(event)));
            }
        }
    }
}

/// The hosts of `view` that differ from `earlier`, for the history.
fn changes(view: &ClusterView, earlier: &ClusterView) -> Vec<(String, Option<String>)> {
    view.changes_since(earlier)
        .map(|c| {
            let md = c.metadata.map(|m| String::from_utf8_lossy(m).into_owned());
            (c.host.to_owned(), md)
        })
        .collect()
}

/// Whether the view a consumer reads on getting `event` is older than the event, or, at the
/// event's own revision, misses its change. (A newer view may have moved on: the host may be
/// back, or gone again.)
fn view_disagrees(event: &ClusterEvent, view: &ClusterView) -> Option<String> {
    (!view.explains(event)).then(|| {
        format!(
            "the watcher emitted {event:?} while its view was at revision {} ({} hosts)",
            view.revision(),
            view.len()
        )
    })
}

fn emitted(e: ClusterEvent) -> Emitted {
    let md = |m: coord_api::Bytes| String::from_utf8_lossy(&m).into_owned();
    match e {
        ClusterEvent::HostUp {
            host,
            metadata,
            revision,
        } => Emitted::Up(host, md(metadata), revision),
        ClusterEvent::HostUpdated {
            host,
            metadata,
            revision,
        } => Emitted::Updated(host, md(metadata), revision),
        ClusterEvent::HostDown { host, revision, .. } => Emitted::Down(host, revision),
        ClusterEvent::Resynced { revision } => Emitted::Resynced(revision),
    }
}

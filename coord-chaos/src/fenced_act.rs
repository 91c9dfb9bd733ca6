//! A leader's act, as coord's nodes do it: a write of its token through its fence, recorded
//! with the outcome the store gave.

use coord_api::recipes::Fence;
use coord_api::{Error, PutRequest, Revision, TxnRequest};
use tokio::task::JoinHandle;

use crate::history::{Happening, Outcome};
use crate::service::Node;

/// Writes `token` to `key` through `fence`, and records the write as `election`'s. A paused
/// process decided to act, then stalls before acting: the act comes late, and only the fence
/// stops it from doing harm. The write goes on in a task of its own: a leadership that is
/// over (or a part that stops) cannot call back a request already sent, and the store judges
/// it whenever it lands.
pub(crate) fn write_through(
    node: &Node,
    key: String,
    election: String,
    token: Revision,
    fence: Fence,
) -> JoinHandle<()> {
    let writer = node.clone();
    tokio::spawn(async move {
        writer.unpaused().await;
        let txn = TxnRequest::new().and_then([PutRequest::new(key, token.to_string())]);
        let outcome = match fence.txn(txn).await {
            Ok(r) if r.succeeded => Outcome::Accepted,
            Ok(_) => Outcome::Unknown,
            Err(Error::FencedOut { .. }) => Outcome::FencedOut,
            Err(_) => Outcome::Unknown,
        };
        writer.record(Happening::FencedWrite {
            who: writer.who(),
            election,
            token,
            outcome,
        });
    })
}

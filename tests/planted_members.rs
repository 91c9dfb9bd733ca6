//! The planted bug the chaos runs cannot see, caught by the member suites' bare client.
//!
//! `failover-stays-on-no-leader` keeps an `EtcdStore` on a member that answers `no leader`.
//! A session leaves such a member on its own (an abandoned renewal moves the pool), so the
//! chaos checkers, whose nodes all hold sessions, never see it; the bare-request case of
//! `members/bare.rs` (no session, no watcher) must. Built only with `--features planted-bugs`
//! (coord-api then compiles its planted defects in, all off); the bug is switched on
//! process-wide, so this binary holds one test.

#[path = "members/bare.rs"]
mod bare;
// The harness serves the member probe too; this binary runs the bare case alone.
#[allow(dead_code)]
#[path = "members/cluster.rs"]
mod cluster;
#[allow(dead_code)]
#[path = "members/sim.rs"]
mod sim;

use std::panic::{catch_unwind, AssertUnwindSafe};

use coord_api::planted::{self, Bug};
use coord_sim::grpc::EtcdVersion;

#[test]
fn the_bare_client_catches_failover_stays_on_no_leader() {
    let run = || {
        catch_unwind(AssertUnwindSafe(|| {
            sim::on_the_simulator(EtcdVersion::V3_5, |m| async move {
                bare::bare_requests(&m).await
            })
        }))
    };
    planted::enable(&[]);
    assert!(run().is_ok(), "the bare case fails with no bug planted");
    planted::enable(&[Bug::FailoverStaysOnNoLeader]);
    let caught = run().is_err();
    planted::enable(&[]);
    assert!(
        caught,
        "the bare case passed with failover-stays-on-no-leader planted"
    );
}

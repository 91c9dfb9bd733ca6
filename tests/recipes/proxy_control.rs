//! A recipe fixture's client controls over a TCP proxy (`coord_etcd::testing::TcpProxy`,
//! which carries any TCP protocol): the same cuts, delays and holds for etcd's fixture and
//! PostgreSQL's.

use std::sync::Arc;
use std::time::Duration;

use coord_api::testkit::recipes::Control;
use coord_etcd::testing::TcpProxy;

/// Controls one client's proxy.
pub(crate) struct ProxyControl(pub(crate) Arc<TcpProxy>);

#[coord_api::async_trait]
impl Control for ProxyControl {
    async fn close_streams(&self) {
        self.0.close_connections();
    }

    fn cut_off(&self, on: bool) {
        if on {
            self.0.blackhole();
        } else {
            self.0.heal();
        }
    }

    fn delay_requests(&self, by: Duration) {
        if by.is_zero() {
            self.0.heal();
        } else {
            self.0.delay(by);
        }
    }

    fn hold_in_flight(&self, on: bool) {
        if on {
            self.0.hold();
        } else {
            self.0.heal();
        }
    }
}

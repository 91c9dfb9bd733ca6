//! A turmoil simulation depends on its seed alone, never on how fast the machine runs it.
//!
//! HTTP/2 (the h2 crate, under tonic and etcd-client) remembers a stream it reset for one
//! second of real time, read from the system clock: a frame for that stream arriving within
//! the second is dropped in silence, one after it draws a reset back, one message more on
//! the simulated network. A reply that comes late (over a slow or held link) arrives seconds of virtual time after its request was given up, which is
//! milliseconds of real time on an idle machine and may be more than a second on a busy one:
//! a seed's history then differed between two runs in one CI job (`a_turmoil_seed_replays_
//! exactly`, seed 77). The simulator's client channels forget a reset stream at once.
//!
//! The case: a client gives up a read whose reply is on its way back over a slow link; the
//! simulation goes on at once in one run and after 1.2 s of real time in the other; every
//! message either run sent on the simulated network must be the same.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_sim::grpc::{channel, SimCluster, ETCD_PORT};
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The messages turmoil sends, as it logs each (`Send`, with its source, destination and
/// segment) under its own tracing target.
#[derive(Clone, Default)]
struct Sent(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Sent {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Fields(String);
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, "{}={value:?} ", field.name());
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if fields.0.contains("message=Send") {
            self.0.lock().unwrap().push(shape(&fields.0));
        }
    }
}

/// A message's source, destination and kind (SYN, FIN, RST or data), not its bytes: the
/// server stamps each reply with the wall clock's date (hyper's `date` header), so the bytes
/// of two runs differ by their seconds while saying the same.
fn shape(fields: &str) -> String {
    let field = |name: &str| {
        fields
            .split(' ')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or("?")
            .to_owned()
    };
    let protocol = fields.split("protocol=").nth(1).unwrap_or("?");
    let kind = ["TCP SYN", "TCP FIN", "TCP RST"]
        .into_iter()
        .find(|k| protocol.starts_with(k))
        .unwrap_or("TCP data");
    format!("{} -> {}: {kind}", field("src="), field("dst="))
}

/// Where the client and the simulation's driver are: the driver alone slows the link and
/// pauses, between steps.
const RUNNING: u8 = 0;
const SLOW_ASKED: u8 = 1;
const SLOW: u8 = 2;
const GAVE_UP: u8 = 3;
const RESUMED: u8 = 4;

/// Runs the case, pausing `pause` of real time just after the client gave up its read and
/// before the read's reply reaches it; returns every message the simulated network carried.
fn messages_when_paused_for(pause: Duration) -> Vec<String> {
    let sent = Sent::default();
    let subscriber = tracing_subscriber::registry().with(
        sent.clone()
            .with_filter(Targets::new().with_target("turmoil", tracing::Level::TRACE)),
    );
    tracing::subscriber::with_default(subscriber, || {
        let mut sim = turmoil::Builder::new()
            .rng_seed(7)
            .tick_duration(Duration::from_millis(1))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(1))
            .simulation_duration(Duration::from_secs(60))
            .build();
        let cluster = SimCluster::builder().members(1).add_to(&mut sim);
        let host = cluster.host(0).to_owned();
        let phase = Arc::new(AtomicU8::new(RUNNING));
        let at = phase.clone();
        let member = host.clone();
        sim.client("client", async move {
            let wait_for = |want: u8| {
                let at = at.clone();
                async move {
                    while at.load(Ordering::Acquire) != want {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            };
            let mut client = etcd_client::Client::from_channel(
                etcd_client::Channel::Tonic(channel(&member, ETCD_PORT)),
                None,
            )
            .await?;
            // The member elects itself first.
            tokio::time::sleep(Duration::from_secs(3)).await;
            client.put("k", "v", None).await?;
            at.store(SLOW_ASKED, Ordering::Release);
            wait_for(SLOW).await;
            // 300 ms each way: the reply is on its way back when the client gives up at 500 ms
            // (resetting the stream), and arrives at 600 ms, late.
            let given_up = tokio::time::timeout(Duration::from_millis(500), client.get("k", None));
            assert!(given_up.await.is_err(), "the reply takes 600 ms");
            at.store(GAVE_UP, Ordering::Release);
            wait_for(RESUMED).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let kvs = client.get("k", None).await?;
            assert_eq!(kvs.kvs().len(), 1, "the member answers");
            Ok(())
        });
        loop {
            match phase.load(Ordering::Acquire) {
                SLOW_ASKED => {
                    sim.set_link_latency("client", host.as_str(), Duration::from_millis(300));
                    phase.store(SLOW, Ordering::Release);
                }
                GAVE_UP => {
                    std::thread::sleep(pause);
                    phase.store(RESUMED, Ordering::Release);
                }
                _ => {}
            }
            if sim.step().expect("the simulation runs") {
                break;
            }
        }
    });
    let sent = std::mem::take(&mut *sent.0.lock().unwrap());
    assert!(sent.len() > 10, "the layer saw the network's messages");
    sent
}

#[test]
fn a_late_reply_sends_the_same_messages_however_long_it_took_in_real_time() {
    let at_once = messages_when_paused_for(Duration::ZERO);
    // Past h2's one second of memory for a reset stream, with a fifth of it to spare.
    let late = messages_when_paused_for(Duration::from_millis(1200));
    assert_eq!(
        at_once.len(),
        late.len(),
        "as many messages whether the late reply came at once or 1.2 s later in real time"
    );
    assert_eq!(at_once, late);
}

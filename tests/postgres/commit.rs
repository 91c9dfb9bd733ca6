//! A commit whose answer never comes: the server holds the commit past the request timeout
//! (a deferred trigger waits on a lock the test holds), then lets it through. The caller must
//! be told `Indeterminate` (it may have applied; it did), and the store must not send the
//! transaction again as if it had failed: a second attempt, judged against the first one's
//! write, would report the compare failed for a key the caller itself created (the planted
//! `postgres-retries-an-unknown-commit`).

use std::time::Duration;

use coord_api::testkit::eventually;
use coord_api::{Compare, CompareOp, Error, KvLeaseStore, KvLeaseStoreExt, PutRequest, TxnRequest};
use coord_postgres::testing::PostgresServer;
use coord_postgres::PostgresStore;

/// The store's request timeout here: the commit is held well past it, until the test sees
/// the call come back (or a second attempt queue behind the first).
const TIMEOUT: Duration = Duration::from_secs(1);

/// The deferred trigger that holds a commit writing the key `held` until the test lets go of
/// advisory lock 7 (the test's own statements: no recipe or store uses advisory locks).
const HOLD: &str = "\
    CREATE FUNCTION coord_test_hold() RETURNS trigger LANGUAGE plpgsql AS \
      $$ BEGIN PERFORM pg_advisory_xact_lock_shared(7); RETURN NULL; END $$; \
    CREATE CONSTRAINT TRIGGER coord_test_hold AFTER INSERT ON coord_kv \
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
      WHEN (NEW.key = 'held'::bytea) EXECUTE FUNCTION coord_test_hold(); \
    SELECT pg_advisory_lock(7)";

/// A backend waiting for a row lock (not the advisory one): a second attempt queued behind
/// the held commit's lock on the revision row.
const QUEUED: &str = "SELECT count(*) FROM pg_stat_activity \
    WHERE wait_event_type = 'Lock' AND wait_event <> 'advisory'";

/// Runs the case on a server of its own; panics if the caller is told anything but
/// `Indeterminate`, or the held commit did not apply exactly once.
pub(crate) async fn a_held_commit_is_indeterminate_and_not_sent_again() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let store = PostgresStore::connect(server.config().with_request_timeout(TIMEOUT))
        .await
        .expect("a store");
    let admin = server.admin().await.expect("an admin session");
    admin.batch_execute(HOLD).await.expect("the hold in place");

    let create = TxnRequest::new()
        .when([Compare::create_revision("held", CompareOp::Equal, 0)])
        .and_then([PutRequest::new("held", "mine")]);
    let call = {
        let store = store.clone();
        tokio::spawn(async move { store.txn(create).await })
    };
    eventually(
        TIMEOUT * 10,
        "the call back, or a second attempt queued",
        || async {
            call.is_finished() || {
                let row = admin
                    .query_one(QUEUED, &[])
                    .await
                    .expect("pg_stat_activity");
                row.get::<_, i64>(0) > 0
            }
        },
    )
    .await;
    admin
        .batch_execute("SELECT pg_advisory_unlock(7)")
        .await
        .expect("the hold released");
    let answer = call.await.expect("the call's task");
    assert!(
        matches!(answer, Err(Error::Indeterminate { .. })),
        "a commit held past the request timeout was answered {answer:?}, not Indeterminate"
    );
    // It had applied: the key is there, written once, by this call.
    eventually(TIMEOUT * 5, "the held commit applied", || async {
        store.get_key("held").await.ok().flatten().is_some()
    })
    .await;
    let kv = store
        .get_key("held")
        .await
        .expect("a read")
        .expect("the key");
    assert_eq!((kv.value.as_ref(), kv.version), (&b"mine"[..], 1));
}

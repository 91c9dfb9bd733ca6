//! TLS and password authentication against a real PostgreSQL: certificates are made at test
//! time, the server requires TLS and a password (SCRAM) of every user but the harness's own;
//! the right credentials work over TLS, and wrong or missing ones give a typed error, fast.

#[path = "security/pki.rs"]
mod pki;

use std::time::Duration;

use coord_api::{Error, KvLeaseStoreExt};
use coord_postgres::testing::PostgresServer;
use coord_postgres::{PostgresConfig, PostgresStore, TlsConfig};
use pki::Pki;
use tokio::time::Instant;

/// How long a refusal may take: no request hangs on credentials.
const BOUND: Duration = Duration::from_secs(10);

async fn secured(pki: &Pki) -> PostgresServer {
    let (cert, key) = pki.leaf(&["127.0.0.1", "localhost"]);
    let server = PostgresServer::start_secured(&cert, &key, &pki.ca_pem)
        .await
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL with TLS: {e}"));
    server
        .create_user("app", "right-password")
        .await
        .expect("a user");
    server
}

/// A connection string for `user` with `password` (none when empty) and `sslmode`.
fn as_user(server: &PostgresServer, user: &str, password: &str, sslmode: &str) -> String {
    let password = if password.is_empty() {
        String::new()
    } else {
        format!(" password={password}")
    };
    format!(
        "host=127.0.0.1 port={} user={user}{password} dbname=postgres sslmode={sslmode} connect_timeout=5",
        server.port()
    )
}

/// The error a configuration that must not work gets, within [`BOUND`].
async fn refused(config: PostgresConfig) -> Error {
    let start = Instant::now();
    let result = tokio::time::timeout(BOUND, async {
        let store = PostgresStore::connect(config).await?;
        store.put_value("secure/k", "v").await
    })
    .await
    .unwrap_or_else(|_| panic!("hung for {BOUND:?} instead of failing"));
    let err = result.expect_err("these credentials must be refused");
    println!("refused after {:?}: {err} ({err:?})", start.elapsed());
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_a_password_work_and_nothing_less_does() {
    let pki = Pki::new("coord test CA");
    let server = secured(&pki).await;

    // Over TLS with the right password: the store works, and its sessions are encrypted.
    let config = PostgresConfig::new(as_user(&server, "app", "right-password", "require"))
        .with_tls(TlsConfig::new(pki.ca_pem.clone()));
    let store = PostgresStore::connect(config)
        .await
        .expect("connect over TLS");
    store.put_value("secure/k", "v").await.expect("a put");
    assert_eq!(
        store.get_key("secure/k").await.unwrap().unwrap().value,
        "v".as_bytes()
    );
    let admin = server.admin().await.expect("an admin session");
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'app'",
            &[],
        )
        .await
        .unwrap();
    let (encrypted, all): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        all > 0 && encrypted == all,
        "{encrypted} of {all} sessions encrypted"
    );

    // A wrong password, over TLS.
    let wrong = PostgresConfig::new(as_user(&server, "app", "wrong-password", "require"))
        .with_tls(TlsConfig::new(pki.ca_pem.clone()));
    let err = refused(wrong).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");

    // The right password without TLS: the server's rules refuse it.
    let plain = PostgresConfig::new(as_user(&server, "app", "right-password", "disable"));
    let err = refused(plain).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");

    // TLS to a server whose certificate another CA signed: not trusted.
    let other = Pki::new("another CA");
    let untrusted = PostgresConfig::new(as_user(&server, "app", "right-password", "require"))
        .with_tls(TlsConfig::new(other.ca_pem.clone()));
    let err = refused(untrusted).await;
    assert!(
        matches!(&err, Error::PermissionDenied { reason, .. } if reason.contains("certificate")),
        "a refusal that names the certificate: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_works_and_another_cas_is_refused() {
    let pki = Pki::new("coord test CA");
    let server = secured(&pki).await;
    server
        .create_user("certified", "unused-password")
        .await
        .expect("a user");
    let user = |sslmode| as_user(&server, "certified", "", sslmode);

    let (cert, key) = pki.client("certified");
    let config = PostgresConfig::new(user("require"))
        .with_tls(TlsConfig::new(pki.ca_pem.clone()).with_identity_pem(cert, key));
    let store = PostgresStore::connect(config)
        .await
        .expect("connect with a client certificate");
    store.put_value("secure/k", "v").await.expect("a put");

    // No client certificate.
    let none = PostgresConfig::new(user("require")).with_tls(TlsConfig::new(pki.ca_pem.clone()));
    let err = refused(none).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");

    // A certificate another CA signed, for the same name.
    let (cert, key) = Pki::new("another CA").client("certified");
    let foreign = PostgresConfig::new(user("require"))
        .with_tls(TlsConfig::new(pki.ca_pem.clone()).with_identity_pem(cert, key));
    let err = refused(foreign).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_setting_without_a_ca_is_a_typed_error() {
    let config = PostgresConfig::new("host=127.0.0.1 user=coord sslmode=require")
        .with_tls(TlsConfig::new("not a certificate"));
    let err = PostgresStore::connect(config)
        .await
        .expect_err("no CA in the PEM");
    assert!(
        matches!(&err, Error::InvalidArgument { reason } if reason.contains("CA")),
        "{err:?}"
    );
}

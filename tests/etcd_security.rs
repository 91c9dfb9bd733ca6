//! TLS and authentication against a real etcd: certificates are generated at test time; the
//! right credentials work, wrong or missing ones give a clear typed error, and nothing hangs.

// etcd takes a client certificate of any name; PostgreSQL's tests name theirs (`client`).
#[allow(dead_code)]
#[path = "security/pki.rs"]
mod pki;

use std::path::Path;
use std::time::Duration;

use coord_api::{Error, KvLeaseStoreExt};
use coord_etcd::testing::{EtcdCluster, ServerTls};
use coord_etcd::{EtcdConfig, EtcdStore, TlsConfig};
use pki::Pki;
use tokio::time::Instant;

fn write(dir: &Path, name: &str, pem: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

/// An error a client gets within `bound`, for a configuration that must not work.
async fn refused(config: EtcdConfig, bound: Duration) -> Error {
    let start = Instant::now();
    let result = tokio::time::timeout(bound, async {
        let store = EtcdStore::connect(config).await?;
        store.put_value("secure/k", "v").await
    })
    .await
    .unwrap_or_else(|_| panic!("hung for {bound:?} instead of failing"));
    let err = result.expect_err("these credentials must be refused");
    println!("refused after {:?}: {err} ({err:?})", start.elapsed());
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let pki = Pki::new("coord test CA");
    let files = tempfile::tempdir().unwrap();
    let (server_cert, server_key) = pki.leaf(&["127.0.0.1", "localhost"]);
    let (client_cert, client_key) = pki.leaf(&["coord-client"]);
    let server = ServerTls {
        cert_file: write(files.path(), "server.pem", &server_cert),
        key_file: write(files.path(), "server-key.pem", &server_key),
        ca_file: write(files.path(), "ca.pem", &pki.ca_pem),
        client_cert_auth: true,
    };
    let good = TlsConfig::new()
        .with_ca_pem(pki.ca_pem.clone())
        .with_identity_pem(client_cert.clone(), client_key.clone());
    let cluster = EtcdCluster::builder()
        .tls(server, good.clone())
        .start()
        .await
        .unwrap_or_else(|e| panic!("cannot start etcd with TLS: {e}"));

    let store = cluster.store().await;
    let rev = store.put_value("secure/k", "v").await.unwrap();
    assert_eq!(
        store
            .get_key("secure/k")
            .await
            .unwrap()
            .unwrap()
            .mod_revision,
        rev
    );

    let bound = Duration::from_secs(10);
    // No client certificate: the server refuses the handshake.
    let no_identity = cluster
        .config()
        .with_tls(TlsConfig::new().with_ca_pem(pki.ca_pem.clone()));
    let err = refused(no_identity, bound).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    // The server's alert (BadCertificate), or the hang-up when it loses the race.
    assert!(err.to_string().contains("ertificate"), "{err}");

    // A client certificate from another CA.
    let other = Pki::new("someone else's CA");
    let (cert, key) = other.leaf(&["intruder"]);
    let foreign = cluster.config().with_tls(
        TlsConfig::new()
            .with_ca_pem(pki.ca_pem.clone())
            .with_identity_pem(cert, key),
    );
    let err = refused(foreign, bound).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    // The alert itself, or (when it loses the race with our first write) the hang-up.
    assert!(err.to_string().contains("ertificate"), "{err}");

    // A client that does not trust the server's CA.
    let distrust = cluster.config().with_tls(
        TlsConfig::new()
            .with_ca_pem(other.ca_pem.clone())
            .with_identity_pem(client_cert, client_key),
    );
    let err = refused(distrust, bound).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_authentication() {
    let cluster = EtcdCluster::single()
        .await
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let mut admin = etcd_client::Client::connect([cluster.endpoint(0)], None)
        .await
        .unwrap();
    admin.user_add("root", "root-pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let store = EtcdStore::connect(cluster.config().with_user("root", "root-pw"))
        .await
        .unwrap();
    store.put_value("auth/k", "v").await.unwrap();

    let bound = Duration::from_secs(10);
    let err = refused(cluster.config().with_user("root", "wrong"), bound).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("authentication failed"), "{err}");

    let err = refused(cluster.config(), bound).await;
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
}

//! etcd-client errors mapped to coord's error conditions.
//!
//! The rule for what may be retried is etcd's own Go client's (`retry_interceptor.go`): a read
//! may be retried after any transport failure; a write only when it was never sent (no
//! connection could be made, or etcd refused it before proposing it). Every other failed write
//! is [`Error::Indeterminate`]: it may have been applied.

use coord_api::{Error, LeaseId};
use tonic::Code;

pub(crate) const BACKEND: &str = "etcd";

/// Whether an operation changes the store, which decides what a transport failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// Messages that mean the request never reached a server that could apply it.
fn never_sent(message: &str) -> bool {
    const NOT_SENT: [&str; 8] = [
        "tcp connect error",
        "connection refused",
        "error trying to connect",
        "dns error",
        "etcdserver: no leader",
        "etcdserver: too many requests",
        "etcdserver: not capable",
        "no available endpoint",
    ];
    NOT_SENT.iter().any(|m| message.contains(m))
}

fn unavailable(op: &'static str, source: impl Into<coord_api::BoxError>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        operation: op,
        source: source.into(),
    }
}

fn in_doubt(op: &'static str, kind: Kind, source: impl Into<coord_api::BoxError>) -> Error {
    match kind {
        Kind::Read => unavailable(op, source),
        Kind::Write => Error::Indeterminate {
            backend: BACKEND,
            operation: op,
            source: source.into(),
        },
    }
}

fn rejected(op: &'static str, source: impl Into<coord_api::BoxError>) -> Error {
    Error::Rejected {
        backend: BACKEND,
        operation: op,
        source: source.into(),
    }
}

/// Whether `err` is a member's answer (a refusal: `leader changed`, `no leader`, a lease not
/// found, a compacted revision...), as opposed to a failure of the way there. etcd prefixes
/// every error it returns with `etcdserver:`; the transport's (tonic's, hyper's, h2's) never
/// are. A refusal proves the connection alive as much as a reply does.
pub(crate) fn from_member(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s) if s.message().starts_with("etcdserver:"))
}

/// Whether the transport gave the request back unsent: hyper cancels a request that was still
/// queued for a connection when that connection closed, or that met a connection not ready to
/// take it, and only then (`hyper::Error::is_canceled`). Such a write reached no server, so it
/// may go to another member. A connection that closes under a request it already took is not
/// this case: the request may have been written, read and proposed before the member died.
fn given_back_unsent(status: &tonic::Status) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(e) = cur {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Maps a gRPC status from etcd.
///
/// `LeaseNotFound`, `Compacted` and `FutureRevision` come back with placeholder fields (etcd's
/// message does not carry them); the caller fills them in, see [`crate::store`].
pub(crate) fn map_status(op: &'static str, kind: Kind, status: tonic::Status) -> Error {
    let msg = status.message().to_owned();
    let auth_failed = msg.contains("authentication failed")
        || msg.contains("invalid user ID or password")
        || msg.contains("user name is empty");
    match status.code() {
        _ if given_back_unsent(&status) => unavailable(op, status),
        _ if auth_failed => Error::PermissionDenied {
            backend: BACKEND,
            reason: msg,
        },
        Code::PermissionDenied | Code::Unauthenticated => Error::PermissionDenied {
            backend: BACKEND,
            reason: msg,
        },
        Code::InvalidArgument => Error::invalid(format!("etcd refused {op}: {msg}")),
        Code::NotFound if msg.contains("lease not found") => Error::LeaseNotFound {
            lease: LeaseId::NONE,
        },
        Code::OutOfRange if msg.contains("compacted") => Error::Compacted {
            requested: coord_api::Revision::ZERO,
            compact_revision: coord_api::Revision::ZERO,
        },
        Code::OutOfRange if msg.contains("future revision") => Error::FutureRevision {
            requested: coord_api::Revision::ZERO,
            current: coord_api::Revision::ZERO,
        },
        Code::OutOfRange if msg.contains("too large lease TTL") => {
            Error::invalid(format!("etcd refused {op}: {msg}"))
        }
        Code::ResourceExhausted if msg.contains("larger than max") => {
            Error::invalid(format!("etcd refused {op}: {msg}"))
        }
        Code::ResourceExhausted if never_sent(&msg) => unavailable(op, status),
        Code::Unavailable if never_sent(&msg) => unavailable(op, status),
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Aborted => in_doubt(op, kind, status),
        _ => rejected(op, status),
    }
}

/// Maps any etcd-client error.
pub(crate) fn map(op: &'static str, kind: Kind, err: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match err {
        E::GRpcStatus(status) => map_status(op, kind, status),
        // Raised while building or connecting a channel: nothing was sent.
        E::TransportError(e) => unavailable(op, e),
        E::IoError(e) => in_doubt(op, kind, e),
        E::InvalidArgs(m) => Error::invalid(format!("{op}: {m}")),
        E::InvalidUri(e) => Error::invalid(format!("{op}: invalid endpoint URI: {e}")),
        E::InvalidMetadataValue(e) => Error::invalid(format!("{op}: invalid credentials: {e}")),
        E::EndpointError(m) => Error::invalid(format!("{op}: {m}")),
        E::WatchError(_) | E::LeaseKeepAliveError(_) => Error::StreamClosed {
            stream: op,
            source: Some(Box::new(err)),
        },
        other => rejected(op, other),
    }
}

/// Fills in the lease a `LeaseNotFound` is about (etcd's error does not say).
pub(crate) fn with_lease(err: Error, lease: Option<LeaseId>) -> Error {
    match (err, lease) {
        (Error::LeaseNotFound { .. }, Some(lease)) => Error::LeaseNotFound { lease },
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_api::ErrorClass;

    fn class(kind: Kind, code: Code, msg: &str) -> (ErrorClass, Error) {
        let e = map_status("op", kind, tonic::Status::new(code, msg));
        (e.class(), e)
    }

    #[test]
    fn a_refused_connection_is_retryable_even_for_writes() {
        for kind in [Kind::Read, Kind::Write] {
            let (c, _) = class(kind, Code::Unavailable, "tcp connect error");
            assert_eq!(c, ErrorClass::Retryable);
        }
    }

    #[test]
    fn no_leader_is_refused_before_proposal_so_retryable() {
        let (c, _) = class(Kind::Write, Code::Unavailable, "etcdserver: no leader");
        assert_eq!(c, ErrorClass::Retryable);
    }

    #[test]
    fn a_timed_out_write_is_indeterminate_and_a_timed_out_read_retryable() {
        for code in [Code::DeadlineExceeded, Code::Cancelled, Code::Unknown] {
            let (c, _) = class(Kind::Write, code, "Timeout expired");
            assert_eq!(c, ErrorClass::Indeterminate, "{code:?}");
            let (c, _) = class(Kind::Read, code, "Timeout expired");
            assert_eq!(c, ErrorClass::Retryable, "{code:?}");
        }
    }

    #[test]
    fn a_write_lost_in_a_leader_change_is_indeterminate() {
        let (c, _) = class(Kind::Write, Code::Unavailable, "etcdserver: leader changed");
        assert_eq!(c, ErrorClass::Indeterminate);
        let (c, _) = class(
            Kind::Write,
            Code::Unavailable,
            "etcdserver: request timed out",
        );
        assert_eq!(c, ErrorClass::Indeterminate);
    }

    #[test]
    fn h2_stream_errors_are_indeterminate_for_writes() {
        let msg = "h2 protocol error: error reading a body from connection";
        let (c, _) = class(Kind::Write, Code::Unknown, msg);
        assert_eq!(c, ErrorClass::Indeterminate);
    }

    /// A request the transport gave back unsent, produced by hyper itself: an HTTP/2 client
    /// whose connection is gone before the request is taken, as after a member's death.
    async fn request_given_back_unsent() -> tonic::Status {
        let (client_io, _server_io) = tokio::io::duplex(64 * 1024);
        let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, String>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(client_io),
        )
        .await
        .expect("handshake");
        drop(conn);
        let request = http::Request::new(String::new());
        let err = send.send_request(request).await.expect_err("no connection");
        assert!(err.is_canceled(), "{err:?}");
        tonic::Status::from_error(Box::new(err))
    }

    #[tokio::test]
    async fn a_write_given_back_unsent_is_retryable() {
        let status = request_given_back_unsent().await;
        let e = map("put", Kind::Write, etcd_client::Error::GRpcStatus(status));
        assert_eq!(e.class(), ErrorClass::Retryable, "{e:?}");
    }

    #[test]
    fn a_closed_connection_under_a_taken_write_is_indeterminate() {
        // What h2 reports on the streams it had taken when the member's end closed.
        let eof = std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        );
        let status = tonic::Status::from_error(Box::new(eof));
        let e = map("put", Kind::Write, etcd_client::Error::GRpcStatus(status));
        assert_eq!(e.class(), ErrorClass::Indeterminate, "{e:?}");
    }

    #[test]
    fn invalid_arguments_say_what_etcd_said() {
        let (c, e) = class(
            Kind::Write,
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        );
        assert_eq!(c, ErrorClass::InvalidArgument);
        assert!(e.to_string().contains("key is not provided"), "{e}");
    }

    #[test]
    fn oversized_messages_are_invalid_arguments() {
        let msg = "grpc: received message larger than max (2097164 vs. 2097152)";
        let (c, _) = class(Kind::Write, Code::ResourceExhausted, msg);
        assert_eq!(c, ErrorClass::InvalidArgument);
    }

    #[test]
    fn lease_not_found_is_typed() {
        let (_, e) = class(
            Kind::Write,
            Code::NotFound,
            "etcdserver: requested lease not found",
        );
        assert!(matches!(e, Error::LeaseNotFound { .. }), "{e:?}");
    }

    #[test]
    fn compaction_and_future_revisions_are_typed() {
        let (_, e) = class(
            Kind::Read,
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert!(matches!(e, Error::Compacted { .. }), "{e:?}");
        let (_, e) = class(
            Kind::Read,
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision",
        );
        assert!(matches!(e, Error::FutureRevision { .. }), "{e:?}");
    }

    #[test]
    fn bad_credentials_are_permission_denied() {
        let (_, e) = class(
            Kind::Read,
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
        for code in [Code::PermissionDenied, Code::Unauthenticated] {
            let (_, e) = class(Kind::Read, code, "etcdserver: permission denied");
            assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
        }
    }

    #[test]
    fn other_refusals_are_rejected() {
        let (c, _) = class(
            Kind::Write,
            Code::FailedPrecondition,
            "etcdserver: lease already exists",
        );
        assert_eq!(c, ErrorClass::Rejected);
        let (c, _) = class(
            Kind::Read,
            Code::Unimplemented,
            "unknown method RangeStream",
        );
        assert_eq!(c, ErrorClass::Rejected);
    }

    #[test]
    fn client_side_errors_map_by_condition() {
        let e = map(
            "get",
            Kind::Read,
            etcd_client::Error::InvalidArgs("empty endpoints".into()),
        );
        assert_eq!(e.class(), ErrorClass::InvalidArgument);
        let e = map(
            "keep-alive",
            Kind::Write,
            etcd_client::Error::LeaseKeepAliveError("channel closed".into()),
        );
        assert!(matches!(e, Error::StreamClosed { .. }), "{e:?}");
    }
}

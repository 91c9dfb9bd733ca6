//! PostgreSQL's failures as coord's typed errors: one place decides what a caller may do next.

use coord_api::Error;

use crate::BACKEND;

/// Where in a request a failure happened, which decides whether it may have applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Before anything that writes was sent, or in a read: nothing applied.
    Before,
    /// While the commit was on its way or its answer was: the write may have applied.
    Commit,
}

/// The error for `operation` failing at `stage` with `source`.
pub(crate) fn from_pg(
    operation: &'static str,
    stage: Stage,
    source: tokio_postgres::Error,
) -> Error {
    if let Some(db) = source.as_db_error() {
        // The server answered: it applied nothing (an error inside a transaction rolls the
        // whole transaction back, and a failed COMMIT commits nothing).
        let code = db.code().code();
        if code.starts_with("28") || code == "42501" {
            return Error::PermissionDenied {
                backend: BACKEND,
                reason: db.message().to_owned(),
            };
        }
        // Connection trouble, conflicts, a server short of resources or shutting down: worth
        // another try. Anything else (a bad statement, a broken schema) would fail again.
        let transient = ["08", "40", "53", "55", "57", "58"]
            .iter()
            .any(|class| code.starts_with(class));
        return if transient {
            Error::Unavailable {
                backend: BACKEND,
                operation,
                source: Box::new(source),
            }
        } else {
            Error::Rejected {
                backend: BACKEND,
                operation,
                source: Box::new(source),
            }
        };
    }
    if let Some(reason) = tls_refusal(&source) {
        return Error::PermissionDenied {
            backend: BACKEND,
            reason,
        };
    }
    match stage {
        Stage::Before => Error::Unavailable {
            backend: BACKEND,
            operation,
            source: Box::new(source),
        },
        Stage::Commit => Error::Indeterminate {
            backend: BACKEND,
            operation,
            source: Box::new(source),
        },
    }
}

/// A TLS handshake that failed on the certificates (rustls reports those as invalid data):
/// trying again would fail the same way, so it is not reported as the server unavailable.
fn tls_refusal(e: &tokio_postgres::Error) -> Option<String> {
    let io = std::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
    (io.kind() == std::io::ErrorKind::InvalidData).then(|| format!("TLS refused: {io}"))
}

/// The error for a pooled connection that could not be had: nothing was sent.
pub(crate) fn from_pool(operation: &'static str, source: deadpool_postgres::PoolError) -> Error {
    if let deadpool_postgres::PoolError::Backend(e) = source {
        return from_pg(operation, Stage::Before, e);
    }
    Error::Unavailable {
        backend: BACKEND,
        operation,
        source: Box::new(source),
    }
}

/// The error for a request that ran past its deadline at `stage`.
pub(crate) fn timed_out(operation: &'static str, stage: Stage) -> Error {
    let source = format!("no answer within the request timeout ({operation})").into();
    match stage {
        Stage::Before => Error::Unavailable {
            backend: BACKEND,
            operation,
            source,
        },
        Stage::Commit => Error::Indeterminate {
            backend: BACKEND,
            operation,
            source,
        },
    }
}

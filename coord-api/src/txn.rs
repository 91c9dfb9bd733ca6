//! Transactions: [`TxnRequest`], its compares and operations, and what it returns.
//!
//! ```
//! use coord_api::{Compare, PutRequest, TxnRequest};
//! // Create the key only if it does not exist yet.
//! let create = TxnRequest::new()
//!     .when([Compare::version("locks/a", coord_api::CompareOp::Equal, 0)])
//!     .and_then([PutRequest::new("locks/a", "me")]);
//! # let _ = create;
//! ```

use bytes::Bytes;

use crate::into_bytes::IntoBytes;
use crate::request::{
    DeleteRequest, DeleteResponse, GetRequest, GetResponse, PutRequest, PutResponse,
};
use crate::types::{KeyValue, LeaseId, Revision};

/// How a [`Compare`] relates the stored field to the given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// stored == given
    Equal,
    /// stored != given
    NotEqual,
    /// stored > given
    Greater,
    /// stored < given
    Less,
}

/// Which field of a key a [`Compare`] looks at, and the value to compare it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// The value (bytewise). A missing key fails every value compare, even `NotEqual`, as in etcd.
    Value(Bytes),
    /// The version; a missing key has version 0.
    Version(i64),
    /// The create revision; a missing key has [`Revision::ZERO`].
    CreateRevision(Revision),
    /// The mod revision; a missing key has [`Revision::ZERO`].
    ModRevision(Revision),
    /// The attached lease; a missing or detached key has [`LeaseId::NONE`].
    Lease(LeaseId),
}

/// One condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compare {
    /// The key compared (with `prefix`: every key starting with it).
    pub key: Bytes,
    /// The relation.
    pub op: CompareOp,
    /// The field and the value it is compared with.
    pub target: CompareTarget,
    /// Compare every key under `key` as a prefix: the compare holds when it holds for each of
    /// them, and with no key under the prefix it is judged as on one missing key (so
    /// `create_revision(prefix) == 0` means "no key under the prefix").
    pub prefix: bool,
}

impl Compare {
    /// Compare `key`'s `target` field by `op` (the constructors below name the target).
    pub fn new(key: impl IntoBytes, op: CompareOp, target: CompareTarget) -> Self {
        Compare {
            key: key.into_bytes(),
            op,
            target,
            prefix: false,
        }
    }

    /// Applies the compare to every key with this prefix instead of one key.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Compare the key's value.
    pub fn value(key: impl IntoBytes, op: CompareOp, value: impl IntoBytes) -> Self {
        Self::new(key, op, CompareTarget::Value(value.into_bytes()))
    }

    /// Compare the key's version (0 when missing).
    pub fn version(key: impl IntoBytes, op: CompareOp, version: i64) -> Self {
        Self::new(key, op, CompareTarget::Version(version))
    }

    /// Compare the key's create revision (0 when missing).
    pub fn create_revision(
        key: impl IntoBytes,
        op: CompareOp,
        revision: impl Into<Revision>,
    ) -> Self {
        Self::new(key, op, CompareTarget::CreateRevision(revision.into()))
    }

    /// Compare the key's mod revision (0 when missing).
    pub fn mod_revision(key: impl IntoBytes, op: CompareOp, revision: impl Into<Revision>) -> Self {
        Self::new(key, op, CompareTarget::ModRevision(revision.into()))
    }

    /// Compare the key's lease ([`LeaseId::NONE`] when missing or detached).
    pub fn lease(key: impl IntoBytes, op: CompareOp, lease: LeaseId) -> Self {
        Self::new(key, op, CompareTarget::Lease(lease))
    }

    /// Whether one key passes this compare, as etcd judges it (`None`: the key does not
    /// exist). A value compare on a missing key fails whatever the operator; the other
    /// targets read a missing key as zero. For backends: a prefix compare passes when every
    /// key under the prefix passes, and no key at all is judged as `None`.
    ///
    /// ```
    /// use coord_api::{Compare, CompareOp};
    /// assert!(Compare::version("k", CompareOp::Equal, 0).matches(None));
    /// assert!(!Compare::value("k", CompareOp::NotEqual, "v").matches(None));
    /// ```
    pub fn matches(&self, kv: Option<&KeyValue>) -> bool {
        let ord = match (&self.target, kv) {
            // etcd: "nil == empty string in grpc; no way to represent missing value".
            (CompareTarget::Value(_), None) => return false,
            (CompareTarget::Value(v), Some(kv)) => kv.value.as_ref().cmp(v.as_ref()),
            (CompareTarget::Version(v), kv) => kv.map_or(0, |kv| kv.version).cmp(v),
            (CompareTarget::CreateRevision(r), kv) => {
                kv.map_or(Revision::ZERO, |kv| kv.create_revision).cmp(r)
            }
            (CompareTarget::ModRevision(r), kv) => {
                kv.map_or(Revision::ZERO, |kv| kv.mod_revision).cmp(r)
            }
            (CompareTarget::Lease(l), kv) => kv.map_or(LeaseId::NONE, |kv| kv.lease).cmp(l),
        };
        match self.op {
            CompareOp::Equal => ord.is_eq(),
            CompareOp::NotEqual => ord.is_ne(),
            CompareOp::Greater => ord.is_gt(),
            CompareOp::Less => ord.is_lt(),
        }
    }
}

/// One operation in a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// A read; it sees the writes made earlier in the same branch.
    Get(GetRequest),
    /// A write.
    Put(PutRequest),
    /// A delete.
    Delete(DeleteRequest),
}

impl From<GetRequest> for TxnOp {
    fn from(r: GetRequest) -> Self {
        TxnOp::Get(r)
    }
}

impl From<PutRequest> for TxnOp {
    fn from(r: PutRequest) -> Self {
        TxnOp::Put(r)
    }
}

impl From<DeleteRequest> for TxnOp {
    fn from(r: DeleteRequest) -> Self {
        TxnOp::Delete(r)
    }
}

/// An atomic if/then/else: when every compare holds, run `success`, else `failure`. All writes
/// of the branch that runs share one revision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TxnRequest {
    /// The conditions, all of which must hold.
    pub compares: Vec<Compare>,
    /// Run when every compare holds.
    pub success: Vec<TxnOp>,
    /// Run otherwise.
    pub failure: Vec<TxnOp>,
}

impl TxnRequest {
    /// An empty transaction (it succeeds and does nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the conditions.
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares = compares.into_iter().collect();
        self
    }

    /// Set the operations run when every condition holds.
    pub fn and_then<O: Into<TxnOp>>(mut self, ops: impl IntoIterator<Item = O>) -> Self {
        self.success = ops.into_iter().map(Into::into).collect();
        self
    }

    /// Set the operations run otherwise.
    pub fn or_else<O: Into<TxnOp>>(mut self, ops: impl IntoIterator<Item = O>) -> Self {
        self.failure = ops.into_iter().map(Into::into).collect();
        self
    }

    /// Whether either branch writes. A transaction that writes nothing is a read: safe to
    /// retry, and a lost reply leaves nothing unknown.
    pub fn writes(&self) -> bool {
        self.success
            .iter()
            .chain(&self.failure)
            .any(|op| !matches!(op, TxnOp::Get(_)))
    }
}

/// The response to one [`TxnOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResponse {
    /// From a [`TxnOp::Get`].
    Get(GetResponse),
    /// From a [`TxnOp::Put`].
    Put(PutResponse),
    /// From a [`TxnOp::Delete`].
    Delete(DeleteResponse),
}

impl TxnOpResponse {
    /// The get response, if this is one.
    pub fn as_get(&self) -> Option<&GetResponse> {
        match self {
            TxnOpResponse::Get(r) => Some(r),
            _ => None,
        }
    }
}

/// What a transaction returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TxnResponse {
    /// The store revision after the transaction (unchanged when it wrote nothing).
    pub revision: Revision,
    /// Whether every compare held (so `success` ran).
    pub succeeded: bool,
    /// One response per operation of the branch that ran, in order.
    pub responses: Vec<TxnOpResponse>,
}

impl TxnResponse {
    /// A transaction at `revision` whose compares held (`succeeded`) or not, with the
    /// responses of the branch that ran.
    pub fn new(revision: Revision, succeeded: bool, responses: Vec<TxnOpResponse>) -> Self {
        TxnResponse {
            revision,
            succeeded,
            responses,
        }
    }
}

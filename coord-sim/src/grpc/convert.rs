//! etcd's protobuf messages to coord's requests, coord's responses back, and coord's errors
//! as the gRPC statuses etcd sends (with etcd's messages, which clients match on).

use bytes::Bytes;
use coord_api::{
    Compare, CompareOp, CompareTarget, DeleteRequest, DeleteResponse, Error, Event, EventKind,
    GetRequest, GetResponse, KeyRange, KeyValue, LeaseId, PutRequest, PutResponse, Revision,
    SortOrder, SortTarget, TxnOp, TxnOpResponse, TxnRequest, TxnResponse,
};
use etcd_client::proto::{
    PbCompare, PbDeleteRequest, PbDeleteResponse, PbEvent, PbKeyValue, PbPutRequest, PbPutResponse,
    PbRangeRequest, PbRangeResponse, PbResponseHeader, PbResponseOp, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnResponse,
};
use tonic::Status;

/// A response header at `revision`, from the one member there is.
pub(crate) fn header(revision: Revision) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        cluster_id: 0x5151,
        member_id: 1,
        revision: revision.get(),
        raft_term: 1,
    })
}

/// A key and range end as coord's range: one key or a prefix.
pub(crate) fn range(key: Vec<u8>, range_end: Vec<u8>) -> Result<KeyRange, Status> {
    if range_end.is_empty() {
        return Ok(KeyRange::Key(Bytes::from(key)));
    }
    let prefix = KeyRange::Prefix(Bytes::from(key));
    if prefix.etcd_range_end() == range_end {
        Ok(prefix)
    } else {
        Err(Status::unimplemented(
            "coord-sim serves single keys and prefixes, not arbitrary ranges",
        ))
    }
}

fn positive(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

pub(crate) fn get(r: PbRangeRequest) -> Result<GetRequest, Status> {
    if r.keys_only || r.count_only {
        return Err(Status::unimplemented(
            "coord-sim does not serve keys-only or count-only ranges",
        ));
    }
    let target = match r.sort_target {
        0 => SortTarget::Key,
        1 => SortTarget::Version,
        2 => SortTarget::Create,
        3 => SortTarget::Mod,
        4 => SortTarget::Value,
        other => {
            return Err(Status::invalid_argument(format!(
                "unknown sort target {other}"
            )))
        }
    };
    // As etcd: a target other than the key with no order sorts ascending.
    let order = match (r.sort_order, target) {
        (0, SortTarget::Key) => None,
        (0 | 1, _) => Some(SortOrder::Ascend),
        (2, _) => Some(SortOrder::Descend),
        (other, _) => {
            return Err(Status::invalid_argument(format!(
                "unknown sort order {other}"
            )))
        }
    };
    let mut get = GetRequest::range(range(r.key, r.range_end)?);
    if let Some(revision) = positive(r.revision) {
        get = get.with_revision(revision);
    }
    if let Some(limit) = positive(r.limit) {
        get = get.with_limit(limit as u64);
    }
    if let Some(order) = order {
        get = get.with_sort(target, order);
    }
    // 0 is no bound; any other value (negative ones too) is one, as etcd reads them.
    let bound = |v: i64| (v != 0).then_some(Revision(v));
    if let Some(r) = bound(r.min_create_revision) {
        get = get.with_min_create_revision(r);
    }
    if let Some(r) = bound(r.max_create_revision) {
        get = get.with_max_create_revision(r);
    }
    if let Some(r) = bound(r.min_mod_revision) {
        get = get.with_min_mod_revision(r);
    }
    if let Some(r) = bound(r.max_mod_revision) {
        get = get.with_max_mod_revision(r);
    }
    Ok(get)
}

pub(crate) fn kv(kv: KeyValue) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.to_vec(),
        create_revision: kv.create_revision.get(),
        mod_revision: kv.mod_revision.get(),
        version: kv.version,
        value: kv.value.to_vec(),
        lease: kv.lease.0,
    }
}

pub(crate) fn get_response(r: GetResponse) -> PbRangeResponse {
    PbRangeResponse {
        header: header(r.revision),
        kvs: r.kvs.into_iter().map(kv).collect(),
        more: r.more,
        count: r.count as i64,
    }
}

pub(crate) fn put(r: PbPutRequest) -> Result<PutRequest, Status> {
    if r.ignore_value || r.ignore_lease {
        return Err(Status::unimplemented(
            "coord-sim does not serve ignore_value or ignore_lease",
        ));
    }
    let mut put = PutRequest::new(r.key, r.value);
    if r.lease != 0 {
        put = put.with_lease(LeaseId(r.lease));
    }
    if r.prev_kv {
        put = put.with_prev_kv();
    }
    Ok(put)
}

pub(crate) fn put_response(r: PutResponse) -> PbPutResponse {
    PbPutResponse {
        header: header(r.revision),
        prev_kv: r.prev_kv.map(kv),
    }
}

pub(crate) fn delete(r: PbDeleteRequest) -> Result<DeleteRequest, Status> {
    let delete = DeleteRequest::range(range(r.key, r.range_end)?);
    Ok(if r.prev_kv {
        delete.with_prev_kv()
    } else {
        delete
    })
}

pub(crate) fn delete_response(r: DeleteResponse) -> PbDeleteResponse {
    PbDeleteResponse {
        header: header(r.revision),
        deleted: r.deleted as i64,
        prev_kvs: r.prev_kvs.into_iter().map(kv).collect(),
    }
}

fn compare(c: PbCompare) -> Result<Compare, Status> {
    let op = match c.result {
        0 => CompareOp::Equal,
        1 => CompareOp::Greater,
        2 => CompareOp::Less,
        3 => CompareOp::NotEqual,
        other => {
            return Err(Status::invalid_argument(format!(
                "unknown compare result {other}"
            )))
        }
    };
    let target = match c.target_union {
        Some(PbTargetUnion::Version(v)) => CompareTarget::Version(v),
        Some(PbTargetUnion::CreateRevision(v)) => CompareTarget::CreateRevision(Revision(v)),
        Some(PbTargetUnion::ModRevision(v)) => CompareTarget::ModRevision(Revision(v)),
        Some(PbTargetUnion::Value(v)) => CompareTarget::Value(Bytes::from(v)),
        Some(PbTargetUnion::Lease(v)) => CompareTarget::Lease(LeaseId(v)),
        None => return Err(Status::invalid_argument("a compare without a target")),
    };
    let prefix = match range(c.key.clone(), c.range_end)? {
        KeyRange::Key(_) => false,
        KeyRange::Prefix(_) => true,
    };
    let compare = Compare::new(c.key, op, target);
    Ok(if prefix {
        compare.with_prefix()
    } else {
        compare
    })
}

fn op(o: etcd_client::proto::PbTxnRequestOp) -> Result<TxnOp, Status> {
    match o.request {
        Some(PbTxnOpRequest::RequestRange(r)) => Ok(TxnOp::Get(get(r)?)),
        Some(PbTxnOpRequest::RequestPut(r)) => Ok(TxnOp::Put(put(r)?)),
        Some(PbTxnOpRequest::RequestDeleteRange(r)) => Ok(TxnOp::Delete(delete(r)?)),
        Some(PbTxnOpRequest::RequestTxn(_)) => Err(Status::unimplemented(
            "coord-sim does not serve nested transactions",
        )),
        None => Err(Status::invalid_argument("an empty transaction operation")),
    }
}

/// Whether a transaction only reads: etcd serves it as a (linearizable) read, not through
/// raft as a proposal.
pub(crate) fn read_only(t: &PbTxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .all(|o| matches!(o.request, Some(PbTxnOpRequest::RequestRange(_))))
}

pub(crate) fn txn(t: PbTxnRequest) -> Result<TxnRequest, Status> {
    let compares: Vec<Compare> = t
        .compare
        .into_iter()
        .map(compare)
        .collect::<Result<_, _>>()?;
    let success: Vec<TxnOp> = t.success.into_iter().map(op).collect::<Result<_, _>>()?;
    let failure: Vec<TxnOp> = t.failure.into_iter().map(op).collect::<Result<_, _>>()?;
    Ok(TxnRequest::new()
        .when(compares)
        .and_then(success)
        .or_else(failure))
}

pub(crate) fn txn_response(r: TxnResponse) -> PbTxnResponse {
    PbTxnResponse {
        header: header(r.revision),
        succeeded: r.succeeded,
        responses: r
            .responses
            .into_iter()
            .map(|o| PbResponseOp {
                response: Some(match o {
                    TxnOpResponse::Get(g) => PbTxnOpResponse::ResponseRange(get_response(g)),
                    TxnOpResponse::Put(p) => PbTxnOpResponse::ResponsePut(put_response(p)),
                    TxnOpResponse::Delete(d) => {
                        PbTxnOpResponse::ResponseDeleteRange(delete_response(d))
                    }
                }),
            })
            .collect(),
    }
}

pub(crate) fn event(e: Event) -> PbEvent {
    PbEvent {
        r#type: match e.kind {
            EventKind::Put => 0,
            EventKind::Delete => 1,
        },
        kv: Some(kv(e.kv)),
        prev_kv: e.prev_kv.map(kv),
    }
}

/// The message etcd sends for a compacted revision (clients match on it).
pub(crate) const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// A coord error as the status etcd would answer with.
pub(crate) fn status(e: Error) -> Status {
    match e {
        Error::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
        Error::LeaseNotFound { .. } => Status::not_found("etcdserver: requested lease not found"),
        Error::Compacted { .. } => Status::out_of_range(COMPACTED),
        Error::FutureRevision { .. } => {
            Status::out_of_range("etcdserver: mvcc: required revision is a future revision")
        }
        Error::Indeterminate { .. } => Status::unavailable("etcdserver: request timed out"),
        Error::Unavailable { .. } | Error::StreamClosed { .. } => {
            Status::unavailable("etcdserver: no leader")
        }
        other => Status::internal(other.to_string()),
    }
}

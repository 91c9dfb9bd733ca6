//! coord's requests to etcd-client's, and etcd-client's responses to coord's.

use coord_api::{
    Bytes, CompareOp, CompareTarget, DeleteRequest, DeleteResponse, Event, EventKind, GetRequest,
    GetResponse, KeyRange, KeyValue, LeaseId, PutRequest, PutResponse, Revision, SortOrder,
    SortTarget, TxnOp, TxnOpResponse, TxnRequest, TxnResponse,
};
use etcd_client as ec;

fn range_end(range: &KeyRange) -> Option<Vec<u8>> {
    match range {
        KeyRange::Key(_) => None,
        KeyRange::Prefix(_) => Some(range.etcd_range_end()),
    }
}

pub(crate) fn get(req: &GetRequest) -> (Vec<u8>, ec::GetOptions) {
    let mut o = ec::GetOptions::new();
    if let Some(end) = range_end(&req.range) {
        o = o.with_range(end);
    }
    if let Some(rev) = req.revision {
        o = o.with_revision(rev.get());
    }
    if let Some(limit) = req.limit {
        o = o.with_limit(limit.min(i64::MAX as u64) as i64);
    }
    if let Some((target, order)) = req.sort {
        let target = match target {
            SortTarget::Version => ec::SortTarget::Version,
            SortTarget::Create => ec::SortTarget::Create,
            SortTarget::Mod => ec::SortTarget::Mod,
            SortTarget::Value => ec::SortTarget::Value,
            _ => ec::SortTarget::Key,
        };
        let order = match order {
            SortOrder::Ascend => ec::SortOrder::Ascend,
            SortOrder::Descend => ec::SortOrder::Descend,
        };
        o = o.with_sort(target, order);
    }
    // etcd reads 0 as "no bound"; a bound of 0 or below keeps every key anyway.
    if let Some(r) = req.min_create_revision {
        o = o.with_min_create_revision(r.get());
    }
    if let Some(r) = req.max_create_revision {
        o = o.with_max_create_revision(r.get());
    }
    if let Some(r) = req.min_mod_revision {
        o = o.with_min_mod_revision(r.get());
    }
    if let Some(r) = req.max_mod_revision {
        o = o.with_max_mod_revision(r.get());
    }
    (req.range.start().to_vec(), o)
}

pub(crate) fn kv(kv: &ec::KeyValue) -> KeyValue {
    KeyValue {
        key: Bytes::copy_from_slice(kv.key()),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: Revision(kv.create_revision()),
        mod_revision: Revision(kv.mod_revision()),
        version: kv.version(),
        lease: LeaseId(kv.lease()),
    }
}

fn header_revision(h: Option<&ec::ResponseHeader>) -> Revision {
    Revision(h.map_or(0, |h| h.revision()))
}

pub(crate) fn get_response(r: ec::GetResponse) -> GetResponse {
    GetResponse::new(
        header_revision(r.header()),
        r.kvs().iter().map(kv).collect(),
    )
    .with_count(r.count().max(0) as u64, r.more())
}

pub(crate) fn put_options(req: &PutRequest) -> ec::PutOptions {
    let mut o = ec::PutOptions::new();
    if let Some(lease) = req.lease {
        o = o.with_lease(lease.0);
    }
    if req.prev_kv {
        o = o.with_prev_key();
    }
    o
}

pub(crate) fn put_response(r: ec::PutResponse) -> PutResponse {
    PutResponse::new(header_revision(r.header()), r.prev_key().map(kv))
}

pub(crate) fn delete(req: &DeleteRequest) -> (Vec<u8>, ec::DeleteOptions) {
    let mut o = ec::DeleteOptions::new();
    if let Some(end) = range_end(&req.range) {
        o = o.with_range(end);
    }
    if req.prev_kv {
        o = o.with_prev_key();
    }
    (req.range.start().to_vec(), o)
}

pub(crate) fn delete_response(r: ec::DeleteResponse) -> DeleteResponse {
    DeleteResponse::new(
        header_revision(r.header()),
        r.deleted().max(0) as u64,
        r.prev_kvs().iter().map(kv).collect(),
    )
}

fn compare(c: &coord_api::Compare) -> ec::Compare {
    let op = match c.op {
        CompareOp::Equal => ec::CompareOp::Equal,
        CompareOp::NotEqual => ec::CompareOp::NotEqual,
        CompareOp::Greater => ec::CompareOp::Greater,
        CompareOp::Less => ec::CompareOp::Less,
    };
    let key = c.key.to_vec();
    let cmp = match &c.target {
        CompareTarget::Value(v) => ec::Compare::value(key, op, v.to_vec()),
        CompareTarget::Version(v) => ec::Compare::version(key, op, *v),
        CompareTarget::CreateRevision(r) => ec::Compare::create_revision(key, op, r.get()),
        CompareTarget::ModRevision(r) => ec::Compare::mod_revision(key, op, r.get()),
        CompareTarget::Lease(l) => ec::Compare::lease(key, op, l.0),
    };
    if c.prefix {
        cmp.with_range(KeyRange::Prefix(c.key.clone()).etcd_range_end())
    } else {
        cmp
    }
}

fn op(op: &TxnOp) -> ec::TxnOp {
    match op {
        TxnOp::Get(g) => {
            let (key, o) = get(g);
            ec::TxnOp::get(key, Some(o))
        }
        TxnOp::Put(p) => ec::TxnOp::put(p.key.to_vec(), p.value.to_vec(), Some(put_options(p))),
        TxnOp::Delete(d) => {
            let (key, o) = delete(d);
            ec::TxnOp::delete(key, Some(o))
        }
    }
}

pub(crate) fn txn(req: &TxnRequest) -> ec::Txn {
    // etcd-client asserts each of these is called once, in this order.
    ec::Txn::new()
        .when(req.compares.iter().map(compare).collect::<Vec<_>>())
        .and_then(req.success.iter().map(op).collect::<Vec<_>>())
        .or_else(req.failure.iter().map(op).collect::<Vec<_>>())
}

pub(crate) fn txn_response(r: ec::TxnResponse) -> TxnResponse {
    let responses = r
        .op_responses()
        .into_iter()
        .filter_map(|o| match o {
            ec::TxnOpResponse::Get(g) => Some(TxnOpResponse::Get(get_response(g))),
            ec::TxnOpResponse::Put(p) => Some(TxnOpResponse::Put(put_response(p))),
            ec::TxnOpResponse::Delete(d) => Some(TxnOpResponse::Delete(delete_response(d))),
            // coord never sends nested transactions.
            ec::TxnOpResponse::Txn(_) => None,
        })
        .collect();
    TxnResponse::new(header_revision(r.header()), r.succeeded(), responses)
}

pub(crate) fn event(e: &ec::Event) -> Option<Event> {
    let kind = match e.event_type() {
        ec::EventType::Put => EventKind::Put,
        ec::EventType::Delete => EventKind::Delete,
    };
    Some(Event {
        kind,
        kv: kv(e.kv()?),
        prev_kv: e.prev_kv().map(kv),
    })
}

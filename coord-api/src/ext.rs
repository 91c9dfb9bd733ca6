//! [`KvLeaseStoreExt`]: conveniences over the contract for the common single-key cases,
//! written once on its methods.

use std::future::Future;

use crate::error::Result;
use crate::into_bytes::IntoBytes;
use crate::request::{DeleteRequest, GetRequest, GetResponse, PutRequest};
use crate::store::KvLeaseStore;
use crate::types::{KeyValue, Revision};

/// Conveniences over [`KvLeaseStore`] for the common single-key cases. Implemented for every
/// store; you MUST NOT implement it yourself.
///
/// A convenience adds no future of its own to the heap: it returns the store's call, mapped
/// (the trait's generic methods make it unusable as `dyn` anyway).
pub trait KvLeaseStoreExt: KvLeaseStore {
    /// Reads one key: `None` when it does not exist.
    fn get_key(
        &self,
        key: impl IntoBytes + Send,
    ) -> impl Future<Output = Result<Option<KeyValue>>> + Send {
        let read = self.get(GetRequest::key(key));
        async move { Ok(read.await?.kvs.into_iter().next()) }
    }

    /// Reads every key with a prefix.
    fn get_prefix(
        &self,
        prefix: impl IntoBytes + Send,
    ) -> impl Future<Output = Result<GetResponse>> + Send {
        self.get(GetRequest::prefix(prefix))
    }

    /// Writes one key without a lease; returns the write's revision.
    fn put_value(
        &self,
        key: impl IntoBytes + Send,
        value: impl IntoBytes + Send,
    ) -> impl Future<Output = Result<Revision>> + Send {
        let write = self.put(PutRequest::new(key, value));
        async move { Ok(write.await?.revision) }
    }

    /// Deletes one key; returns how many keys were deleted (0 or 1).
    fn delete_key(&self, key: impl IntoBytes + Send) -> impl Future<Output = Result<u64>> + Send {
        let delete = self.delete(DeleteRequest::key(key));
        async move { Ok(delete.await?.deleted) }
    }

    /// The store's current revision.
    fn current_revision(&self) -> impl Future<Output = Result<Revision>> + Send {
        // Any read reports the current revision; a one-byte key that nobody is expected to
        // use keeps the response empty.
        let read = self.get(GetRequest::key(vec![0u8]));
        async move { Ok(read.await?.revision) }
    }
}

impl<T: KvLeaseStore + ?Sized> KvLeaseStoreExt for T {}

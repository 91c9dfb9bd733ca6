//! [`KvLeaseStoreExt`]: conveniences over the contract for the common single-key cases,
//! written once on its methods.

use async_trait::async_trait;

use crate::error::Result;
use crate::into_bytes::IntoBytes;
use crate::request::{DeleteRequest, GetRequest, GetResponse, PutRequest};
use crate::store::KvLeaseStore;
use crate::types::{KeyValue, Revision};

/// Conveniences over [`KvLeaseStore`] for the common single-key cases. Implemented for every
/// store; you MUST NOT implement it yourself.
#[async_trait]
pub trait KvLeaseStoreExt: KvLeaseStore {
    /// Reads one key: `None` when it does not exist.
    async fn get_key(&self, key: impl IntoBytes + Send) -> Result<Option<KeyValue>> {
        Ok(self.get(GetRequest::key(key)).await?.kvs.into_iter().next())
    }

    /// Reads every key with a prefix.
    async fn get_prefix(&self, prefix: impl IntoBytes + Send) -> Result<GetResponse> {
        self.get(GetRequest::prefix(prefix)).await
    }

    /// Writes one key without a lease; returns the write's revision.
    async fn put_value(
        &self,
        key: impl IntoBytes + Send,
        value: impl IntoBytes + Send,
    ) -> Result<Revision> {
        Ok(self.put(PutRequest::new(key, value)).await?.revision)
    }

    /// Deletes one key; returns how many keys were deleted (0 or 1).
    async fn delete_key(&self, key: impl IntoBytes + Send) -> Result<u64> {
        Ok(self.delete(DeleteRequest::key(key)).await?.deleted)
    }

    /// The store's current revision.
    async fn current_revision(&self) -> Result<Revision> {
        // Any read reports the current revision; a one-byte key that nobody is expected to
        // use keeps the response empty.
        Ok(self.get(GetRequest::key(vec![0u8])).await?.revision)
    }
}

impl<T: KvLeaseStore + ?Sized> KvLeaseStoreExt for T {}

//! The two ways the log writes a key: in a sled transaction, or straight to a tree.

use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use sled::IVec;

/// Reads and writes of single keys, in a transaction or not.
pub(super) trait KeyWrites {
    type Error;
    fn fetch(&self, key: &[u8]) -> Result<Option<IVec>, Self::Error>;
    fn put(&self, key: &[u8], value: Vec<u8>) -> Result<(), Self::Error>;
}

impl KeyWrites for TransactionalTree {
    type Error = UnabortableTransactionError;
    fn fetch(&self, key: &[u8]) -> Result<Option<IVec>, Self::Error> {
        self.get(key)
    }
    fn put(&self, key: &[u8], value: Vec<u8>) -> Result<(), Self::Error> {
        self.insert(key, value).map(|_| ())
    }
}

impl KeyWrites for sled::Tree {
    type Error = sled::Error;
    fn fetch(&self, key: &[u8]) -> Result<Option<IVec>, Self::Error> {
        self.get(key)
    }
    fn put(&self, key: &[u8], value: Vec<u8>) -> Result<(), Self::Error> {
        self.insert(key, value).map(|_| ())
    }
}

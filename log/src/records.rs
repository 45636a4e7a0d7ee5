//! The records, [`PER_CHUNK`] to a key: the `record_chunks` tree maps a chunk number
//! (`seq / PER_CHUNK`, big-endian) to the sealed records of those seqs, in seq order,
//! each as `[seq: u64 BE][length: u32 BE][sealed record]`.
//!
//! Why not a key per record: sled reads its whole page table when it opens, and a leaf
//! page holds about 8 keys, so opening cost grows with the number of keys — ~150 ms at
//! a million records with a key each for the records and their index entries
//! (docs/benchmarks.md). Eight records a key, and posting lists for the indexes (see
//! [`super::postings`]), cut the keys about tenfold.
//!
//! An append rewrites the chunk it adds to (the chunk is small: at most
//! [`PER_CHUNK`] records), a plain write (see [`super::tip`]). A prune removes whole
//! chunks and rewrites the one it cuts through while holding the log's tail, so it
//! never loses an append racing it.

use super::codec::{self, Hash};
use super::{Corruption, Defect, LogError, ScanError};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::IVec;
use std::convert::Infallible;

/// The records' tree.
pub const TREE: &str = "record_chunks";
/// Records a key.
pub(super) const PER_CHUNK: u64 = 8;
/// `[seq][length]` in front of each sealed record.
const HEADER: usize = 12;

pub(super) fn chunk_key(seq: u64) -> [u8; 8] {
    (seq / PER_CHUNK).to_be_bytes()
}

/// The entries of one chunk, in order: each record's seq and sealed bytes, or the
/// first malformed entry (as the seq after the last good one, `Truncated`).
fn entries(
    chunk_no: u64,
    value: &IVec,
) -> impl Iterator<Item = Result<(u64, IVec), Corruption>> + '_ {
    let (mut at, mut next_seq, mut failed) = (0usize, chunk_no.saturating_mul(PER_CHUNK), false);
    std::iter::from_fn(move || {
        if failed || at == value.len() {
            return None;
        }
        let bad = Corruption {
            seq: next_seq,
            defect: Defect::Truncated,
        };
        let entry = value.get(at..at + HEADER).and_then(|header| {
            let seq = u64::from_be_bytes(header[..8].try_into().ok()?);
            let len = u32::from_be_bytes(header[8..].try_into().ok()?) as usize;
            let end = (at + HEADER).checked_add(len)?;
            (end <= value.len()).then_some((seq, at + HEADER, len, end))
        });
        match entry {
            Some((seq, start, len, end)) => {
                at = end;
                next_seq = seq.saturating_add(1);
                Some(Ok((seq, value.subslice(start, len))))
            }
            None => {
                failed = true;
                Some(Err(bad))
            }
        }
    })
}

/// A transaction's error, when it never aborts.
pub(super) fn storage(e: TransactionError<Infallible>) -> LogError {
    match e {
        TransactionError::Storage(e) => LogError::Storage(e),
        TransactionError::Abort(never) => match never {},
    }
}

pub(super) fn entry(seq: u64, sealed: &[u8]) -> Vec<u8> {
    let mut e = Vec::with_capacity(HEADER + sealed.len());
    e.extend_from_slice(&seq.to_be_bytes());
    e.extend_from_slice(&(sealed.len() as u32).to_be_bytes());
    e.extend_from_slice(sealed);
    e
}

/// The chunk without the records `skip` names, re-encoded.
fn rewrite(chunk_no: u64, value: &IVec, skip: impl Fn(u64) -> bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for (seq, sealed) in entries(chunk_no, value).map_while(Result::ok) {
        if !skip(seq) {
            out.extend_from_slice(&entry(seq, &sealed));
        }
    }
    out
}

/// The records of one log.
#[derive(Clone)]
pub(super) struct Records {
    tree: sled::Tree,
}

impl Records {
    pub fn new(tree: sled::Tree) -> Records {
        Records { tree }
    }

    /// The sled tree, for transactions over it and the indexes.
    pub fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// Adds records (consecutive seqs, in order, each with its sealed bytes) to their
    /// chunks (an append's writes): one read and one write a chunk, however many of
    /// the records it takes.
    pub fn push<T: super::key_writes::KeyWrites>(
        tx: &T,
        records: &[(u64, &[u8])],
    ) -> Result<(), T::Error> {
        for same_chunk in records.chunk_by(|a, b| chunk_key(a.0) == chunk_key(b.0)) {
            let key = chunk_key(same_chunk[0].0);
            let mut chunk = tx.fetch(&key)?.map(|v| v.to_vec()).unwrap_or_default();
            for (seq, sealed) in same_chunk {
                chunk.extend_from_slice(&entry(*seq, sealed));
            }
            tx.put(&key, chunk)?;
        }
        Ok(())
    }

    /// The sealed bytes of record `seq`, if the log has it.
    pub fn get(&self, seq: u64) -> Result<Option<IVec>, LogError> {
        let Some(chunk) = self.tree.get(chunk_key(seq)).map_err(LogError::Storage)? else {
            return Ok(None);
        };
        for item in entries(seq / PER_CHUNK, &chunk) {
            let (at, sealed) = item.map_err(LogError::Corrupt)?;
            if at == seq {
                return Ok(Some(sealed));
            }
        }
        Ok(None)
    }

    /// The hash of record `seq`, when the log has it intact (what a snapshot is
    /// anchored to).
    pub fn hash_of(&self, seq: u64) -> Result<Option<Hash>, sled::Error> {
        match self.get(seq) {
            Ok(sealed) => Ok(sealed.and_then(|s| codec::unseal(seq, &s).ok().map(|(_, h)| h))),
            Err(LogError::Storage(e)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// The records from `from` on, in seq order, as stored (sealed, not yet checked).
    pub fn range(&self, from: u64) -> impl Iterator<Item = Result<(u64, IVec), ScanError>> + '_ {
        self.tree
            .range(chunk_key(from)..)
            .flat_map(move |item| {
                let chunk: Box<dyn Iterator<Item = _>> = match item {
                    Ok((key, value)) => {
                        let chunk_no = super::key_seq(&key).unwrap_or(0);
                        let all: Vec<_> = entries(chunk_no, &value).collect();
                        Box::new(all.into_iter().map(|e| e.map_err(ScanError::Corrupt)))
                    }
                    Err(e) => Box::new(std::iter::once(Err(ScanError::Storage(e)))),
                };
                chunk
            })
            .filter(move |item| !matches!(item, Ok((seq, _)) if *seq < from))
    }

    /// Removes every record up to and including `seq`: whole chunks in one batch, the
    /// chunk it cuts through rewritten in a transaction (an append may be adding to it).
    pub fn remove_through(&self, seq: u64) -> Result<(), LogError> {
        let cut = seq / PER_CHUNK;
        let mut whole = sled::Batch::default();
        for key in self.tree.range(..chunk_key(cut * PER_CHUNK)).keys() {
            whole.remove(key.map_err(LogError::Storage)?);
        }
        self.tree.apply_batch(whole).map_err(LogError::Storage)?;
        self.tree
            .transaction(|tx| {
                let key = chunk_key(seq);
                if let Some(chunk) = tx.get(key)? {
                    let kept = rewrite(cut, &chunk, |s| s <= seq);
                    if kept.is_empty() {
                        tx.remove(&key)?;
                    } else if kept.len() != chunk.len() {
                        tx.insert(&key, kept)?;
                    }
                }
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            })
            .map_err(storage)
    }

    /// Removes every record after `seq` (what a crash left of an append cut short:
    /// see [`super::tip`]).
    pub fn remove_after(&self, seq: u64) -> Result<(), LogError> {
        let from = seq.saturating_add(1);
        let first = chunk_key(from);
        for item in self.tree.range(first..) {
            let (key, value) = item.map_err(LogError::Storage)?;
            let chunk_no = super::key_seq(&key).unwrap_or(0);
            let kept = rewrite(chunk_no, &value, |s| s > seq);
            if kept.is_empty() {
                self.tree.remove(key).map_err(LogError::Storage)?;
            } else if kept.len() != value.len() {
                self.tree.insert(key, kept).map_err(LogError::Storage)?;
            }
        }
        Ok(())
    }

    /// Test and fixture support: stores `sealed` as record `seq`, in place of the one
    /// there (or added at the end of its chunk), bypassing the chain.
    #[cfg(any(test, feature = "testing"))]
    pub fn put_raw(&self, seq: u64, sealed: &[u8]) -> Result<(), LogError> {
        let key = chunk_key(seq);
        let old = self.tree.get(key).map_err(LogError::Storage)?;
        let mut chunk = match &old {
            Some(v) => rewrite(seq / PER_CHUNK, v, |s| s >= seq),
            None => Vec::new(),
        };
        chunk.extend_from_slice(&entry(seq, sealed));
        if let Some(v) = &old {
            let later: Vec<u8> = entries(seq / PER_CHUNK, v)
                .map_while(Result::ok)
                .filter(|(s, _)| *s > seq)
                .flat_map(|(s, b)| entry(s, &b))
                .collect();
            chunk.extend_from_slice(&later);
        }
        self.tree.insert(key, chunk).map_err(LogError::Storage)?;
        Ok(())
    }

    /// Test support: drops record `seq` alone, bypassing the chain.
    #[cfg(test)]
    pub fn remove_raw(&self, seq: u64) -> Result<(), LogError> {
        let key = chunk_key(seq);
        if let Some(v) = self.tree.get(key).map_err(LogError::Storage)? {
            let kept = rewrite(seq / PER_CHUNK, &v, |s| s == seq);
            self.tree.insert(key, kept).map_err(LogError::Storage)?;
        }
        Ok(())
    }
}

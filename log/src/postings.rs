//! Posting lists: how the index trees hold, for each key (a command id, a workload, a
//! minute), the entries of its records — fixed-width, in append order — [`BLOCK`] to
//! a sled key rather than one key each (why: [`super::records`]).
//!
//! Layout for a key `k`: the head `k \0` holds `[full blocks: u32 BE]` and then the
//! newest entries, fewer than [`BLOCK`]; when it fills, its entries move to the block
//! `k \0 n` (`n`: u32 BE, 0 for the first) and it starts again empty. The head sorts
//! before its blocks, which sort in order. Keys never contain `\0`: command ids and
//! workload names are checked before they reach the log, and minutes are 8 bytes.
//!
//! Pushes are an append's plain writes (a block before the head that counts it: see
//! [`super::tip`]). A prune drops the entries it removed: whole blocks in a batch (a
//! full block never changes), the head in a transaction, while holding the log's tail
//! so that no append pushes to it meanwhile.

use super::records::storage;
use super::LogError;
use sled::transaction::ConflictableTransactionError;
use std::convert::Infallible;

/// Entries a sled key.
pub(super) const BLOCK: usize = 64;

fn head_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 5);
    k.extend_from_slice(key);
    k.push(0);
    k
}

pub(super) fn block_key(key: &[u8], n: u32) -> Vec<u8> {
    let mut k = head_key(key);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn blocks_of(head: &[u8]) -> u32 {
    head.get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

/// Adds `entries` (concatenated, each `width` bytes, in order) to the list of `key`
/// (an append's writes): one read of its head, a write of each block the entries fill
/// (before the head that counts it), then one write of the head, however many entries.
pub(super) fn push<T: super::key_writes::KeyWrites>(
    tx: &T,
    key: &[u8],
    entries: &[u8],
    width: usize,
) -> Result<(), T::Error> {
    let head = head_key(key);
    let mut value = tx
        .fetch(&head)?
        .map(|v| v.to_vec())
        .unwrap_or_else(|| vec![0; 4]);
    for entry in entries.chunks_exact(width) {
        value.extend_from_slice(entry);
        if (value.len() - 4) / width >= BLOCK {
            let n = blocks_of(&value);
            tx.put(&block_key(key, n), value[4..].to_vec())?;
            value = (n + 1).to_be_bytes().to_vec();
        }
    }
    tx.put(&head, value)?;
    Ok(())
}

/// One append's entries for one index, by list key, each list's in append order: so
/// that [`push`] reads and writes each list once.
pub(super) struct Entries<'a> {
    width: usize,
    lists: std::collections::BTreeMap<&'a [u8], Vec<u8>>,
}

impl<'a> Entries<'a> {
    /// Entries of `width` bytes each.
    pub fn new(width: usize) -> Entries<'a> {
        Entries {
            width,
            lists: std::collections::BTreeMap::new(),
        }
    }

    pub fn add(&mut self, key: &'a [u8], entry: &[u8]) {
        debug_assert_eq!(entry.len(), self.width);
        self.lists.entry(key).or_default().extend_from_slice(entry);
    }

    /// Pushes every list's entries to `tx`.
    pub fn push<T: super::key_writes::KeyWrites>(&self, tx: &T) -> Result<(), T::Error> {
        for (key, entries) in &self.lists {
            push(tx, key, entries, self.width)?;
        }
        Ok(())
    }
}

/// Every entry of `key`'s list (each `width` bytes), oldest first, concatenated.
pub(super) fn read(tree: &sled::Tree, key: &[u8]) -> Result<Vec<u8>, LogError> {
    let prefix = head_key(key);
    let mut head = Vec::new();
    let mut out = Vec::new();
    for item in tree.scan_prefix(&prefix) {
        let (k, v) = item.map_err(LogError::Storage)?;
        match k.len() - prefix.len() {
            0 => head = v.get(4..).unwrap_or_default().to_vec(),
            4 => out.extend_from_slice(&v),
            // Another key that shares this prefix (not one of ours).
            _ => {}
        }
    }
    out.extend_from_slice(&head);
    Ok(out)
}

/// A list's key and its entries, concatenated, oldest first.
pub(super) type List = (Vec<u8>, Vec<u8>);

/// Every list whose key is in `from..until` (keys of `key_len` bytes).
pub(super) fn read_range(
    tree: &sled::Tree,
    key_len: usize,
    from: &[u8],
    until: &[u8],
) -> Result<Vec<List>, LogError> {
    let mut out: Vec<List> = Vec::new();
    let mut head = Vec::new();
    for item in tree.range(from..until) {
        let (k, v) = item.map_err(LogError::Storage)?;
        if k.len() < key_len + 1 || k[key_len] != 0 {
            continue;
        }
        let key = &k[..key_len];
        if out.last().map(|(last, _)| last.as_slice()) != Some(key) {
            if let Some((_, entries)) = out.last_mut() {
                entries.append(&mut head);
            }
            out.push((key.to_vec(), Vec::new()));
        }
        match k.len() - key_len - 1 {
            0 => head = v.get(4..).unwrap_or_default().to_vec(),
            4 => out
                .last_mut()
                .expect("pushed above")
                .1
                .extend_from_slice(&v),
            _ => {}
        }
    }
    if let Some((_, entries)) = out.last_mut() {
        entries.append(&mut head);
    }
    Ok(out)
}

/// The seq an entry starts with (BE).
fn seq_of(entry: &[u8]) -> u64 {
    u64::from_be_bytes(entry[..8].try_into().expect("entries start with a seq"))
}

/// The entries of `value` (each `width` bytes) whose seq `keep` accepts, concatenated.
fn kept(value: &[u8], width: usize, keep: impl Fn(u64) -> bool) -> Vec<u8> {
    value
        .chunks_exact(width)
        .filter(|e| keep(seq_of(e)))
        .flatten()
        .copied()
        .collect()
}

/// Drops from `key`'s list every entry of a record up to `through` (entries are
/// `width` bytes, each starting with its seq). Entries are in seq order, so the scan
/// stops at the first block that starts after `through`: a prune costs the blocks it
/// cuts, not the list's whole history.
pub(super) fn remove(
    tree: &sled::Tree,
    key: &[u8],
    width: usize,
    through: u64,
) -> Result<(), LogError> {
    let newer = |seq: u64| seq > through;
    let prefix = head_key(key);
    let mut batch = sled::Batch::default();
    let mut head_is_newer = false;
    for item in tree.scan_prefix(&prefix) {
        let (k, v) = item.map_err(LogError::Storage)?;
        if k.len() != prefix.len() + 4 {
            continue;
        }
        if v.get(..width).is_some_and(|first| newer(seq_of(first))) {
            // This block and everything after it (later blocks, the head) is newer.
            head_is_newer = true;
            break;
        }
        let left = kept(&v, width, newer);
        if left.is_empty() {
            batch.remove(k);
        } else if left.len() != v.len() {
            batch.insert(k, left);
        }
    }
    tree.apply_batch(batch).map_err(LogError::Storage)?;
    if head_is_newer {
        return Ok(());
    }
    tree.transaction(|tx| {
        let Some(head) = tx.get(&prefix)? else {
            return Ok(());
        };
        let n = blocks_of(&head);
        let left = kept(head.get(4..).unwrap_or_default(), width, newer);
        // An empty head goes when no block is left either (the newest goes last).
        if left.is_empty() && (n == 0 || tx.get(block_key(key, n - 1))?.is_none()) {
            tx.remove(prefix.as_slice())?;
        } else if left.len() + 4 != head.len() {
            let mut value = n.to_be_bytes().to_vec();
            value.extend_from_slice(&left);
            tx.insert(prefix.as_slice(), value)?;
        }
        Ok::<_, ConflictableTransactionError<Infallible>>(())
    })
    .map_err(storage)
}

/// Drops from `key`'s list every entry whose seq (its first 8 bytes) is after `tip`:
/// what a crash left of an append cut short ([`super::tip`]). Those entries are the
/// newest, in the head or, when the append filled the head, in the blocks it wrote;
/// a block the head does not count yet (written just before a head the crash lost)
/// goes too.
pub(super) fn truncate(
    tree: &sled::Tree,
    key: &[u8],
    width: usize,
    tip: u64,
) -> Result<(), LogError> {
    let recorded = |seq: u64| seq <= tip;
    let head = head_key(key);
    let Some(value) = tree.get(&head).map_err(LogError::Storage)? else {
        return Ok(());
    };
    let mut n = blocks_of(&value);
    // Blocks past the head's count: written by the cut append before its head.
    for item in tree.range(block_key(key, n)..block_key(key, u32::MAX)) {
        let (k, _) = item.map_err(LogError::Storage)?;
        tree.remove(k).map_err(LogError::Storage)?;
    }
    let mut entries = kept(value.get(4..).unwrap_or_default(), width, recorded);
    // An empty head: the cut append may have filled it into blocks.
    while entries.is_empty() && n > 0 {
        let block = block_key(key, n - 1);
        let Some(full) = tree.get(&block).map_err(LogError::Storage)? else {
            break;
        };
        let left = kept(&full, width, recorded);
        if left.len() == full.len() {
            break;
        }
        tree.remove(&block).map_err(LogError::Storage)?;
        n -= 1;
        entries = left;
    }
    if n == 0 && entries.is_empty() {
        tree.remove(&head).map_err(LogError::Storage)?;
    } else {
        let mut value = n.to_be_bytes().to_vec();
        value.extend_from_slice(&entries);
        tree.insert(&head, value).map_err(LogError::Storage)?;
    }
    Ok(())
}

/// Builds posting lists in memory for a bulk write (converting a log), in about the
/// order appends would have written them: full blocks go out as they fill, and a
/// list's head once the list has been idle for a while (and again if it grows after),
/// the rest at the end. Why not every head at the end: hundreds of thousands of
/// inserts all over the tree after everything else leave sled with segments of
/// garbage that nothing writes over, and sled rewrites every free segment on each
/// open (docs/benchmarks.md).
#[derive(Default)]
pub(super) struct Builder {
    heads: std::collections::HashMap<Vec<u8>, Head>,
    batch: sled::Batch,
}

#[derive(Default)]
struct Head {
    blocks: u32,
    entries: Vec<u8>,
    /// The push (a running count) that last changed it.
    last: u64,
    /// Changed since it was last written.
    dirty: bool,
}

impl Head {
    fn value(&self) -> Vec<u8> {
        let mut value = self.blocks.to_be_bytes().to_vec();
        value.extend_from_slice(&self.entries);
        value
    }
}

impl Builder {
    /// Adds `entry` to `key`'s list; `at` counts the pushes (a record's seq).
    pub fn push(&mut self, key: &[u8], entry: &[u8], at: u64) {
        let head = self.heads.entry(key.to_vec()).or_default();
        head.entries.extend_from_slice(entry);
        head.last = at;
        head.dirty = true;
        if head.entries.len() / entry.len() >= BLOCK {
            self.batch.insert(
                block_key(key, head.blocks),
                std::mem::take(&mut head.entries),
            );
            head.blocks += 1;
        }
    }

    /// The full blocks so far, and the heads last changed before `idle_before`.
    pub fn take(&mut self, idle_before: u64) -> sled::Batch {
        for (key, head) in &mut self.heads {
            if head.dirty && head.last < idle_before {
                self.batch.insert(head_key(key), head.value());
                head.dirty = false;
            }
        }
        std::mem::take(&mut self.batch)
    }

    /// The remaining blocks and every head not written yet.
    pub fn finish(mut self) -> sled::Batch {
        self.take(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(from: u64, to: u64) -> Vec<u8> {
        (from..=to).flat_map(u64::to_be_bytes).collect()
    }

    #[test]
    fn a_prune_cuts_the_old_blocks_and_stops_at_the_first_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
        // Seqs 1..=200: blocks 0..=2 (1–64, 65–128, 129–192), the head 193–200.
        push(&tree, b"k", &seqs(1, 200), 8).unwrap();
        // A block past the head's count, of entries the prune would cut if it read
        // it: only a scan past the first newer block (block 2, from 129) reaches it.
        let planted = seqs(1, 2);
        tree.insert(block_key(b"k", 9), planted.clone()).unwrap();
        remove(&tree, b"k", 8, 70).unwrap();
        assert!(tree.get(block_key(b"k", 0)).unwrap().is_none());
        assert_eq!(
            tree.get(block_key(b"k", 1)).unwrap().unwrap(),
            seqs(71, 128)
        );
        assert_eq!(
            tree.get(block_key(b"k", 2)).unwrap().unwrap(),
            seqs(129, 192)
        );
        assert_eq!(tree.get(block_key(b"k", 9)).unwrap().unwrap(), planted);
        tree.remove(block_key(b"k", 9)).unwrap();
        assert_eq!(read(&tree, b"k").unwrap(), seqs(71, 200));
        // A second prune starts at block 1 and stops at block 2.
        remove(&tree, b"k", 8, 150).unwrap();
        assert_eq!(read(&tree, b"k").unwrap(), seqs(151, 200));
        // Through everything: the list is gone.
        remove(&tree, b"k", 8, 200).unwrap();
        assert!(read(&tree, b"k").unwrap().is_empty());
        assert_eq!(tree.len(), 0);
    }
}

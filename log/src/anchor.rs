//! The anchor: what the log keeps of the records retention pruned (see
//! [`super::retention`]). Stored in the tree `anchor` under one key, sealed like
//! records (`[version][JSON body][SHA-256]`, see [`super::codec`]):
//!
//! - `seq`, `hash`: the last pruned record and its hash — the next record's
//!   `prev_hash`, so the chain is verified from here on;
//! - `pruned`: how many records were pruned in all (seqs `1..=seq`);
//! - `file`: the export file that holds the last pruned batch (the earlier ones sit
//!   beside it, named by their seq range);
//! - `intent`: the fold of records `1..=seq` (its JSON), so opening and verification
//!   start here.
//!
//! The anchor is written (and flushed) before any record it covers is removed, so
//! a crash in between leaves records at or below the anchor, which everything
//! ignores and the next prune removes.

use super::codec::{self, Hash};
use super::{Corruption, Defect, LogError};
use capstan_common::answers::AnchorSummary;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::PathBuf;

/// The anchor format this build writes and reads.
const VERSION: u8 = 1;
/// The tree and its one key.
pub const TREE: &str = "anchor";
const KEY: &[u8] = b"anchor";

/// Where the chain starts after a prune.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor<F> {
    pub seq: u64,
    pub hash: Hash,
    pub pruned: u64,
    pub file: PathBuf,
    pub intent: F,
}

impl<F> Anchor<F> {
    /// What `log verify` and the local socket show of it (no intent).
    pub fn summary(&self) -> AnchorSummary {
        AnchorSummary {
            seq: self.seq,
            hash: crate::hex(&self.hash),
            pruned: self.pruned,
            file: self.file.to_string_lossy().into_owned(),
        }
    }
}

/// The stored anchor, if any; a damaged one is [`Defect::AnchorDamaged`] (reported
/// at seq 0: it names no record).
pub fn read<F: DeserializeOwned>(tree: &sled::Tree) -> Result<Option<Anchor<F>>, LogError> {
    let Some(stored) = tree.get(KEY).map_err(LogError::Storage)? else {
        return Ok(None);
    };
    let damaged = LogError::Corrupt(Corruption {
        seq: 0,
        defect: Defect::AnchorDamaged,
    });
    let (content, _) = codec::unseal(0, &stored).map_err(|_| {
        LogError::Corrupt(Corruption {
            seq: 0,
            defect: Defect::AnchorDamaged,
        })
    })?;
    match content.split_first() {
        Some((&VERSION, body)) => serde_json::from_slice(body).map(Some).map_err(|_| damaged),
        _ => Err(damaged),
    }
}

/// Stores `anchor` in place of the previous one (not yet flushed).
pub fn write<F: Serialize>(tree: &sled::Tree, anchor: &Anchor<F>) -> Result<(), LogError> {
    let mut content = vec![VERSION];
    serde_json::to_writer(&mut content, anchor).map_err(LogError::Snapshot)?;
    let (sealed, _) = codec::seal(content);
    tree.insert(KEY, sealed).map_err(LogError::Storage)?;
    Ok(())
}

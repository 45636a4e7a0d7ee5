//! Snapshots: the folded intent at a seq, anchored to the hash of the record at that
//! seq, sealed like records (`[version][body][hash]`, see [`super::codec`]).
//!
//! A snapshot is a cache, never the truth: the records are. A snapshot that is damaged,
//! of another format version, undecodable, or whose anchor does not match its record
//! is ignored, and opening replays from an older one or from seq 1 (and then writes a
//! fresh one when that replay was long). So the snapshot format may change at any time
//! by bumping [`VERSION`]; no upcaster, no fixture.
//!
//! Opening trusts the newest anchored snapshot; [`super::verify`] checks every one
//! against the records (anchor and intent), so a forged snapshot is found by `log
//! verify` and by the daemon's background verification.
//!
//! The body is the intent's JSON (self-describing): a field added to `Spec` (or a
//! `#[serde(default)]` field added to the intent) does not invalidate snapshots,
//! unless the field is folded from records (as the grant ledger is): then the old
//! snapshots lack what the records say, and `VERSION` is bumped.

use super::codec::{self, Hash};
use super::{key_seq, seq_key, Defect, LogError};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The snapshot format this build writes and reads. 1 was bincode of the intent
/// (ignored since: its spec was positional); 2 was the intent before the grant
/// ledger (ignored since: the ledger is folded from records it did not keep).
pub const VERSION: u8 = 3;

/// How many snapshots are kept (the newest, and one to fall back to).
const KEEP: usize = 2;

/// The folded intent at `seq`, with the hash of the record at `seq` as its anchor.
#[derive(Deserialize)]
pub struct Snapshot<F> {
    pub seq: u64,
    pub anchor: Hash,
    pub intent: F,
}

/// [`Snapshot`]'s stored form, written without copying the intent.
#[derive(Serialize)]
struct SnapshotRef<'a, F> {
    seq: u64,
    anchor: Hash,
    intent: &'a F,
}

/// A stored snapshot, if it is intact and of this build's version.
fn open<F: DeserializeOwned>(key_seq: u64, stored: &[u8]) -> Option<Snapshot<F>> {
    check(key_seq, stored).ok().flatten()
}

/// A stored snapshot, read strictly (for verification): `Ok(None)` when it is of
/// another version (ignored by design), [`Defect::SnapshotDamaged`] when its seal is
/// broken or its body is not a snapshot of the seq it is stored under.
pub fn check<F: DeserializeOwned>(
    key_seq: u64,
    stored: &[u8],
) -> Result<Option<Snapshot<F>>, Defect> {
    let (content, _) = codec::unseal(key_seq, stored).map_err(|_| Defect::SnapshotDamaged)?;
    let (&version, body) = content.split_first().ok_or(Defect::SnapshotDamaged)?;
    if version != VERSION {
        return Ok(None);
    }
    let snap: Snapshot<F> = serde_json::from_slice(body).map_err(|_| Defect::SnapshotDamaged)?;
    if snap.seq != key_seq {
        return Err(Defect::SnapshotDamaged);
    }
    Ok(Some(snap))
}

/// The newest usable snapshot: intact, of this version, and anchored to its record
/// (`anchor_of(seq)` is the hash of the stored record at `seq`, if it has one).
pub fn newest<F: DeserializeOwned>(
    snapshots: &sled::Tree,
    anchor_of: impl Fn(u64) -> Result<Option<Hash>, sled::Error>,
) -> Result<Option<Snapshot<F>>, sled::Error> {
    for entry in snapshots.iter().rev() {
        let (key, value) = entry?;
        let Some(snap) = open(key_seq(&key).unwrap_or(0), &value) else {
            continue;
        };
        if anchor_of(snap.seq)? == Some(snap.anchor) {
            return Ok(Some(snap));
        }
    }
    Ok(None)
}

/// Stores a snapshot of `intent` at `seq` and prunes all but the newest [`KEEP`].
pub fn write<F: Serialize>(
    snapshots: &sled::Tree,
    seq: u64,
    anchor: Hash,
    intent: &F,
) -> Result<(), LogError> {
    let mut content = vec![VERSION];
    serde_json::to_writer(
        &mut content,
        &SnapshotRef {
            seq,
            anchor,
            intent,
        },
    )
    .map_err(LogError::Snapshot)?;
    let (sealed, _) = codec::seal(content);
    snapshots
        .insert(seq_key(seq), sealed)
        .map_err(LogError::Storage)?;
    let keys: Vec<sled::IVec> = snapshots
        .iter()
        .keys()
        .collect::<Result<_, _>>()
        .map_err(LogError::Storage)?;
    for old in keys.iter().rev().skip(KEEP) {
        snapshots.remove(old).map_err(LogError::Storage)?;
    }
    Ok(())
}

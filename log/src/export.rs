//! Export lines: one JSON object per record, the record's JSON form (`capstan-agent
//! log --json`: `seq`, `at`, `kind`, `prev_hash`, the event's fields) plus
//!
//! - `hash`: the record's SHA-256, which the next record's `prev_hash` names;
//! - `stored`: the stored record (format version and body) in hex, whose SHA-256 is
//!   `hash`.
//!
//! So an export verifies on its own ([`Chain`]): each line's `stored` hashes to its
//! `hash`, decodes to exactly the line's other fields, and links to the line before;
//! and against the log, through the anchor (the last pruned record's hash) or the
//! first record kept. Retention writes them (`capstan-log-<first>-<last>.jsonl`), as
//! does `capstan-agent log export`.

use super::codec::{self, Hash};
use super::{hex, Entry, Fold, Record};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot write the export file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {why}")]
    Bad { line: usize, why: String },
}

/// The export line of `record`, whose stored form is `stored` (sealed).
pub fn line<E: Entry>(record: &Record<E>, stored: &[u8]) -> Value {
    let (content, hash) = stored.split_at(stored.len() - 32);
    let mut json = record.to_json();
    json["hash"] = hex(hash).into();
    json["stored"] = hex(content).into();
    json
}

/// What a run of export lines proved: the seqs it covers, the `prev_hash` of its first
/// line and the hash of its last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub first: u64,
    pub last: u64,
    pub first_prev: Hash,
    pub last_hash: Hash,
}

impl Chain {
    /// Checks `lines` (numbered from 1 in errors): each intact, consecutive and
    /// linked. `None` for no lines.
    /// `E`: the entries the lines hold.
    pub fn verify<'a, E: Entry>(
        lines: impl IntoIterator<Item = &'a str>,
    ) -> Result<Option<Chain>, ExportError> {
        let mut chain: Option<Chain> = None;
        for (i, text) in lines.into_iter().enumerate() {
            let bad = |why: String| ExportError::Bad { line: i + 1, why };
            let json: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
            let stored = json["stored"]
                .as_str()
                .and_then(unhex)
                .ok_or_else(|| bad("no `stored` hex".into()))?;
            let seq = json["seq"].as_u64().ok_or_else(|| bad("no `seq`".into()))?;
            let (sealed, hash) = codec::seal(stored);
            if json["hash"].as_str() != Some(hex(&hash).as_str()) {
                return Err(bad(format!(
                    "record {seq}: `stored` does not hash to `hash`"
                )));
            }
            let (record, _) =
                codec::open_record::<E>(seq, &sealed).map_err(|c| bad(c.to_string()))?;
            if line(&record, &sealed) != json {
                return Err(bad(format!(
                    "record {seq}: the fields do not match the stored record (edited)"
                )));
            }
            match &mut chain {
                None => {
                    chain = Some(Chain {
                        first: seq,
                        last: seq,
                        first_prev: record.prev_hash,
                        last_hash: hash,
                    })
                }
                Some(c) => {
                    if seq != c.last + 1 {
                        return Err(bad(format!("record {seq} follows record {}", c.last)));
                    }
                    if record.prev_hash != c.last_hash {
                        return Err(bad(format!("record {seq}: the chain is broken")));
                    }
                    c.last = seq;
                    c.last_hash = hash;
                }
            }
        }
        Ok(chain)
    }
}

/// Lower-case or upper-case hex to bytes.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The file retention exports records `first..=last` to, in `dir`.
pub fn file_name(dir: &Path, first: u64, last: u64) -> PathBuf {
    dir.join(format!("capstan-log-{first:020}-{last:020}.jsonl"))
}

/// Writes `lines` to `path` durably: to a temporary file, fsync'd, renamed into
/// place, and the directory fsync'd. Rewriting the same records gives the same file.
/// The file is `0600` (the log's records: the owner's alone, as the log is) and the
/// directories made for it `0700`, whatever the umask; a directory already there is
/// left as it is (the operator's `export_dir`).
pub fn write_durably(path: &Path, lines: &[Value]) -> Result<(), ExportError> {
    use capstan_common::files;
    let error = |source| ExportError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    files::create_dir_all(dir, files::PRIVATE_DIR).map_err(error)?;
    let tmp = path.with_extension("jsonl.tmp");
    let file = files::create(&tmp, files::PRIVATE_FILE).map_err(error)?;
    let mut file = std::io::BufWriter::new(file);
    for json in lines {
        serde_json::to_writer(&mut file, json).map_err(|e| error(e.into()))?;
        file.write_all(b"\n").map_err(error)?;
    }
    let file = file.into_inner().map_err(|e| error(e.into_error()))?;
    file.sync_all().map_err(error)?;
    std::fs::rename(&tmp, path).map_err(error)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(error)
}

/// Removes files in `dir` a prune interrupted before its anchor was written: those
/// starting at `first` but for `keep` (their records are all still in the log).
pub fn remove_leftovers(dir: &Path, first: u64, keep: &Path) -> Result<(), ExportError> {
    let prefix = format!("capstan-log-{first:020}-");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ExportError::Write {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(&prefix) && path != keep {
            std::fs::remove_file(&path).map_err(|source| ExportError::Write { path, source })?;
        }
    }
    Ok(())
}

/// The most export lines one call (or one local socket answer) returns.
pub const MAX_LINES: usize = 1000;

impl<F: Fold> super::Log<F> {
    /// The export lines of records after `since` up to `until` (inclusive), at most
    /// `limit` (and at most [`MAX_LINES`]). Each record is checked against its own
    /// hash.
    pub fn export_lines(
        &self,
        since: u64,
        until: u64,
        limit: usize,
    ) -> Result<Vec<Value>, super::LogError> {
        let mut lines = Vec::new();
        // Never a record at or below the anchor (a prune may still be removing them).
        let since = since.max(self.pruned_through());
        if until <= since {
            return Ok(lines);
        }
        let in_range = self
            .records
            .range(since + 1)
            .take_while(|e| !matches!(e, Ok((seq, _)) if *seq > until));
        for entry in in_range.take(limit.min(MAX_LINES)) {
            let (seq, stored) = entry?;
            let (record, _) =
                codec::open_record::<F::Entry>(seq, &stored).map_err(super::LogError::Corrupt)?;
            lines.push(line(&record, &stored));
        }
        Ok(lines)
    }
}

/// How export files (each checked on its own by [`Chain::verify`]) hold together and
/// with the log: consecutive and linked, and their end matching the log — the anchor
/// (`anchor`: its seq and hash) or the hash of a record the log still has
/// (`hash_in_log(seq)`). What they prove, in words.
pub fn link(
    chains: &mut [Chain],
    anchor: Option<(u64, Hash)>,
    hash_in_log: impl Fn(u64) -> Option<Hash>,
) -> Result<String, ExportError> {
    let broken = |why: String| ExportError::Bad { line: 0, why };
    chains.sort_by_key(|c| c.first);
    let (Some(head), Some(tail)) = (chains.first(), chains.last()) else {
        return Err(broken("no records in the export".into()));
    };
    for pair in chains.windows(2) {
        if pair[1].first != pair[0].last + 1 || pair[1].first_prev != pair[0].last_hash {
            return Err(broken(format!(
                "records {}..={} do not follow records {}..={}",
                pair[1].first, pair[1].last, pair[0].first, pair[0].last
            )));
        }
    }
    if head.first == 1 && head.first_prev != [0; 32] {
        return Err(broken("record 1 names a previous record".into()));
    }
    let (first, last, last_hash) = (head.first, tail.last, tail.last_hash);
    let matched = match anchor {
        Some((seq, hash)) if seq == last => hash == last_hash,
        _ => match hash_in_log(last) {
            Some(hash) => hash == last_hash,
            None => {
                let anchored = anchor.map_or(String::from("none"), |(s, _)| s.to_string());
                return Err(broken(format!(
                    "records {first}..={last}: the log has neither record {last} nor an anchor there (anchor: {anchored}); give the later export files too"
                )));
            }
        },
    };
    if !matched {
        return Err(broken(format!(
            "record {last}: the export's hash differs from the log's: the export or the log was altered"
        )));
    }
    let from = if first == 1 {
        "from the first record".to_string()
    } else {
        format!("from record {first} (the earlier records not given)")
    };
    Ok(format!(
        "ok records {first}..={last}: intact, linked {from}, and matching the log at record {last}"
    ))
}

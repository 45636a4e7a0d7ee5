//! `capstan-agent log export` and `log verify --export`: export lines
//! (`capstan_agent::log::export`) read from the running agent over its local socket,
//! or from the log files when no agent runs.

use anyhow::Context as _;
use capstan_agent::event::Event;
use capstan_agent::local_socket;
use capstan_agent::log::export::{self, Chain};
use capstan_agent::log::Log;
use capstan_common::answers::{AnchorSummary, ExportAnswer, ExportRequest, Verb};
use capstan_common::files;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// `--since`/`--until`: a seq, or an RFC 3339 time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Seq(u64),
    Time(chrono::DateTime<chrono::Utc>),
}

impl std::str::FromStr for Bound {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(seq) = s.parse() {
            return Ok(Bound::Seq(seq));
        }
        chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| Bound::Time(t.with_timezone(&chrono::Utc)))
            .map_err(|_| format!("{s:?} is neither a seq nor an RFC 3339 time"))
    }
}

/// Where the lines come from.
pub enum Source {
    /// The running agent's socket.
    Agent(PathBuf),
    /// The log files.
    Files(Arc<Log>),
}

impl Source {
    /// The lines after `since` up to `until`, at most a page, and the anchor summary.
    fn page(&self, since: u64, until: u64) -> anyhow::Result<ExportAnswer> {
        match self {
            Source::Agent(path) => {
                let request = ExportRequest {
                    since,
                    until: Some(until),
                    limit: None,
                };
                Ok(local_socket::ask_as(path, Verb::Export, &request)?)
            }
            Source::Files(log) => Ok(ExportAnswer {
                lines: log.export_lines(since, until, export::MAX_LINES)?,
                anchor: log.anchor()?.map(|a| a.summary()),
            }),
        }
    }

    /// The anchor summary (`None` before any prune).
    pub fn anchor(&self) -> anyhow::Result<Option<AnchorSummary>> {
        Ok(self.page(0, 0)?.anchor)
    }
}

/// `log export`: records after `since` up to `until` as export lines, to `output`
/// (fsync'd) or stdout.
pub fn run(
    source: &Source,
    since: Option<Bound>,
    until: Option<Bound>,
    output: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let seq_since = match since {
        Some(Bound::Seq(s)) => s,
        _ => 0,
    };
    let seq_until = match until {
        Some(Bound::Seq(s)) => s,
        _ => u64::MAX,
    };
    let in_time = |line: &Value| {
        let at = line["at"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        let after = match since {
            Some(Bound::Time(t)) => at.is_some_and(|a| a >= t),
            _ => true,
        };
        let before = match until {
            Some(Bound::Time(t)) => at.is_some_and(|a| a <= t),
            _ => true,
        };
        after && before
    };
    let mut out: Box<dyn Write> = match output {
        Some(path) => Box::new(std::io::BufWriter::new(
            // The log's records: the owner's alone, as the log is, whatever the umask.
            files::create(path, files::PRIVATE_FILE)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let (mut next, mut count, mut range) = (seq_since, 0u64, None::<(u64, u64)>);
    loop {
        let lines = source.page(next, seq_until)?.lines;
        let Some(last) = lines.last().and_then(|l| l["seq"].as_u64()) else {
            break;
        };
        next = last;
        for line in lines.iter().filter(|l| in_time(l)) {
            let seq = line["seq"].as_u64().unwrap_or(0);
            range = Some(range.map_or((seq, seq), |(a, _)| (a, seq)));
            serde_json::to_writer(&mut out, line)?;
            out.write_all(b"\n")?;
            count += 1;
        }
    }
    out.flush()?;
    drop(out);
    if let Some(path) = output {
        std::fs::File::open(path)?.sync_all()?;
    }
    match range {
        Some((a, b)) => eprintln!("exported {count} records ({a}..={b})"),
        None => eprintln!("exported 0 records"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `log verify --export FILE…`: each file intact, the files linked, and their end
/// matching the log (its anchor, or a record it still has). Exit 1 when not.
pub fn verify(source: &Source, files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut chains = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        match Chain::verify::<Event>(text.lines()) {
            Ok(Some(chain)) => chains.push(chain),
            Ok(None) => {
                println!("bad export {}: no records", file.display());
                return Ok(ExitCode::from(1));
            }
            Err(e) => {
                println!("bad export {}: {e}", file.display());
                return Ok(ExitCode::from(1));
            }
        }
    }
    let hash = |v: &Value| {
        v.as_str()
            .and_then(export::unhex)
            .and_then(|h| <[u8; 32]>::try_from(h).ok())
    };
    let anchor = match source.anchor()? {
        Some(a) => Some(a.seq).zip(export::unhex(&a.hash).and_then(|h| h.try_into().ok())),
        None => None,
    };
    let in_log = |seq: u64| {
        let lines = source.page(seq.saturating_sub(1), seq).ok()?.lines;
        hash(&lines.first()?["hash"])
    };
    match export::link(&mut chains, anchor, in_log) {
        Ok(words) => {
            println!("{words}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("bad export: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

/// ` from anchor seq N (M records pruned, last exported to FILE)`, or nothing.
pub fn anchor_words(anchor: Option<&AnchorSummary>) -> String {
    match anchor {
        Some(a) => format!(
            " from anchor seq {} ({} records pruned, last exported to {})",
            a.seq, a.pruned, a.file
        ),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_a_seq_or_an_rfc3339_time_and_nothing_else() {
        assert_eq!("42".parse::<Bound>(), Ok(Bound::Seq(42)));
        let t = chrono::DateTime::parse_from_rfc3339("2026-12-01T03:00:00Z").unwrap();
        assert_eq!(
            "2026-12-01T04:00:00+01:00".parse::<Bound>(),
            Ok(Bound::Time(t.with_timezone(&chrono::Utc)))
        );
        for bad in ["-1", "yesterday", "2026-12-01", ""] {
            let err = bad.parse::<Bound>().unwrap_err();
            assert!(
                err.contains("neither a seq nor an RFC 3339 time"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn an_export_by_time_and_seq_keeps_only_the_records_in_range() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), capstan_agent::log::LogOptions::default()).unwrap();
        for ns in ["a", "b", "c", "d"] {
            log.append(&[capstan_agent::event::Event::NamespaceReady {
                command_id: format!("c-{ns}"),
                namespace: ns.into(),
            }])
            .unwrap();
        }
        let source = Source::Files(Arc::new(log));
        let out = dir.path().join("out.jsonl");
        let seqs = |since, until| {
            run(&source, since, until, Some(&out)).unwrap();
            let text = std::fs::read_to_string(&out).unwrap();
            let chain = Chain::verify::<Event>(text.lines()).unwrap();
            chain.map(|c| (c.first, c.last))
        };
        assert_eq!(seqs(None, None), Some((1, 4)));
        assert_eq!(seqs(Some(Bound::Seq(1)), Some(Bound::Seq(3))), Some((2, 3)));
        let past = chrono::Utc::now() - chrono::Duration::hours(1);
        let future = chrono::Utc::now() + chrono::Duration::hours(1);
        assert_eq!(
            seqs(Some(Bound::Time(past)), Some(Bound::Seq(2))),
            Some((1, 2))
        );
        assert_eq!(seqs(Some(Bound::Time(future)), None), None);
        assert_eq!(seqs(Some(Bound::Seq(2)), Some(Bound::Time(past))), None);
    }
}

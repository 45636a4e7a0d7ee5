//! Command results follow the outbox. Once a record of a command is in `CAPSTAN_EVT`,
//! the command's status — summed up from every record with its id so far, the same
//! way the coordinator would ([`capstan_common::status`]) — is put under
//! `<host>.<hex id>` in the `capstan_results` bucket while the command is not done,
//! and under `<host>.<hex id>.done` once it is ([`nats_layout::final_result_key`]). A
//! coordinator then answers "what happened to command X" with one or two gets, and
//! `wait`s on the keys' subjects, however long the host's history is.
//!
//! Order: a result is put only after the records it sums up are acknowledged by
//! `CAPSTAN_EVT` (it never runs ahead of the audit copy), and each round's puts are
//! acknowledged before the next round, so a command's `running` entry can never land
//! after its final one.
//!
//! Where to resume: the host's own `<host>._progress` key holds the seq up to which
//! results are put, written at most every [`PROGRESS_EVERY`] while records flow, when
//! they stop for that long, and on a stop — not after each round, where it would
//! delay the next round's results. A crash costs a re-put of at most that much (the
//! same values again: a status is summed up from the log). Without a progress key (a
//! first start), results start [`REPUT`] records before the last record in
//! `CAPSTAN_EVT`.
//!
//! The bucket being unreachable (no coordinator created it yet, or an outage) delays
//! results, never the outbox.

use super::{pause, Link};
use crate::log::Log;
use async_nats::jetstream::{self, stream};
use capstan_common::nats as cnats;
use capstan_common::nats_layout;
use capstan_common::published::Publication;
use capstan_common::status::{summarize, MAX_EVENTS_BYTES};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Records re-summed at a first start (no progress key yet).
pub const REPUT: u64 = 256;
/// The most records read, and puts sent, in one round.
const ROUND: usize = 512;
/// How often, at most, the progress key is written.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
enum ResultsError {
    #[error("cannot reach the results bucket")]
    Bucket(#[source] cnats::NatsError),
    #[error("cannot read where results left off")]
    Progress(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot read the log")]
    Log(#[source] crate::log::LogError),
    #[error("cannot put a result")]
    Put(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The subject of the host's own progress entry (its key `<host>._progress`).
fn progress_subject(host: &str) -> String {
    format!("$KV.{}.{host}._progress", nats_layout::RESULTS_BUCKET)
}

/// Puts results until `stop`, following `published` (the outbox's last acknowledged
/// seq). `replicas`: for the bucket, if this agent is the first to need it.
pub(crate) async fn run(
    link: Link,
    log: Arc<Log>,
    host: String,
    mut published: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Duration::from_millis(200);
    let mut failing = false;
    let mut results = Results {
        link,
        log,
        host,
        bucket: None,
        done: None,
        saved: 0,
        saved_at: tokio::time::Instant::now(),
        pending: BTreeSet::new(),
    };
    loop {
        let upto = *published.borrow_and_update();
        match results.round(upto).await {
            Ok(more) => {
                if failing {
                    failing = false;
                    tracing::info!("command results resumed");
                }
                retry = Duration::from_millis(200);
                if more {
                    continue;
                }
                if *stop.borrow() {
                    results.save_progress().await;
                    return;
                }
                let behind = results.done.is_some_and(|d| d > results.saved);
                let due = results.saved_at + PROGRESS_EVERY;
                tokio::select! {
                    _ = published.changed() => {}
                    _ = tokio::time::sleep_until(due), if behind => {
                        results.save_progress().await;
                    }
                    _ = stop.changed() => {
                        results.save_progress().await;
                        return;
                    }
                }
            }
            Err(e) => {
                if !failing {
                    failing = true;
                    tracing::warn!(error = %capstan_common::report(&e), "command results paused; retrying");
                }
                if pause(&mut stop, retry).await {
                    return;
                }
                retry = (retry * 2).min(Duration::from_secs(2));
            }
        }
    }
}

struct Results {
    link: Link,
    log: Arc<Log>,
    host: String,
    /// The bucket's stream (puts are publishes; the progress key a direct get).
    bucket: Option<jetstream::stream::Stream<()>>,
    /// The seq up to which results are put (read from the bucket at first).
    done: Option<u64>,
    /// The seq the progress key holds, and when it was written.
    saved: u64,
    saved_at: tokio::time::Instant,
    /// Commands whose result is to be put (kept across a failed round).
    pending: BTreeSet<String>,
}

impl Results {
    /// One round: collects the commands of up to [`ROUND`] records after `done` (and
    /// at most `upto`), puts their results (one put per command, however many of its
    /// records the round holds), and the progress when it is due. True when records
    /// up to `upto` remain.
    async fn round(&mut self, upto: u64) -> Result<bool, ResultsError> {
        let bucket = match &self.bucket {
            Some(b) => b.clone(),
            None => {
                let b = self.link.results().await.map_err(ResultsError::Bucket)?;
                self.bucket = Some(b.clone());
                b
            }
        };
        let done = match self.done {
            Some(done) => done,
            None => {
                let done = self.resume_point(&bucket).await?;
                (self.saved, self.saved_at) = (done, tokio::time::Instant::now());
                done
            }
        };
        self.done = Some(done);
        if upto <= done && self.pending.is_empty() {
            return Ok(false);
        }
        let mut reached = done;
        for record in self.log.read_since(done).take(ROUND) {
            let record = record.map_err(ResultsError::Log)?;
            if record.seq > upto {
                break;
            }
            reached = record.seq;
            if let Some(id) = record.event.command_id() {
                self.pending.insert(id.to_string());
            }
        }
        self.put(reached).await?;
        self.done = Some(reached);
        if reached > self.saved && self.saved_at.elapsed() >= PROGRESS_EVERY {
            self.write_progress(reached).await?;
        }
        Ok(reached < upto)
    }

    async fn write_progress(&mut self, seq: u64) -> Result<(), ResultsError> {
        let progress = serde_json::json!({ "seq": seq }).to_string().into_bytes();
        let headers = self.link.sign(
            async_nats::HeaderMap::new(),
            Publication::Progress,
            &progress,
        );
        self.link
            .js
            .publish_with_headers(progress_subject(&self.host), headers, progress.into())
            .await
            .map_err(|e| ResultsError::Put(e.into()))?
            .await
            .map_err(|e| ResultsError::Put(e.into()))?;
        (self.saved, self.saved_at) = (seq, tokio::time::Instant::now());
        Ok(())
    }

    /// Writes the progress if it is behind; a failure only costs re-puts later.
    async fn save_progress(&mut self) {
        let (Some(_), Some(done)) = (&self.bucket, self.done) else {
            return;
        };
        if done > self.saved {
            if let Err(e) = self.write_progress(done).await {
                tracing::debug!(error = %e, "progress not written; results will be put again");
            }
        }
    }

    /// The progress key's seq, or [`REPUT`] records before the host's last record in
    /// `CAPSTAN_EVT` when there is none.
    async fn resume_point(
        &self,
        bucket: &jetstream::stream::Stream<()>,
    ) -> Result<u64, ResultsError> {
        let own = self.link.key.own_keys(&self.host);
        let entry = match bucket
            .direct_get_last_for_subject(progress_subject(&self.host))
            .await
        {
            Ok(m) => Some(m),
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => None,
            Err(e) => return Err(ResultsError::Progress(e.into())),
        };
        // Only this host's own signed progress counts: whoever else put it (with the
        // host's NATS credentials) could have results skipped. A deleted key's entry
        // has no body: no progress either.
        if let Some(m) = entry.filter(|m| !m.payload.is_empty()) {
            match super::own_seq(&own, Publication::Progress, &m) {
                Ok(Some(seq)) => return Ok(seq),
                Ok(None) => {}
                Err(why) => tracing::warn!(
                    %why,
                    "the results' progress is not this host's signed progress; results resume before the last record"
                ),
            }
        }
        let (evt, _) = self.link.events().await.map_err(ResultsError::Bucket)?;
        let last = match evt
            .direct_get_last_for_subject(nats_layout::evt_subject(&self.host))
            .await
        {
            Ok(m) => {
                match super::own_seq(&own, Publication::Record, &m) {
                    Ok(seq) => seq.unwrap_or(0),
                    Err(why) => {
                        // Not this host's: its claim of a seq is worth nothing; the
                        // outbox's mark says how far the stream has this host's own.
                        let mark = self
                            .log
                            .mark(super::outbox::MARK)
                            .map_err(ResultsError::Log)?;
                        tracing::warn!(%why, mark, "the last record on this host's subject is not its own; results resume before the outbox's mark");
                        mark
                    }
                }
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => 0,
            Err(e) => return Err(ResultsError::Progress(e.into())),
        };
        Ok(last.saturating_sub(REPUT))
    }

    /// Puts the result of every pending command, summed up from its records up to
    /// `upto`; all sent, then all acknowledged. The round's puts are signed as one
    /// batch; on per-host accounts each is followed by a notice of the same bytes and
    /// headers on [`nats_layout::result_notice_subject`] (what `wait`s follow there: a put
    /// into the host's storage account is not seen by the coordinators' account).
    async fn put(&mut self, upto: u64) -> Result<(), ResultsError> {
        let mut bodies = Vec::with_capacity(self.pending.len());
        for id in &self.pending {
            let events = self
                .log
                .for_command(id)
                .map_err(ResultsError::Log)?
                .into_iter()
                .filter(|r| r.seq <= upto)
                .map(|r| {
                    let mut json = r.to_json();
                    json["host"] = self.host.as_str().into();
                    json
                })
                .collect();
            let status = summarize(id, &self.host, events).fit(MAX_EVENTS_BYTES);
            // A final result under its own key, which no unfinished one is put under:
            // a replay of an older result cannot make a done command look undone.
            let subject = if status.done {
                nats_layout::final_result_subject(&self.host, id)
            } else {
                nats_layout::result_subject(&self.host, id)
            };
            bodies.push((
                id.clone(),
                subject,
                serde_json::to_vec(&status).expect("statuses serialise"),
            ));
        }
        // One signature for the round's results, each with its proof.
        let payloads: Vec<&[u8]> = bodies.iter().map(|(_, _, b)| b.as_slice()).collect();
        let signed = self.link.sign_batch(Publication::Result, &payloads);
        let mut acks = Vec::with_capacity(bodies.len());
        for ((id, subject, body), headers) in bodies.into_iter().zip(signed) {
            let ack = self
                .link
                .js
                .publish_with_headers(subject, headers.clone(), body.clone().into())
                .await
                .map_err(|e| ResultsError::Put(e.into()))?;
            acks.push((id, headers, body, ack));
        }
        let client = self.link.js.client();
        for (id, headers, body, ack) in acks {
            ack.await.map_err(|e| ResultsError::Put(e.into()))?;
            // Without per-host accounts a coordinator sees the put itself.
            if !self.link.host_accounts {
                continue;
            }
            // Best effort: a lost notice costs a waiter its next re-read, no more.
            let notice = nats_layout::result_notice_subject(&self.host, &id);
            if let Err(e) = client
                .publish_with_headers(notice, headers, body.into())
                .await
            {
                tracing::debug!(error = %e, "result notice not sent");
            }
        }
        self.pending.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::published;
    use capstan_common::signing::Signer;

    fn results(link: &Link, rig: &crate::testkit::Rig) -> Results {
        Results {
            link: link.clone(),
            log: rig.executor.log().clone(),
            host: "h1".into(),
            bucket: None,
            done: None,
            saved: 0,
            saved_at: tokio::time::Instant::now(),
            pending: BTreeSet::new(),
        }
    }

    async fn put_last(link: &Link, subject: String, payload: &str, headers: async_nats::HeaderMap) {
        link.js
            .publish_with_headers(subject, headers, payload.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Given progress written, when results start again, then they resume there.
    /// Progress or a last record that is not the host's own signed one (put with the
    /// host's NATS credentials by someone else) moves nothing: without trusted
    /// progress results resume [`REPUT`] before the host's own last record, and
    /// before the outbox's mark (0 here: this log published nothing) when that is not
    /// its own. Read by direct gets, as a host
    /// account may (no stream info).
    #[tokio::test]
    async fn results_resume_only_from_the_hosts_own_signed_progress_or_last_record() {
        let server = capstan_testsupport::NatsServer::start(&[]);
        let client = async_nats::connect(&server.url).await.unwrap();
        let link = Link {
            js: jetstream::new(client),
            replicas: 1,
            host_accounts: false,
            key: Arc::new(Signer::generate().unwrap()),
            pace: Arc::new(tokio::sync::watch::channel(Duration::ZERO).0),
        };
        let rig = crate::testkit::Rig::new(Default::default());
        let bucket = link.results().await.unwrap();
        link.events().await.unwrap();
        let mut first = results(&link, &rig);
        assert_eq!(first.resume_point(&bucket).await.unwrap(), 0, "nothing yet");
        first.write_progress(42).await.unwrap();
        let again = results(&link, &rig);
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 42);
        // Progress forged far ahead (unsigned, or signed by another key): not taken.
        let unsigned = async_nats::HeaderMap::new();
        let progress = progress_subject("h1");
        put_last(
            &link,
            progress.clone(),
            r#"{"seq":1000000}"#,
            unsigned.clone(),
        )
        .await;
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 0);
        let stranger = Signer::generate().unwrap();
        let mut theirs = async_nats::HeaderMap::new();
        let forged = br#"{"seq":1000000}"#;
        theirs.insert(
            published::HEADER,
            stranger
                .sign_publication(Publication::Progress, forged)
                .as_str(),
        );
        put_last(&link, progress.clone(), r#"{"seq":1000000}"#, theirs).await;
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 0);
        // The host's own last record is seq 300.
        let record = r#"{"seq":300}"#;
        let signed = link.sign_batch(Publication::Record, &[record.as_bytes()]);
        let evt = nats_layout::evt_subject("h1");
        put_last(&link, evt.clone(), record, signed[0].clone()).await;
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 300 - REPUT);
        // A deleted progress key is none either.
        let mut deleted = async_nats::HeaderMap::new();
        deleted.insert("KV-Operation", "DEL");
        put_last(&link, progress, "", deleted).await;
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 300 - REPUT);
        // A junk last record after it claims more: not the host's, not taken.
        put_last(&link, evt, r#"{"seq":9999999}"#, unsigned).await;
        assert_eq!(again.resume_point(&bucket).await.unwrap(), 0);
    }
}

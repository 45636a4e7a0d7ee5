//! Hearing beats: every coordinator subscribes to `capstan.v1.beat.*` (not in a
//! queue group: each keeps the whole fleet in memory), checks each beat's signature
//! once, on receipt, against the host's registered keys, and keeps it in
//! [`Beats`]. Once a second it sets the pace from the fleet's size and forgets hosts
//! silent for longer than the pace keeps them.

use super::liveness::{Beats, Pace, Pacing, Receipt};
use super::{check_host, Fleet, FleetError, HostStatus, Layout};
use capstan_common::answers::HostBeat;
use capstan_common::nats_layout;
use capstan_common::published::Publication;
use futures::StreamExt as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the pace is set again and silent hosts forgotten.
const TICK: Duration = Duration::from_secs(1);

/// The coordinator's memory of the fleet's beats.
pub(super) struct Liveness {
    pacing: Pacing,
    beats: Mutex<Beats>,
    pace: Mutex<Pace>,
    /// Since when beats have been heard without a break.
    listening: Mutex<Listening>,
    /// How many beats ended as each [`Receipt::ALL`].
    receipts: [AtomicU64; Receipt::ALL.len()],
}

/// Since when beats have been heard without a break (`None`: not yet), and how many
/// times the connection had connected then: another connect since means beats were
/// lost meanwhile.
#[derive(Default)]
struct Listening {
    since: Option<Instant>,
    connects: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Liveness {
    pub(super) fn new(pacing: Pacing) -> Liveness {
        Liveness {
            pace: Mutex::new(pacing.pace(0)),
            pacing,
            beats: Mutex::default(),
            listening: Mutex::default(),
            receipts: Default::default(),
        }
    }

    pub(super) fn pace(&self) -> Pace {
        *lock(&self.pace)
    }

    /// Beats are heard from `now` on, the connection having connected `connects`
    /// times (`None`: not heard, the subscription is gone).
    fn listen(&self, from: Option<(Instant, u64)>) {
        let mut listening = lock(&self.listening);
        listening.since = from.map(|(now, _)| now);
        listening.connects = from.map_or(0, |(_, connects)| connects);
    }

    /// Whether this coordinator has heard beats for less than `stale_after` at
    /// `now`, its connection having connected `connects` times: a connect since it
    /// began to listen (beats were lost while it was away) starts it again.
    fn warming(&self, now: Instant, connects: u64, pace: &Pace) -> bool {
        let mut listening = lock(&self.listening);
        let Some(since) = listening.since else {
            return true;
        };
        if listening.connects != connects {
            listening.since = Some(now);
            listening.connects = connects;
            return true;
        }
        now.saturating_duration_since(since) < pace.stale_after
    }

    /// Whether a signed beat of `host` is kept.
    pub(super) fn heard(&self, host: &str) -> bool {
        lock(&self.beats).heard(host)
    }

    fn count(&self, receipt: Receipt) {
        let i = Receipt::ALL.iter().position(|r| *r == receipt).unwrap_or(0);
        self.receipts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// How many beats ended as each receipt since the coordinator started.
    pub(super) fn receipts(&self) -> Vec<(&'static str, u64)> {
        Receipt::ALL
            .iter()
            .zip(&self.receipts)
            .map(|(r, n)| (r.as_str(), n.load(Ordering::Relaxed)))
            .collect()
    }
}

impl Fleet {
    /// Hears hosts' beats for as long as the process runs, subscribing again (with a
    /// pause) whenever NATS is not there.
    pub async fn serve_beats(&self) {
        let ended = || self.liveness.listen(None);
        super::forever("beats", || self.serve_beats_once(), ended).await
    }

    async fn serve_beats_once(&self) -> Result<(), FleetError> {
        let layout = self.layout().await?;
        let subject = nats_layout::beat_subject("*");
        let mut beats = self
            .client
            .subscribe(subject.clone())
            .await
            .map_err(FleetError::nats)?;
        tracing::info!(%subject, "hearing beats");
        let liveness = &self.liveness;
        liveness.listen(Some((Instant::now(), self.connects())));
        let prefix = nats_layout::beat_subject("");
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                beat = beats.next() => match beat {
                    Some(beat) => {
                        let host = beat.subject.strip_prefix(prefix.as_str()).unwrap_or_default();
                        let receipt = self.hear(layout, host, &beat);
                        liveness.count(receipt);
                    }
                    None => return Ok(()),
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    let hosts = layout.keys.count().max(lock(&liveness.beats).len());
                    let pace = liveness.pacing.pace(hosts);
                    *lock(&liveness.pace) = pace;
                    // Silence is the host's only while this coordinator hears: not
                    // while it is away from NATS or warming up after.
                    let up = self.client.connection_state() == async_nats::connection::State::Connected;
                    if up && !liveness.warming(now, self.connects(), &pace) {
                        lock(&liveness.beats).forget_silent(now, pace.keep_for);
                    }
                }
            }
        }
    }

    /// Looks at one beat of `host` (its subject's last token).
    fn hear(&self, layout: &Layout, host: &str, beat: &async_nats::Message) -> Receipt {
        if check_host(host).is_err() {
            return Receipt::Misnamed;
        }
        let now = Instant::now();
        if !lock(&self.liveness.beats).arrive(host, now) {
            return Receipt::TooSoon;
        }
        let signed = layout.keys.check(
            host,
            Publication::Beat,
            &beat.payload,
            beat.headers.as_ref(),
        );
        let body = match signed {
            Err(why) => {
                tracing::warn!(host, error = %why, "a heartbeat not signed by its host");
                Err(())
            }
            Ok(()) => match serde_json::from_slice::<HostBeat>(&beat.payload) {
                Ok(body) => Ok(body),
                Err(e) => {
                    tracing::warn!(host, error = %e, "a signed heartbeat that is not one");
                    return Receipt::Misnamed;
                }
            },
        };
        let receipt = lock(&self.liveness.beats).take(host, body, now);
        match receipt {
            Receipt::Misnamed => {
                tracing::warn!(host, "ignoring a heartbeat whose body names another host")
            }
            Receipt::Replayed => {
                tracing::debug!(host, "ignoring a heartbeat no later than the one kept")
            }
            _ => {}
        }
        receipt
    }

    /// Every host heard or known (a registered key; records in `CAPSTAN_EVT` on the
    /// shared account), by host. Fails (rather than calling anyone gone) when NATS is
    /// not reachable.
    pub async fn hosts(&self) -> Result<Vec<HostStatus>, FleetError> {
        let layout = self.layout().await?;
        let mut known: Vec<String> = layout.keys.hosts();
        if !self.trust.host_accounts {
            let evt = &self.stores.shared().await?.evt;
            let mut subjects = evt
                .info_with_subjects("capstan.v1.evt.*")
                .await
                .map_err(FleetError::nats)?;
            while let Some(s) = subjects.next().await {
                let (subject, _count) = s.map_err(FleetError::nats)?;
                known.push(subject.rsplit('.').next().unwrap_or_default().to_string());
            }
        }
        let pace = self.liveness.pace();
        let now = Instant::now();
        let warming = self.liveness.warming(now, self.connects(), &pace);
        let beats = lock(&self.liveness.beats);
        Ok(beats.list(known, chrono::Utc::now(), now, &pace, warming))
    }

    /// How many times the fleet's connection has connected.
    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Relaxed)
    }

    /// The fleet's pace now.
    pub fn pace(&self) -> Pace {
        self.liveness.pace()
    }

    /// How many beats ended as each receipt (`/metrics`).
    pub fn beat_receipts(&self) -> Vec<(&'static str, u64)> {
        self.liveness.receipts()
    }
}

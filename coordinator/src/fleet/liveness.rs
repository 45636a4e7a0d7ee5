//! Liveness on core NATS (`docs/nats.md`, *Heartbeats*): each agent publishes a
//! signed beat on `capstan.v1.beat.<host>`; every coordinator hears every beat,
//! checks its signature once, on receipt, and keeps the latest in memory. Nothing is
//! stored in NATS, so a beat costs the servers one routed message, and
//! `GET /v1/hosts` reads memory.
//!
//! The pace grows with the fleet, as Nomad's heartbeat TTL does: a host beats every
//! `max(5 s, hosts / max_beats_per_sec)` ([`Pacing::pace`]), told in each sync
//! answer, and `stale_after` and the time a silent host's beat is kept grow with it.
//! A coordinator that has just (re)connected has heard no beat yet: for one
//! `stale_after` it says `warming` where it cannot tell alive from gone.
//!
//! This file is the pure part ([`Beats`]: what was heard, and the status it gives);
//! [`super::Fleet::serve_beats`] feeds it.

use super::{beat_status, HostState, HostStatus};
use capstan_common::answers::HostBeat;
use capstan_common::nats_layout;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The least time between two beats of one host that are both looked at: one
/// sooner is dropped before its signature is checked (an agent's beats are at least
/// a quarter of the pace apart, and the pace is at least 5 s), so that whoever holds
/// a host's credentials cannot make a coordinator check signatures as fast as they
/// publish.
pub const MIN_GAP: Duration = Duration::from_millis(200);

/// The default of `max_beats_per_sec` (coordinator.toml).
pub const DEFAULT_MAX_BEATS_PER_SEC: u32 = 500;

/// How the pace follows the fleet's size: `stale_after_secs`, `hosts_max_age_secs`
/// and `max_beats_per_sec` of `coordinator.toml`.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// A host whose beat is older is `stale`, at the fastest pace.
    pub stale_after: Duration,
    /// A host silent this long is `gone`, at the fastest pace.
    pub keep_for: Duration,
    /// The beats a second the whole fleet sends at most, between rollouts.
    pub max_beats_per_sec: u32,
}

impl Default for Pacing {
    fn default() -> Pacing {
        Pacing {
            stale_after: Duration::from_secs(15),
            keep_for: Duration::from_secs(60),
            max_beats_per_sec: DEFAULT_MAX_BEATS_PER_SEC,
        }
    }
}

/// The pace of a fleet of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// How often each host beats.
    pub beat_secs: u64,
    /// A host whose beat is older is `stale`.
    pub stale_after: Duration,
    /// A host silent this long is `gone` (its beat forgotten).
    pub keep_for: Duration,
}

impl Pacing {
    /// The pace of a fleet of `hosts`: each beats every
    /// `ceil(hosts / max_beats_per_sec)` seconds, at least
    /// [`nats_layout::HEARTBEAT_SECS`] and at most [`nats_layout::MAX_HEARTBEAT_SECS`];
    /// `stale_after` and `keep_for` in proportion to the fastest pace's.
    pub fn pace(&self, hosts: usize) -> Pace {
        let fastest = nats_layout::HEARTBEAT_SECS;
        let per_sec = u64::from(self.max_beats_per_sec.max(1));
        let beat_secs = (hosts as u64)
            .div_ceil(per_sec)
            .clamp(fastest, nats_layout::MAX_HEARTBEAT_SECS);
        let scale = |d: Duration| d * beat_secs as u32 / fastest as u32;
        let stale_after = scale(self.stale_after);
        Pace {
            beat_secs,
            stale_after,
            keep_for: scale(self.keep_for).max(stale_after),
        }
    }
}

/// What became of one beat heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// The host's latest beat now.
    Taken,
    /// Sooner than [`MIN_GAP`] after the host's last: dropped unchecked.
    TooSoon,
    /// Not signed by a key registered for the host.
    Unverified,
    /// Signed, but not a beat of the host its subject names (not a beat, or its
    /// body names another host).
    Misnamed,
    /// Signed, but no later than the beat already kept: a replay (or one overtaken).
    Replayed,
}

impl Receipt {
    /// Every receipt, in the order `/metrics` lists them.
    pub const ALL: [Receipt; 5] = [
        Receipt::Taken,
        Receipt::TooSoon,
        Receipt::Unverified,
        Receipt::Misnamed,
        Receipt::Replayed,
    ];

    /// As `/metrics` labels it (`outcome`).
    pub fn as_str(self) -> &'static str {
        match self {
            Receipt::Taken => "taken",
            Receipt::TooSoon => "too_soon",
            Receipt::Unverified => "unverified",
            Receipt::Misnamed => "misnamed",
            Receipt::Replayed => "replayed",
        }
    }
}

/// What was heard of one host.
#[derive(Debug)]
struct Heard {
    /// Its latest signed beat.
    beat: Option<HostBeat>,
    /// When its last beat that was not signed by its key arrived.
    unverified: Option<Instant>,
    /// When its last beat of any kind arrived.
    arrived: Instant,
}

/// Every host's latest beat as heard by this coordinator, with no I/O: the caller
/// says what time it is and whether a beat's signature holds.
#[derive(Debug, Default)]
pub struct Beats {
    hosts: HashMap<String, Heard>,
}

impl Beats {
    /// A beat of `host` arrives at `now`: whether to look at it (false: too soon
    /// after its last, [`Receipt::TooSoon`]).
    pub fn arrive(&mut self, host: &str, now: Instant) -> bool {
        match self.hosts.get_mut(host) {
            Some(heard) if now.saturating_duration_since(heard.arrived) < MIN_GAP => false,
            Some(heard) => {
                heard.arrived = now;
                true
            }
            None => {
                let heard = Heard {
                    beat: None,
                    unverified: None,
                    arrived: now,
                };
                self.hosts.insert(host.to_string(), heard);
                true
            }
        }
    }

    /// The beat of `host` that arrived at `now` was looked at: `Ok` with its body when
    /// its signature holds, else `Err(())`.
    pub fn take(&mut self, host: &str, beat: Result<HostBeat, ()>, now: Instant) -> Receipt {
        let heard = self.hosts.entry(host.to_string()).or_insert(Heard {
            beat: None,
            unverified: None,
            arrived: now,
        });
        let beat = match beat {
            Err(()) => {
                heard.unverified = Some(now);
                return Receipt::Unverified;
            }
            Ok(beat) if beat.host != host => return Receipt::Misnamed,
            Ok(beat) => beat,
        };
        if heard.beat.as_ref().is_some_and(|kept| beat.at <= kept.at) {
            return Receipt::Replayed;
        }
        heard.beat = Some(beat);
        Receipt::Taken
    }

    /// Whether a signed beat of `host` is kept.
    pub fn heard(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(|h| h.beat.is_some())
    }

    /// How many hosts were heard.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no host was heard.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Forgets the hosts silent for `keep_for` (a host with a registered key is still
    /// listed, `gone`).
    pub fn forget_silent(&mut self, now: Instant, keep_for: Duration) {
        self.hosts
            .retain(|_, heard| now.saturating_duration_since(heard.arrived) < keep_for);
    }

    /// Every host heard or `known` (registered, or with records), sorted: its status
    /// at `now` (`at`: the same instant by the wall clock, which the beats' `at` are
    /// read against) under `pace`; `warming`: this coordinator has listened for less
    /// than `stale_after`.
    pub fn list(
        &self,
        known: impl IntoIterator<Item = String>,
        at: chrono::DateTime<chrono::Utc>,
        now: Instant,
        pace: &Pace,
        warming: bool,
    ) -> Vec<HostStatus> {
        let mut out: Vec<HostStatus> = self
            .hosts
            .iter()
            .filter_map(|(host, heard)| status(host, heard, at, now, pace, warming))
            .collect();
        let listed: std::collections::HashSet<String> =
            out.iter().map(|h| h.host.clone()).collect();
        let mut unheard: Vec<String> = known
            .into_iter()
            .filter(|host| !listed.contains(host))
            .collect();
        unheard.sort();
        unheard.dedup();
        out.extend(unheard.into_iter().map(|host| HostStatus {
            host,
            status: if warming {
                HostState::Warming
            } else {
                HostState::Gone
            },
            beat: None,
            age_secs: None,
        }));
        out.sort_by(|a, b| a.host.cmp(&b.host));
        out
    }
}

/// One heard host's status, `None` when there is nothing to say of it (only beats
/// dropped unchecked, or its beat kept past `keep_for`: then it is listed only if
/// known, `gone`).
fn status(
    host: &str,
    heard: &Heard,
    at: chrono::DateTime<chrono::Utc>,
    now: Instant,
    pace: &Pace,
    warming: bool,
) -> Option<HostStatus> {
    let age = heard.beat.as_ref().map(|b| at.signed_duration_since(b.at));
    let of = |status: HostState, with_beat: bool| {
        Some(HostStatus {
            host: host.to_string(),
            status,
            beat: heard.beat.clone().filter(|_| with_beat),
            age_secs: age.filter(|_| with_beat).map(|a| a.num_seconds()),
        })
    };
    if age.is_some_and(|a| beat_status(a, pace.stale_after) == HostState::Alive) {
        return of(HostState::Alive, true);
    }
    let recently = |t: Instant| now.saturating_duration_since(t) <= pace.stale_after;
    if heard.unverified.is_some_and(recently) {
        return of(HostState::Unverified, false);
    }
    if warming && heard.beat.is_some() {
        return of(HostState::Warming, true);
    }
    match age {
        Some(a) if a.to_std().map_or(true, |a| a <= pace.keep_for) => of(HostState::Stale, true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(host: &str, at: chrono::DateTime<chrono::Utc>) -> HostBeat {
        HostBeat {
            host: host.into(),
            version: "test".into(),
            drivers: vec!["sim".into()],
            capabilities: serde_json::Value::Null,
            last_seq: 1,
            healthy: true,
            degraded: None,
            log_failed: None,
            outbox_alarm: None,
            figures: None,
            at,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn states(list: &[HostStatus]) -> Vec<(&str, HostState)> {
        list.iter().map(|h| (h.host.as_str(), h.status)).collect()
    }

    /// Given the default pacing, when the fleet grows, then the pace stays at 5 s up
    /// to 2,500 hosts and then keeps the fleet at 500 beats a second, with
    /// `stale_after` and `keep_for` growing in proportion.
    #[test]
    fn the_pace_keeps_the_fleets_beats_a_second_bounded() {
        let pacing = Pacing::default();
        for (hosts, beat_secs) in [(0, 5), (1, 5), (2_500, 5), (2_501, 6), (10_000, 20)] {
            let pace = pacing.pace(hosts);
            assert_eq!(pace.beat_secs, beat_secs, "{hosts} hosts");
            assert_eq!(pace.stale_after, secs(3 * beat_secs), "{hosts} hosts");
            assert_eq!(pace.keep_for, secs(12 * beat_secs), "{hosts} hosts");
            assert!(hosts as u64 / pace.beat_secs <= 500, "{hosts} hosts");
        }
        let huge = pacing.pace(100_000_000);
        assert_eq!(huge.beat_secs, nats_layout::MAX_HEARTBEAT_SECS);
        let odd = Pacing {
            stale_after: secs(1),
            keep_for: secs(0),
            max_beats_per_sec: 0,
        };
        let pace = odd.pace(10);
        assert_eq!((pace.beat_secs, pace.stale_after), (10, secs(2)));
        assert_eq!(
            pace.keep_for, pace.stale_after,
            "kept at least as long as alive"
        );
    }

    /// Given a host's beat kept, when the same beat (or an older one) comes again,
    /// then it is refused as a replay and the kept one stays; a later one replaces it.
    #[test]
    fn a_replayed_or_older_beat_is_refused_and_a_later_one_taken() {
        let mut beats = Beats::default();
        let t0 = Instant::now();
        let at = chrono::Utc::now();
        let first = beat("h1", at);
        assert!(beats.arrive("h1", t0));
        assert_eq!(beats.take("h1", Ok(first.clone()), t0), Receipt::Taken);
        let t1 = t0 + secs(5);
        assert!(beats.arrive("h1", t1));
        assert_eq!(beats.take("h1", Ok(first.clone()), t1), Receipt::Replayed);
        let older = beat("h1", at - chrono::Duration::seconds(1));
        assert_eq!(beats.take("h1", Ok(older), t1), Receipt::Replayed);
        let later = beat("h1", at + chrono::Duration::seconds(5));
        assert_eq!(beats.take("h1", Ok(later.clone()), t1), Receipt::Taken);
        let pace = Pacing::default().pace(1);
        let list = beats.list([], at + chrono::Duration::seconds(5), t1, &pace, false);
        assert_eq!(list[0].beat.as_ref(), Some(&later));
    }

    /// Given beats of h1 arriving closer than [`MIN_GAP`], then only the first is
    /// looked at; and a signed beat whose body names another host is refused.
    #[test]
    fn beats_too_close_are_dropped_and_one_naming_another_host_refused() {
        let mut beats = Beats::default();
        let t0 = Instant::now();
        assert!(beats.arrive("h1", t0));
        assert!(!beats.arrive("h1", t0 + MIN_GAP / 2));
        assert!(
            beats.arrive("h2", t0 + MIN_GAP / 2),
            "another host is not held"
        );
        assert!(beats.arrive("h1", t0 + MIN_GAP));
        let at = chrono::Utc::now();
        assert_eq!(beats.take("h1", Ok(beat("h2", at)), t0), Receipt::Misnamed);
        assert!(!beats.heard("h1"));
    }

    /// Given hosts heard and known, when the coordinator is warming up, then a host
    /// not heard yet, or heard only long ago, is `warming`, never `gone` or `stale`;
    /// once warm, they are `gone` and `stale`.
    #[test]
    fn a_warming_coordinator_says_warming_where_it_cannot_tell() {
        let pace = Pacing::default().pace(3);
        let mut beats = Beats::default();
        let t0 = Instant::now();
        let at = chrono::Utc::now();
        beats.arrive("fresh", t0);
        beats.take("fresh", Ok(beat("fresh", at)), t0);
        beats.arrive("old", t0);
        beats.take(
            "old",
            Ok(beat("old", at - chrono::Duration::seconds(20))),
            t0,
        );
        let known = || ["fresh", "old", "unheard"].map(String::from);
        assert_eq!(
            states(&beats.list(known(), at, t0, &pace, true)),
            [
                ("fresh", HostState::Alive),
                ("old", HostState::Warming),
                ("unheard", HostState::Warming)
            ]
        );
        assert_eq!(
            states(&beats.list(known(), at, t0, &pace, false)),
            [
                ("fresh", HostState::Alive),
                ("old", HostState::Stale),
                ("unheard", HostState::Gone)
            ]
        );
    }

    /// Given a host beating with a key that is not registered, then it is
    /// `unverified` while such beats come; a junk beat does not hide a fresh signed
    /// one; and a silent host is forgotten after `keep_for` (listed `gone` if known).
    #[test]
    fn unverified_stale_and_forgotten_hosts() {
        let pace = Pacing::default().pace(3);
        let mut beats = Beats::default();
        let t0 = Instant::now();
        let at = chrono::Utc::now();
        beats.arrive("rogue", t0);
        assert_eq!(beats.take("rogue", Err(()), t0), Receipt::Unverified);
        beats.arrive("h1", t0);
        beats.take("h1", Ok(beat("h1", at)), t0);
        beats.arrive("h1", t0 + secs(1));
        beats.take("h1", Err(()), t0 + secs(1));
        let list = beats.list([], at, t0 + secs(1), &pace, false);
        assert_eq!(
            states(&list),
            [("h1", HostState::Alive), ("rogue", HostState::Unverified)]
        );
        assert!(list[1].beat.is_none() && list[1].age_secs.is_none());
        // 40 s later: h1's beat is stale, the rogue's junk long past.
        let later = t0 + secs(40);
        let list = beats.list([], at + chrono::Duration::seconds(40), later, &pace, false);
        assert_eq!(states(&list), [("h1", HostState::Stale)]);
        assert_eq!(list[0].age_secs, Some(40));
        // Past keep_for (60 s): forgotten; a known host is `gone`.
        beats.forget_silent(t0 + secs(61), pace.keep_for);
        assert!(beats.is_empty());
        let list = beats.list(["h1".to_string()], at, t0 + secs(61), &pace, false);
        assert_eq!(states(&list), [("h1", HostState::Gone)]);
    }
}

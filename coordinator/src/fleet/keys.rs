//! The hosts' registered public keys (`capstan_host_keys`, key = host, written by
//! coordinators only): what every host publication is checked against
//! ([`capstan_common::published`]). Each coordinator keeps a copy, fed by a watch of
//! the bucket, so a check costs no NATS read; a registration through this
//! coordinator is in its copy at once, one through another within the watch's lag.

use super::FleetError;
use async_nats::jetstream::kv;
use capstan_common::published::{self, HostKeys, Publication, Unverified};
use capstan_common::signing::public_key;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// One host's entry: its public keys, oldest first (a re-keyed host keeps its
/// old key until it is removed, so its older records still verify).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub host: String,
    pub public_keys: Vec<String>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// The most keys one host may have registered at once.
pub const MAX_KEYS: usize = 8;
/// How many checked batch signatures a coordinator remembers (then it forgets them
/// all and starts again): a page of records from one batch costs one check.
const CHECKED: usize = 4096;

/// Feeds `copy` from a watch of `bucket` for ever; says `ready` once the first
/// `initial` entries (the bucket's values when it started) are in.
async fn follow(
    bucket: kv::Store,
    copy: Arc<RwLock<BTreeMap<String, HostKeys>>>,
    initial: u64,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut pending = initial;
    if pending == 0 {
        let _ = ready.take().map(|t| t.send(()));
    }
    loop {
        match bucket.watch_all().await {
            Ok(mut watch) => {
                while let Some(entry) = watch.next().await {
                    let Ok(entry) = entry else { continue };
                    let mut map = copy.write().unwrap_or_else(|e| e.into_inner());
                    match (entry.operation, parse(&entry.key, &entry.value)) {
                        (kv::Operation::Put, Some(keys)) if !keys.keys.is_empty() => {
                            map.insert(entry.key.clone(), keys);
                        }
                        _ => {
                            map.remove(&entry.key);
                        }
                    }
                    drop(map);
                    pending = pending.saturating_sub(1);
                    if pending == 0 || entry.delta == 0 {
                        let _ = ready.take().map(|t| t.send(()));
                    }
                }
                tracing::warn!("the watch of the host keys ended; starting it again");
            }
            Err(e) => tracing::warn!(error = %e, "cannot watch the host keys; retrying"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The registry and this coordinator's copy of it.
pub(super) struct Registry {
    bucket: kv::Store,
    copy: Arc<RwLock<BTreeMap<String, HostKeys>>>,
    /// Hosts without a key pass unchecked (`allow_unregistered_hosts`).
    allow_unregistered: bool,
    /// Batches whose signature was checked: a digest of the host, its keys then, the
    /// signed bytes and the signature.
    checked: std::sync::Mutex<std::collections::HashSet<[u8; 32]>>,
    _watch: tokio::task::JoinHandle<()>,
}

/// The key `key` (64 hex digits) as `host`'s registration stores it (lower-case), or
/// why it may not be registered for `host` given the registry `copy`: not a key, a
/// weak one (a point of small order, such as all zeros: no signature proves anything
/// with it, and `verify_strict` would refuse every one), or one registered for
/// another host (a key is one host's: with it, that host could publish as this one).
fn admit(copy: &BTreeMap<String, HostKeys>, host: &str, key: &str) -> Result<String, FleetError> {
    let parsed =
        public_key(key).map_err(|e| FleetError::BadRequest(format!("`public_key`: {e}")))?;
    if parsed.is_weak() {
        return Err(FleetError::BadRequest(
            "`public_key`: a weak ed25519 key (a point of small order, such as all zeros): \
             nothing signed with it proves anything"
                .to_string(),
        ));
    }
    let key = key.trim().to_ascii_lowercase();
    if let Some(other) = copy
        .iter()
        .find(|(h, keys)| h.as_str() != host && keys.keys.contains(&parsed))
    {
        return Err(FleetError::KeyConflict {
            key,
            host: other.0.clone(),
        });
    }
    Ok(key)
}

fn parse(host: &str, bytes: &[u8]) -> Option<HostKeys> {
    let entry: Entry = serde_json::from_slice(bytes).ok()?;
    if entry.host != host {
        return None;
    }
    HostKeys::from_hex(host, entry.public_keys.iter().map(String::as_str)).ok()
}

impl Registry {
    /// Starts following `bucket`; returns once the copy holds every entry (or after
    /// 10 s: the watch goes on filling it). A watch that ends (an outage the client
    /// could not ride out) is started again, replaying every entry.
    pub(super) async fn open(
        bucket: kv::Store,
        allow_unregistered: bool,
    ) -> Result<Registry, FleetError> {
        let copy = Arc::new(RwLock::new(BTreeMap::new()));
        let initial = bucket.status().await.map_err(FleetError::nats)?.values();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(follow(bucket.clone(), Arc::clone(&copy), initial, ready_tx));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), ready).await;
        Ok(Registry {
            bucket,
            copy,
            allow_unregistered,
            checked: Default::default(),
            _watch: task,
        })
    }

    /// The keys registered for `host` (none: an empty set).
    pub(super) fn of(&self, host: &str) -> HostKeys {
        self.copy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
            .cloned()
            .unwrap_or_else(|| HostKeys {
                host: host.to_string(),
                keys: Vec::new(),
            })
    }

    /// Whether `host` has a key registered: in this coordinator's copy, else in the
    /// bucket itself (a registration through another coordinator reaches the copy
    /// only within the watch's lag; a miss costs one get).
    pub(super) async fn registered(&self, host: &str) -> Result<bool, FleetError> {
        if !self.of(host).keys.is_empty() {
            return Ok(true);
        }
        Ok(self
            .entry(host)
            .await?
            .is_some_and(|e| !e.public_keys.is_empty()))
    }

    /// Every host with a registered key.
    pub(super) fn hosts(&self) -> Vec<String> {
        let copy = self.copy.read().unwrap_or_else(|e| e.into_inner());
        copy.keys().cloned().collect()
    }

    /// How many hosts have a registered key.
    pub(super) fn count(&self) -> usize {
        self.copy.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Checks a publication of `host` (its signature and, for a batch member, its
    /// proof, from `headers`): signed by one of its keys, or the host has none and
    /// unregistered hosts are allowed. A batch's signature, once checked, is not
    /// checked again for its other members (their proofs still are).
    pub(super) fn check(
        &self,
        host: &str,
        what: Publication<'_>,
        payload: &[u8],
        headers: Option<&async_nats::HeaderMap>,
    ) -> Result<(), Unverified> {
        let keys = self.of(host);
        if keys.keys.is_empty() && self.allow_unregistered {
            return Ok(());
        }
        let get = |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        let (sig, proof) = (get(published::HEADER), get(published::PROOF_HEADER));
        if !what.batched() {
            return keys.verify(what, payload, sig, proof);
        }
        if keys.keys.is_empty() {
            return Err(Unverified::NoKey(host.to_string()));
        }
        let sig = sig.ok_or(Unverified::Unsigned)?;
        let message = published::batch_signed_bytes(what, payload, proof)?;
        let seen = {
            use sha2::Digest as _;
            let mut h = sha2::Sha256::new();
            h.update(host.as_bytes());
            h.update([0]);
            // The keys it was checked against: once one is unregistered, what only it
            // signed is checked again (and refused), never taken from memory.
            keys.keys.iter().for_each(|k| h.update(k.as_bytes()));
            h.update(&message);
            h.update(sig.as_bytes());
            <[u8; 32]>::from(h.finalize())
        };
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if checked.contains(&seen) {
            return Ok(());
        }
        drop(checked);
        keys.verify_bytes(&message, sig)?;
        checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if checked.len() >= CHECKED {
            checked.clear();
        }
        checked.insert(seen);
        Ok(())
    }

    /// The registry entry of `host`, if any.
    pub(super) async fn entry(&self, host: &str) -> Result<Option<Entry>, FleetError> {
        let Some(bytes) = self.bucket.get(host).await.map_err(FleetError::nats)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| FleetError::Nats(format!("the key entry of {host} is unreadable: {e}")))
    }

    /// Adds `key` (64 hex digits) to `host`'s keys; a key already there changes
    /// nothing. Compare-and-set on the entry's revision, so two coordinators adding
    /// at once both land. A weak key, or one registered for another host (in this
    /// coordinator's copy), is refused ([`admit`]).
    pub(super) async fn add(&self, host: &str, key: &str) -> Result<Entry, FleetError> {
        let key = {
            let copy = self.copy.read().unwrap_or_else(|e| e.into_inner());
            admit(&copy, host, key)?
        };
        self.update(host, |keys| {
            if !keys.contains(&key) {
                if keys.len() >= MAX_KEYS {
                    return Err(FleetError::BadRequest(format!(
                        "host {host} has {MAX_KEYS} keys registered already; remove one first"
                    )));
                }
                keys.push(key.clone());
            }
            Ok(())
        })
        .await
    }

    /// Removes `key` from `host`'s keys (the entry goes with its last key).
    pub(super) async fn remove(&self, host: &str, key: &str) -> Result<Entry, FleetError> {
        let key = key.trim().to_ascii_lowercase();
        self.update(host, |keys| {
            let before = keys.len();
            keys.retain(|k| *k != key);
            if keys.len() == before {
                return Err(FleetError::KeyNotFound(host.to_string()));
            }
            Ok(())
        })
        .await
    }

    async fn update(
        &self,
        host: &str,
        change: impl Fn(&mut Vec<String>) -> Result<(), FleetError>,
    ) -> Result<Entry, FleetError> {
        for _ in 0..16 {
            let current = self.bucket.entry(host).await.map_err(FleetError::nats)?;
            let (mut keys, revision) = match &current {
                Some(e) if e.operation == kv::Operation::Put => {
                    let entry: Entry = serde_json::from_slice(&e.value).map_err(|e| {
                        FleetError::Nats(format!("the key entry of {host} is unreadable: {e}"))
                    })?;
                    (entry.public_keys, Some(e.revision))
                }
                Some(e) => (Vec::new(), Some(e.revision)),
                None => (Vec::new(), None),
            };
            change(&mut keys)?;
            let entry = Entry {
                host: host.to_string(),
                public_keys: keys,
                updated_at: chrono::Utc::now(),
            };
            let value = serde_json::to_vec(&entry).expect("entries serialise");
            let written = match revision {
                Some(r) => self.bucket.update(host, value.into(), r).await.is_ok(),
                None => self.bucket.create(host, value.into()).await.is_ok(),
            };
            if written {
                let parsed = parse(
                    host,
                    &serde_json::to_vec(&entry).expect("entries serialise"),
                );
                let mut copy = self.copy.write().unwrap_or_else(|e| e.into_inner());
                match parsed {
                    Some(keys) if !keys.keys.is_empty() => copy.insert(host.to_string(), keys),
                    _ => copy.remove(host),
                };
                return Ok(entry);
            }
        }
        Err(FleetError::Nats(format!(
            "the key entry of {host} kept changing under this update; try again"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::signing::Signer;

    fn registry(entries: &[(&str, &str)]) -> BTreeMap<String, HostKeys> {
        entries
            .iter()
            .map(|(h, k)| ((*h).to_string(), HostKeys::from_hex(h, [*k]).unwrap()))
            .collect()
    }

    #[test]
    fn a_key_registered_for_another_host_is_refused_naming_it() {
        let a = Signer::generate().unwrap().public_hex();
        let b = Signer::generate().unwrap().public_hex();
        let copy = registry(&[("web-1", &a)]);
        assert_eq!(admit(&copy, "web-1", &a).unwrap(), a, "its own again");
        assert_eq!(admit(&copy, "web-2", &b).unwrap(), b);
        let err = admit(&copy, "web-2", &a.to_ascii_uppercase()).unwrap_err();
        assert!(
            matches!(&err, FleetError::KeyConflict { key, host } if *key == a && host == "web-1"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("the key {a} is registered for host web-1: a key is one host's; unregister it there first")
        );
    }

    #[test]
    fn weak_keys_are_refused() {
        // All zeros (a point of order 4), the identity (1, 0…) and a point of order 8.
        let order8 = "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a";
        let identity = format!("01{}", "0".repeat(62));
        for weak in ["0".repeat(64), identity, order8.to_string()] {
            let err = admit(&BTreeMap::new(), "web-1", &weak).unwrap_err();
            assert!(
                matches!(&err, FleetError::BadRequest(m) if m.contains("weak")),
                "{weak}: {err:?}"
            );
        }
        assert!(matches!(
            admit(&BTreeMap::new(), "web-1", "zz"),
            Err(FleetError::BadRequest(_))
        ));
    }
}

//! systemd's manager over D-Bus: jobs waited on to their end, unit states read in one
//! place, reloads coalesced, and the stream of unit state changes. Everything the
//! driver asks systemd goes through here; nothing here knows about revisions.

use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use zbus::proxy::CacheProperties;
use zbus::{OwnedObjectPath, OwnedVariant};
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};

/// The object path prefix of every unit named `capstan-…`.
const OUR_UNIT_PATHS: &str = "/org/freedesktop/systemd1/unit/capstan_2d";

/// A D-Bus call or a job that did not end as asked.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to the bus at {address}")]
    Connect {
        address: String,
        #[source]
        source: zbus::Error,
    },
    #[error("{call} {unit}")]
    Call {
        call: &'static str,
        unit: String,
        #[source]
        source: zbus::Error,
    },
    /// The job ran and ended with another result than `done`.
    #[error("{verb} job of {unit} ended `{job_result}` (unit result `{unit_result}`)")]
    Job {
        verb: &'static str,
        unit: String,
        job_result: String,
        unit_result: String,
    },
    #[error("{verb} job of {unit} did not end within {0:?}", timeout)]
    JobTimeout {
        verb: &'static str,
        unit: String,
        timeout: Duration,
    },
    #[error("the job stream ended before the {verb} job of {unit} did")]
    StreamEnded { verb: &'static str, unit: String },
}

impl BusError {
    /// The unit's `Result` when a job failed, e.g. `exit-code` or `start-limit-hit`.
    pub fn unit_result(&self) -> Option<&str> {
        match self {
            BusError::Job { unit_result, .. } => Some(unit_result),
            _ => None,
        }
    }
}

/// What systemd says about one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitStatus {
    /// `loaded`, `not-found`, `error`, `masked`…
    pub load_state: String,
    /// `active`, `activating`, `deactivating`, `inactive`, `failed`, `reloading`.
    pub active_state: String,
    pub sub_state: String,
    /// The unit's `Result`: `success`, `exit-code`, `signal`, `start-limit-hit`…
    pub result: String,
    /// `ActiveEnterTimestamp` in µs since the epoch (0: never active).
    pub active_enter_timestamp: u64,
    /// The main process's exit status, when it exited.
    pub exec_main_status: i32,
    /// How often systemd restarted it (`Restart=`) since it was last started.
    pub n_restarts: u32,
}

impl UnitStatus {
    pub fn is_running(&self) -> bool {
        is_running(&self.active_state)
    }
}

/// Whether a unit in `active_state` runs. `activating` includes `auto-restart`:
/// systemd is bringing it back.
pub fn is_running(active_state: &str) -> bool {
    matches!(active_state, "active" | "activating" | "reloading")
}

/// A change of a unit's state, as the signal carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub unit: String,
    pub active_state: String,
    pub sub_state: String,
}

/// What one `PropertiesChanged` signal of one of our units said, in the order
/// systemd sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Its `ActiveState` (interface `org.freedesktop.systemd1.Unit`).
    State(StateChange),
    /// Its main process's `ExecMainStatus` (interface `…Service`). systemd sends a
    /// unit's service properties just before its unit properties, with the values
    /// of that moment: the status that goes with the state change that follows (a
    /// status read later may already be the next run's).
    MainStatus { unit: String, status: i32 },
}

/// The connection to one systemd's manager.
pub struct Bus {
    conn: zbus::Connection,
    manager: ManagerProxy<'static>,
    job_timeout: Duration,
    /// Reload coalescing: `written` counts file changes, `reloaded` is the last count
    /// a finished reload covered; one reload at a time.
    written: AtomicU64,
    reloaded: AtomicU64,
    reloading: tokio::sync::Mutex<()>,
    reloads: AtomicU64,
}

impl Bus {
    /// Connects to `address` (`unix:path=…`; `None`: the system bus) and subscribes to
    /// the manager's signals.
    pub async fn connect(address: Option<&str>, job_timeout: Duration) -> Result<Bus, BusError> {
        let shown = address.unwrap_or("the system bus").to_string();
        let connect_error = |source| BusError::Connect {
            address: shown.clone(),
            source,
        };
        let builder = match address {
            Some(a) => zbus::connection::Builder::address(a),
            None => zbus::connection::Builder::system(),
        };
        let conn = builder.build().await.map_err(connect_error)?;
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(connect_error)?;
        // Without a subscriber systemd sends no JobRemoved and no unit changes.
        manager.subscribe().await.map_err(connect_error)?;
        Ok(Bus {
            conn,
            manager,
            job_timeout,
            written: AtomicU64::new(0),
            reloaded: AtomicU64::new(0),
            reloading: tokio::sync::Mutex::new(()),
            reloads: AtomicU64::new(0),
        })
    }

    /// systemd's version string (e.g. `252.38-1~deb12u1`).
    pub async fn version(&self) -> Result<String, BusError> {
        self.manager.version().await.map_err(call("Version", ""))
    }

    /// Notes that unit files changed on disk; returns the change's number for
    /// [`Bus::reload_covering`].
    pub fn files_changed(&self) -> u64 {
        self.written.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Makes sure a reload that began after change `change` has finished. Concurrent
    /// callers share reloads: a rollout of many units needs one or two, not one each.
    pub async fn reload_covering(&self, change: u64) -> Result<(), BusError> {
        if self.reloaded.load(Ordering::SeqCst) >= change {
            return Ok(());
        }
        let _one = self.reloading.lock().await;
        if self.reloaded.load(Ordering::SeqCst) >= change {
            return Ok(());
        }
        // Let the operations that are already running write their files first (they
        // then wait on the lock): a burst shares this one reload instead of this one,
        // which would cover only the first few, and another for the rest. A lone
        // caller loses one turn of the scheduler.
        tokio::task::yield_now().await;
        // Everything written up to here is on disk: this reload covers it all.
        let covers = self.written.load(Ordering::SeqCst);
        self.manager.reload().await.map_err(call("Reload", ""))?;
        self.reloads.fetch_add(1, Ordering::Relaxed);
        self.reloaded.fetch_max(covers, Ordering::SeqCst);
        Ok(())
    }

    /// Reloads if any change is not covered yet.
    pub async fn reload_if_needed(&self) -> Result<(), BusError> {
        self.reload_covering(self.written.load(Ordering::SeqCst))
            .await
    }

    /// How many reloads this connection made (for benchmarks and tests).
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    pub async fn start(&self, unit: &str) -> Result<(), BusError> {
        self.job("start", unit).await
    }

    pub async fn restart(&self, unit: &str) -> Result<(), BusError> {
        self.job("restart", unit).await
    }

    pub async fn stop(&self, unit: &str) -> Result<(), BusError> {
        self.job("stop", unit).await
    }

    /// Enables `unit` as its `[Install]` says (started at boot); idempotent.
    pub async fn enable(&self, unit: &str) -> Result<(), BusError> {
        self.manager
            .enable_unit_files(vec![unit.to_string()], false, false)
            .await
            .map(drop)
            .map_err(call("EnableUnitFiles", unit))
    }

    /// Disables `unit` (not started at boot); idempotent, and a unit whose file is
    /// gone is already disabled.
    pub async fn disable(&self, unit: &str) -> Result<(), BusError> {
        match self
            .manager
            .disable_unit_files(vec![unit.to_string()], false)
            .await
        {
            Err(e) if is_no_such_unit(&e) => Ok(()),
            other => other.map(drop).map_err(call("DisableUnitFiles", unit)),
        }
    }

    /// Forgets a unit's failure (and its start-limit count) so it can start again.
    pub async fn reset_failed(&self, unit: &str) -> Result<(), BusError> {
        match self.manager.reset_failed_unit(unit.to_string()).await {
            // Not loaded: nothing to reset.
            Err(e) if is_no_such_unit(&e) => Ok(()),
            other => other.map_err(call("ResetFailedUnit", unit)),
        }
    }

    /// Queues `verb` for `unit` (mode `replace`) and waits for its `JobRemoved`. The
    /// signal stream is opened before the call, so a job that ends at once is seen,
    /// and drained while the call's reply is awaited: zbus reads nothing more from the
    /// socket (the reply included) while a stream's queue is full, so a burst of other
    /// jobs' ends before the reply would otherwise block the connection for good.
    async fn job(&self, verb: &'static str, unit: &str) -> Result<(), BusError> {
        let mut removed = self
            .manager
            .receive_job_removed()
            .await
            .map_err(call("JobRemoved", unit))?;
        let (name, mode) = (unit.to_string(), "replace".to_string());
        let queued = async {
            match verb {
                "start" => self.manager.start_unit(name, mode).await,
                "restart" => self.manager.restart_unit(name, mode).await,
                _ => self.manager.stop_unit(name, mode).await,
            }
        };
        tokio::pin!(queued);
        let mut early = Vec::new();
        let queued = loop {
            tokio::select! {
                queued = &mut queued => break queued,
                Some(signal) = removed.next() => early.push(signal),
            }
        };
        let job: OwnedObjectPath = match queued {
            // Not loaded: not running, so already stopped.
            Err(e) if verb == "stop" && is_no_such_unit(&e) => return Ok(()),
            other => other.map_err(call(verb_call(verb), unit))?,
        };
        let ended = |signal: &zbus_systemd::systemd1::JobRemoved| {
            let args = signal.args().ok()?;
            (args.job.as_str() == job.as_str()).then(|| args.result.to_string())
        };
        let wait = async {
            if let Some(result) = early.iter().find_map(ended) {
                return Some(result);
            }
            while let Some(signal) = removed.next().await {
                if let Some(result) = ended(&signal) {
                    return Some(result);
                }
            }
            None
        };
        let result = tokio::time::timeout(self.job_timeout, wait)
            .await
            .map_err(|_| BusError::JobTimeout {
                verb,
                unit: unit.into(),
                timeout: self.job_timeout,
            })?
            .ok_or_else(|| BusError::StreamEnded {
                verb,
                unit: unit.into(),
            })?;
        if result == "done" {
            return Ok(());
        }
        let unit_result = match self.status(unit).await {
            Ok(s) => s.result,
            Err(_) => "unknown".into(),
        };
        Err(BusError::Job {
            verb,
            unit: unit.into(),
            job_result: result,
            unit_result,
        })
    }

    /// The unit's state, loading it from disk if systemd has not yet.
    pub async fn status(&self, unit: &str) -> Result<UnitStatus, BusError> {
        let path = self
            .manager
            .load_unit(unit.to_string())
            .await
            .map_err(call("LoadUnit", unit))?;
        self.status_at(unit, path).await
    }

    async fn status_at(&self, unit: &str, path: OwnedObjectPath) -> Result<UnitStatus, BusError> {
        let err = |what| call(what, unit);
        let u = UnitProxy::builder(&self.conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(err("Unit"))?;
        let s = ServiceProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(err("Service"))?;
        // Two round trips: the unit's properties together, then (for a unit that is
        // loaded) its service's, each batch sent at once over the one connection.
        let (load_state, active_state, sub_state, active_enter_timestamp) = futures::try_join!(
            async { u.load_state().await.map_err(err("LoadState")) },
            async { u.active_state().await.map_err(err("ActiveState")) },
            async { u.sub_state().await.map_err(err("SubState")) },
            async {
                u.active_enter_timestamp()
                    .await
                    .map_err(err("ActiveEnterTimestamp"))
            },
        )?;
        let (result, exec_main_status, n_restarts) = if load_state == "loaded" {
            futures::try_join!(
                async { s.result().await.map_err(err("Result")) },
                async { s.exec_main_status().await.map_err(err("ExecMainStatus")) },
                async { s.n_restarts().await.map_err(err("NRestarts")) },
            )?
        } else {
            (String::new(), 0, 0)
        };
        Ok(UnitStatus {
            load_state,
            active_state,
            sub_state,
            result,
            active_enter_timestamp,
            exec_main_status,
            n_restarts,
        })
    }

    /// The states of every loaded unit named `capstan-*`: name → (active, sub).
    pub async fn list_ours(&self) -> Result<HashMap<String, (String, String)>, BusError> {
        let units = self
            .manager
            .list_units_by_patterns(vec![], vec!["capstan-*".into()])
            .await
            .map_err(call("ListUnitsByPatterns", "capstan-*"))?;
        Ok(units.into_iter().map(|u| (u.0, (u.3, u.4))).collect())
    }

    /// A stream of the state changes (and main exit statuses) of units named
    /// `capstan-*`, in the order systemd sent them (one match rule, one stream).
    /// Opened before it returns: no change after this call is missed.
    pub async fn watch(
        &self,
    ) -> Result<impl futures::Stream<Item = Change> + Send + 'static, BusError> {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.systemd1")
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path_namespace("/org/freedesktop/systemd1/unit")
            .build()
            .map_err(call("AddMatch", "PropertiesChanged"))?;
        let mut stream = zbus::MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(call("AddMatch", "PropertiesChanged"))?;
        // Drained by a task of its own into an unbounded queue: zbus reads nothing more
        // from the socket (replies included) while a stream's queue is full, and a
        // reload signals a change of every unit at once — the caller may be awaiting a
        // call (e.g. `list_ours` right after this) instead of reading its stream.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = stream.next() => message,
                    () = tx.closed() => return,
                };
                let Some(message) = message else { return };
                if let Some(change) = message.ok().as_ref().and_then(change) {
                    if tx.send(change).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|change| (change, rx))
        }))
    }
}

/// A `PropertiesChanged` of one of our units that carries its `ActiveState` or its
/// service's `ExecMainStatus`.
fn change(message: &zbus::Message) -> Option<Change> {
    let header = message.header();
    let path = header.path()?.as_str().to_string();
    if !path.starts_with(OUR_UNIT_PATHS) {
        return None;
    }
    let (interface, changed, _): (String, HashMap<String, OwnedVariant>, Vec<String>) =
        message.body().deserialize().ok()?;
    let value = |key: &str| changed.get(key)?.try_clone().ok();
    let unit = unit_from_path(&path)?;
    match interface.as_str() {
        "org.freedesktop.systemd1.Unit" => Some(Change::State(StateChange {
            unit,
            active_state: String::try_from(value("ActiveState")?).ok()?,
            sub_state: value("SubState")
                .and_then(|v| String::try_from(v).ok())
                .unwrap_or_default(),
        })),
        "org.freedesktop.systemd1.Service" => Some(Change::MainStatus {
            unit,
            status: i32::try_from(value("ExecMainStatus")?).ok()?,
        }),
        _ => None,
    }
}

/// The unit name an object path spells: `_XX` is the byte 0xXX.
pub fn unit_from_path(path: &str) -> Option<String> {
    let label = path.strip_prefix("/org/freedesktop/systemd1/unit/")?;
    let bytes = label.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'_' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn is_no_such_unit(e: &zbus::Error) -> bool {
    matches!(e, zbus::Error::MethodError(name, _, _)
        if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit")
}

fn verb_call(verb: &str) -> &'static str {
    match verb {
        "start" => "StartUnit",
        "restart" => "RestartUnit",
        _ => "StopUnit",
    }
}

fn call(call: &'static str, unit: &str) -> impl FnOnce(zbus::Error) -> BusError {
    let unit = unit.to_string();
    move |source| BusError::Call { call, unit, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_paths_spell_unit_names() {
        assert_eq!(
            unit_from_path("/org/freedesktop/systemd1/unit/capstan_2dns_2dweb_2dr1_2eservice"),
            Some("capstan-ns-web-r1.service".into())
        );
        assert_eq!(
            unit_from_path("/org/freedesktop/systemd1/unit/capstan_2dteam_5cx2da_2eslice"),
            Some("capstan-team\\x2da.slice".into())
        );
        assert_eq!(
            unit_from_path("/org/freedesktop/systemd1/unit/bad_zz"),
            None
        );
        assert_eq!(unit_from_path("/elsewhere"), None);
    }
}

//! Running as a systemd service (`Type=notify`; the shipped units are in
//! `systemd/units/`): telling the manager when the daemon is ready, when it is
//! stopping, what it is doing (the `Status:` line of `systemctl status`), and that it
//! is alive (`WATCHDOG=1`, when the unit sets `WatchdogSec=`). Outside systemd
//! (`$NOTIFY_SOCKET` unset) every call does nothing, so a daemon runs the same by
//! hand, in tests and under systemd.

use sd_notify::NotifyState;
use std::time::Duration;

/// Start-up is done and the daemon serves; `status` says what it serves.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A graceful stop has begun; `status` says why or what it does now.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// What the daemon is doing now (a start-up step, a long stop).
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

fn send(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// The keep-alive of a unit with `WatchdogSec=`: a daemon's main loop awaits
/// [`Watchdog::tick`] beside its work and calls [`Watchdog::alive`] on each tick, so
/// the pings stop (and systemd restarts the service) when that loop stops turning.
pub struct Watchdog {
    interval: Option<tokio::time::Interval>,
}

impl Watchdog {
    /// Ticks at half the unit's `WatchdogSec=` (systemd's advice); never without one.
    pub fn from_env() -> Watchdog {
        Watchdog {
            interval: sd_notify::watchdog_enabled().map(|period| {
                let mut interval =
                    tokio::time::interval((period / 2).max(Duration::from_millis(1)));
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                interval
            }),
        }
    }

    /// The watchdog period's half, if the unit has a watchdog.
    pub fn interval(&self) -> Option<Duration> {
        self.interval.as_ref().map(|i| i.period())
    }

    /// Waits for the next ping's time; pending forever without a watchdog.
    pub async fn tick(&mut self) {
        match &mut self.interval {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// Sends the ping.
    pub fn alive(&self) {
        send(&[NotifyState::Watchdog]);
    }
}

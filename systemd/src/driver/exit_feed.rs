//! The exit feed: our units' state changes as systemd signals them on the bus,
//! forwarded as [`Exit`]s ([`is_exit`] decides which are).

use super::exits::is_exit;
use super::{backend, SystemdDriver};
use crate::bus::Change;
use capstan_common::ErrorCode;
use capstan_driver::{DriverError, Exit};
use futures::StreamExt;
use std::collections::HashMap;

impl SystemdDriver {
    /// Sends an [`Exit`] for each of our units that stops running, until `exits` is
    /// dropped or the bus stream ends.
    pub(super) async fn forward_exits(
        &self,
        exits: tokio::sync::mpsc::Sender<Exit>,
    ) -> Result<(), DriverError> {
        let op = "watch";
        let mut changes = Box::pin(self.bus.watch().await.map_err(backend(op, "units"))?);
        // The last state seen of each unit: an exit is leaving `active`/`deactivating`,
        // or arriving in `failed` (systemd gave up) from anything else.
        // Seeded after the stream is open, so a unit that runs now and exits next is
        // known to have been up; a unit loaded later starts out inactive.
        let mut last: HashMap<String, String> = self
            .bus
            .list_ours()
            .await
            .map_err(backend(op, "units"))?
            .into_iter()
            .map(|(unit, (active, _))| (unit, active))
            .collect();
        // The last `ExecMainStatus` each unit's signals carried.
        let mut statuses: HashMap<String, i32> = HashMap::new();
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                () = exits.closed() => return Ok(()),
            };
            let Some(change) = change else {
                return Err(DriverError::refused(
                    op,
                    "units",
                    ErrorCode::DriverFailed,
                    "the bus stream ended",
                ));
            };
            let change = match change {
                Change::MainStatus { unit, status } => {
                    statuses.insert(unit, status);
                    continue;
                }
                Change::State(change) => change,
            };
            let before = last.insert(change.unit.clone(), change.active_state.clone());
            if !is_exit(before.as_deref(), &change.active_state, &change.sub_state) {
                continue;
            }
            let Ok(Some(m)) = self.ours(op, &change.unit) else {
                continue;
            };
            // The status sent with this change, never one read later: by then systemd
            // may have started the next run (and reset it).
            let exit_code = statuses.get(&change.unit).copied().map(i64::from);
            let exit = Exit {
                namespace: m.namespace,
                workload: m.workload,
                revision: m.revision,
                exit_code,
            };
            if exits.send(exit).await.is_err() {
                return Ok(());
            }
        }
    }
}

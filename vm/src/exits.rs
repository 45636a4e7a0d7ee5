//! The exit feed: one task per running VM holds its events monitor until QEMU closes
//! it (the process exits), waits for the process to be gone, and reports the exit
//! code the guest's init recorded (`None` without a record: a `quit`, a kill, a
//! guest that powered off without writing one). VMs started while the feed runs are
//! told to it by the driver; the feed starts with every VM running then.

use crate::driver::VmDriver;
use crate::launch::Vm;
use crate::process;
use crate::qmp::Qmp;
use capstan_driver::{DriverError, Exit};
use std::collections::HashSet;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;

/// How long QEMU may take to exit after its monitor closed (1–3 s measured).
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Sends every exit of this host's VMs to `exits` until the receiver is dropped.
pub(crate) async fn watch(
    driver: &VmDriver,
    exits: tokio::sync::mpsc::Sender<Exit>,
) -> Result<(), DriverError> {
    let mut started = driver.subscribe();
    let mut watched: HashSet<(String, i32)> = HashSet::new();
    let mut tasks: Tasks = JoinSet::new();
    for running in driver.running() {
        follow(running, &mut watched, &mut tasks);
    }
    loop {
        tokio::select! {
            () = exits.closed() => return Ok(()),
            s = started.recv() => match s {
                Ok(s) => follow(driver.started_vm(&s), &mut watched, &mut tasks),
                // Starts missed: look at what runs now.
                Err(RecvError::Lagged(_)) => {
                    for running in driver.running() {
                        follow(running, &mut watched, &mut tasks);
                    }
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            Some(done) = tasks.join_next() => {
                let Ok((key, exit)) = done else { continue };
                watched.remove(&key);
                tracing::info!(
                    revision = %exit.rev(),
                    exit_code = ?exit.exit_code,
                    "VM exited"
                );
                if exits.send(exit).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

type Tasks = JoinSet<((String, i32), Exit)>;

/// Watches `vm`'s QEMU (`pid`) unless it is watched already.
fn follow(
    (vm, exit, pid): (Vm, Exit, i32),
    watched: &mut HashSet<(String, i32)>,
    tasks: &mut Tasks,
) {
    if watched.insert((vm.name.clone(), pid)) {
        tasks.spawn(async move {
            let mut exit = exit;
            exit.exit_code = until_exit(&vm, pid).await;
            ((vm.name, pid), exit)
        });
    }
}

/// Waits for `vm`'s QEMU (`pid`) to exit; the exit code its guest recorded.
async fn until_exit(vm: &Vm, pid: i32) -> Option<i64> {
    // The events monitor closes when QEMU exits: no polling while it runs. Without it
    // (another client holds it), the process is watched instead.
    match Qmp::connect(&vm.events_socket(), Duration::from_secs(5)).await {
        Ok(qmp) => {
            let _ = qmp.until_closed().await;
        }
        Err(_) => while !process::gone(pid, &vm.name, Duration::from_secs(3600)).await {},
    }
    let _ = process::gone(pid, &vm.name, EXIT_WAIT).await;
    exit_code(vm)
}

/// What the guest's init wrote on its second serial port: `{"exit_code":N}`.
fn exit_code(vm: &Vm) -> Option<i64> {
    let text = std::fs::read_to_string(vm.exit_record()).ok()?;
    let record: serde_json::Value = serde_json::from_str(text.lines().next()?).ok()?;
    record.get("exit_code")?.as_i64()
}

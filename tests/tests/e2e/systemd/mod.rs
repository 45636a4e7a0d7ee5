//! The systemd side: a real systemd per test ([`capstan_tests::systemd::SystemdHost`])
//! and the `capstan-envdump` workload in it.

mod driver;
mod smoke;

use capstan_common::{DriverKind, Spec};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{wait_until, READY};
use serde_json::Value;
use std::path::PathBuf;

/// Where the workload `ns/workload` of [`spec_running`] writes what it saw: its
/// namespace's state directory, which its unit may write.
pub fn dump_path(host: &SystemdHost, ns: &str, workload: &str) -> PathBuf {
    host.state_dir().join(ns).join(format!("{workload}.json"))
}

/// A systemd spec running `capstan-envdump`, which writes its argv and env to
/// [`dump_path`] and runs until stopped.
pub fn spec_running(host: &SystemdHost, ns: &str, workload: &str) -> Spec {
    Spec {
        driver: DriverKind::Systemd,
        image: None,
        command: vec![
            host.envdump().to_string_lossy().into_owned(),
            dump_path(host, ns, workload).to_string_lossy().into_owned(),
        ],
        env: Default::default(),
        working_dir: None,
        mounts: vec![],
        ports: vec![],
        systemd: Default::default(),
    }
}

/// What `ns/workload` saw, once it wrote it.
pub fn dump(host: &SystemdHost, ns: &str, workload: &str) -> Value {
    let path = dump_path(host, ns, workload);
    let text = wait_until(format_args!("{}", path.display()), READY, || {
        std::fs::read_to_string(&path).ok()
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

//! The systemd side: a real systemd per test ([`capstan_tests::systemd::SystemdHost`])
//! and the `capstan-envdump` workload in it.

mod agent;
mod bus;
mod crash_loop;
mod driver;
mod grants;
mod hardening;
mod kit_env;
mod readiness;
pub(crate) mod service;
mod smoke;

use capstan_common::{DriverKind, Spec};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{wait_until, READY};
use serde_json::Value;
use std::path::PathBuf;

/// Where the workload `ns/workload` of [`spec_running`] writes what it saw, as the
/// host sees it: its namespace's state directory, which systemd makes for the unit's
/// (dynamic) user. From the machine, read it at [`SystemdHost::inside`] of this.
pub fn dump_path(host: &SystemdHost, ns: &str, workload: &str) -> PathBuf {
    host.state_dir().join(ns).join(format!("{workload}.json"))
}

/// Where systemd keeps namespace `ns`'s state directory (its units' dynamic users'),
/// in the host's own `/var/lib/private`, from the machine.
pub fn private_state(host: &SystemdHost, ns: &str) -> PathBuf {
    let rel = host
        .state_dir()
        .strip_prefix("/var/lib")
        .expect("the state dir is under /var/lib")
        .join(ns);
    host.dir().join("private").join(rel)
}

/// [`dump_path`] as the machine reaches it.
pub fn dump_file(host: &SystemdHost, ns: &str, workload: &str) -> PathBuf {
    host.inside(&dump_path(host, ns, workload))
}

/// A systemd spec running `capstan-envdump`, which writes its argv and env to
/// [`dump_path`] and runs until stopped.
pub fn spec_running(host: &SystemdHost, ns: &str, workload: &str) -> Spec {
    Spec {
        driver: DriverKind::SYSTEMD,
        command: vec![
            host.envdump().to_string_lossy().into_owned(),
            dump_path(host, ns, workload).to_string_lossy().into_owned(),
        ],
        ..Default::default()
    }
}

/// A systemd spec with `ENVDUMP_EXIT=3` that runs `capstan-envdump` (as
/// [`spec_running`]) like any workload until the file [`crash_flag`] exists; from then
/// on each run writes its dump and exits 3 at once. So the command's start job always
/// succeeds (a process exiting at once can beat systemd's check of its exec, and fail
/// the start job itself), and a crash loop begins when the test kills the running
/// process after creating the flag.
pub fn spec_crashing_once_flagged(host: &SystemdHost, ns: &str, workload: &str) -> Spec {
    let mut spec = spec_running(host, ns, workload);
    let script = format!(
        "[ -e '{}' ] || unset ENVDUMP_EXIT; exec \"$0\" \"$@\"",
        crash_flag(host, ns, workload).display()
    );
    let mut command = vec!["/bin/sh".to_string(), "-c".to_string(), script];
    command.append(&mut spec.command);
    spec.command = command;
    spec.env.insert("ENVDUMP_EXIT".into(), "3".into());
    spec
}

/// The file that turns [`spec_crashing_once_flagged`] into a crash loop.
pub fn crash_flag(host: &SystemdHost, ns: &str, workload: &str) -> PathBuf {
    host.state_dir().join(ns).join(format!("{workload}.crash"))
}

/// Starts the crash loop of [`spec_crashing_once_flagged`]'s running `unit`: the
/// flag, then SIGKILL to the process (a failure, which `Restart=on-failure` restarts).
pub fn start_crash_loop(host: &SystemdHost, ns: &str, workload: &str, unit: &str) {
    std::fs::write(host.inside(&crash_flag(host, ns, workload)), "").expect("write the crash flag");
    host.systemctl_ok(&["kill", "--signal=KILL", unit]);
}

/// The argv of a dump (each entry UTF-8).
pub fn argv(seen: &Value) -> Vec<String> {
    seen["argv"]
        .as_array()
        .unwrap_or_else(|| panic!("argv in {seen}"))
        .iter()
        .map(|a| a.as_str().expect("argv is UTF-8").to_string())
        .collect()
}

/// What `ns/workload` saw, once it wrote it.
pub fn dump(host: &SystemdHost, ns: &str, workload: &str) -> Value {
    let path = dump_file(host, ns, workload);
    let text = wait_until(format_args!("{}", path.display()), READY, || {
        std::fs::read_to_string(&path).ok()
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The variables systemd itself gives every unit's process (besides `LC_*`): whatever
/// else a process sees came from the spec or the launch environment. `USER`,
/// `LOGNAME` (and for an account with a home, `HOME` and `SHELL`) come with `User=`,
/// `STATE_DIRECTORY` with `StateDirectory=`.
pub const SYSTEMD_OWN: &[&str] = &[
    "PATH",
    "INVOCATION_ID",
    "SYSTEMD_EXEC_PID",
    "JOURNAL_STREAM",
    "LANG",
    "LANGUAGE",
    "USER",
    "LOGNAME",
    "HOME",
    "SHELL",
    "STATE_DIRECTORY",
];

/// Whether `name` is one of [`SYSTEMD_OWN`] or a locale variable.
pub fn systemd_own(name: &str) -> bool {
    SYSTEMD_OWN.contains(&name) || name.starts_with("LC_")
}

/// Values a spec may hold that a unit file could misread (line ends, sections,
/// specifiers, expansions, quotes, escapes): each must reach the process byte for
/// byte.
pub const HOSTILE: &[&str] = &[
    "line\nExecStartPre=/bin/sh -c 'touch /pwned'",
    "\"\n[Service]\nExecStart=/bin/false",
    "%h %n %%",
    "$(id) `id` ${HOME} $HOME $$",
    "back\\slash \\\\ \\n \\x41 trailing\\",
    "'single' \"double\"",
    ";",
    "\\;",
    "tab\tcr\rdel\u{7f}bell\u{7}",
    "non-ascii é ✓ \u{2028}",
    "",
    " leading and trailing ",
    "-@+!:",
];

/// [`spec_running`] with every [`HOSTILE`] value appended to its argv and in its env
/// as `HOSTILE_<index>`.
pub fn spec_hostile(host: &SystemdHost, ns: &str, workload: &str) -> Spec {
    let mut spec = spec_running(host, ns, workload);
    spec.command.extend(HOSTILE.iter().map(|s| s.to_string()));
    spec.env = HOSTILE
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("HOSTILE_{i}"), v.to_string()))
        .collect();
    spec
}

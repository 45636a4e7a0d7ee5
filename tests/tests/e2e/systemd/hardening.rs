//! The sandbox of every revision's unit, seen from inside the process a real systemd
//! started: not root, no capabilities, `NoNewPrivs`, a seccomp filter, the namespace's
//! own dynamic user and state directory; exactly the capabilities and system calls a
//! spec asks for; and values that could add a directive refused, by the agent's intake
//! and by the driver itself (docs/systemd.md, *Hardening*).

use super::driver::{connect, rev, up};
use super::{dump, private_state, spec_running};
use capstan_common::{ErrorCode, Settings as _, Spec};
use capstan_driver::{Driver, LaunchEnv, RevisionRef};
use capstan_systemd::{naming, SystemdDriver, SystemdSpec};
use capstan_tests::agent::Agent;
use capstan_tests::process::Exit;
use capstan_tests::systemd::SystemdHost;
use capstan_tests::unique;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;

/// The `Name:\tvalue` lines of `/proc/<MainPID>/status` of `unit`, read in the host.
fn status(host: &SystemdHost, unit: &str) -> BTreeMap<String, String> {
    let pid = host.property(unit, "MainPID");
    let out = host.nsenter(&["cat", &format!("/proc/{pid}/status")]);
    assert!(out.status.success(), "read the status of {unit} ({pid})");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The real, effective, saved and fs uid of `unit`'s main process (all the same).
fn uid(status: &BTreeMap<String, String>) -> u32 {
    let ids: Vec<u32> = status["Uid"]
        .split_whitespace()
        .map(|n| n.parse().expect("a uid"))
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    ids[0]
}

/// Prepares and activates `r` with [`spec_running`] and no launch environment.
fn up_default(
    rt: &tokio::runtime::Runtime,
    d: &SystemdDriver,
    host: &SystemdHost,
    r: RevisionRef<'_>,
) {
    up(
        rt,
        d,
        r,
        &spec_running(host, r.namespace, r.workload),
        &LaunchEnv::new(),
    );
}

fn unit(ns: &str, workload: &str, revision: &str) -> String {
    naming::unit_name(rev(ns, workload, revision))
}

#[test]
fn a_default_unit_runs_unprivileged_as_its_namespaces_dynamic_user() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let default = |ns, w, r| up_default(&rt, &d, &host, rev(ns, w, r));
    default("shop", "web", "r1");
    // It wrote its dump into its namespace's state directory: the default is usable.
    dump(&host, "shop", "web");
    let web = status(&host, &unit("shop", "web", "r1"));
    let id = uid(&web);
    assert_ne!(id, 0, "not root: {web:?}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(web[set], "0000000000000000", "{set}: {web:?}");
    }
    assert_eq!(web["NoNewPrivs"], "1", "{web:?}");
    assert_eq!(web["Seccomp"], "2", "a seccomp filter: {web:?}");
    assert_eq!(
        host.property(&unit("shop", "web", "r1"), "User"),
        "capstan-shop"
    );

    // The directory is the unit user's alone, where systemd keeps it for a dynamic user.
    let dir = private_state(&host, "shop");
    let meta = std::fs::metadata(&dir).expect("the namespace's state directory");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (id, 0o700));

    // Another workload of the namespace, and the next revision, run as the same user
    // and find the namespace's files; another namespace runs as another user.
    for (ns, w, r) in [
        ("shop", "api", "r1"),
        ("shop", "web", "r2"),
        ("other", "web", "r1"),
    ] {
        default(ns, w, r);
    }
    dump(&host, "other", "web");
    assert_eq!(uid(&status(&host, &unit("shop", "api", "r1"))), id);
    assert_eq!(uid(&status(&host, &unit("shop", "web", "r2"))), id);
    assert_ne!(uid(&status(&host, &unit("other", "web", "r1"))), id);
    assert!(dir.join("api.json").exists() && dir.join("web.json").exists());

    // Deleting the namespace removes its state, its units being gone.
    rt.block_on(async {
        for (w, r) in [("web", "r1"), ("web", "r2"), ("api", "r1")] {
            d.retire(rev("shop", w, r)).await?;
        }
        d.delete_namespace("shop").await
    })
    .unwrap_or_else(|e| panic!("delete shop: {}", e.report()));
    assert!(!dir.exists(), "{} is gone", dir.display());
    assert!(!host.inside(&host.state_dir().join("shop")).exists());
    assert!(
        !host.unit_dir().join(naming::cleanup_unit("shop")).exists(),
        "the cleanup unit is gone too"
    );
    assert!(
        private_state(&host, "other").exists(),
        "another namespace's is not"
    );

    // A cleanup unit a delete killed midway left goes when the namespace comes back
    // (started, it would remove the new state); a file of that name not ours stays.
    let leftover = host.unit_dir().join(naming::cleanup_unit("shop"));
    let text = capstan_systemd::unit::cleanup("h1", "shop", &host.state_dir().join("shop"))
        .expect("a cleanup unit");
    std::fs::write(&leftover, text).unwrap();
    rt.block_on(d.ensure_namespace("shop")).unwrap();
    assert!(!leftover.exists(), "the leftover cleanup unit is removed");
    std::fs::write(&leftover, "[Service]\nExecStart=/bin/true\n").unwrap();
    let err = rt.block_on(d.ensure_namespace("shop")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotOwned, "{}", err.report());
    assert!(leftover.exists());
}

#[test]
fn a_spec_gets_exactly_the_capabilities_and_system_calls_it_asks_for() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let mut spec = spec_running(&host, "ns", "web");
    SystemdSpec::edit(&mut spec, |c| {
        c.capabilities = vec!["CAP_NET_BIND_SERVICE".into()]
    });
    SystemdSpec::edit(&mut spec, |c| c.syscalls = vec!["@swap".into()]);
    up(&rt, &d, rev("ns", "web", "r1"), &spec, &LaunchEnv::new());
    dump(&host, "ns", "web");
    let web = status(&host, &unit("ns", "web", "r1"));
    assert_ne!(uid(&web), 0, "still not root: {web:?}");
    // CAP_NET_BIND_SERVICE is bit 10, and only it.
    for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(web[set], "0000000000000400", "{set}: {web:?}");
    }
    assert_eq!(web["NoNewPrivs"], "1");
    // systemd took the extra system calls into the unit's filter, and only asked ones.
    let filter = |u: &str| host.property(u, "SystemCallFilter");
    assert!(
        filter(&unit("ns", "web", "r1")).contains("swapon"),
        "{}",
        filter(&unit("ns", "web", "r1"))
    );
    up_default(&rt, &d, &host, rev("ns", "plain", "r1"));
    assert!(!filter(&unit("ns", "plain", "r1")).contains("swapon"));

    // And a spec may ask for root explicitly, still without capabilities.
    let mut root = spec_running(&host, "ns", "root");
    SystemdSpec::edit(&mut root, |c| c.user = Some("root".into()));
    up(&rt, &d, rev("ns", "root", "r1"), &root, &LaunchEnv::new());
    dump(&host, "ns", "root");
    let root = status(&host, &unit("ns", "root", "r1"));
    assert_eq!(
        (uid(&root), root["CapEff"].as_str()),
        (0, "0000000000000000")
    );
}

/// Values with a newline or a byte outside ASCII, in every field that reaches a unit
/// file, and capabilities off the list: the agent refuses them at intake
/// (`invalid_spec`), and the driver, called directly, refuses them before writing.
#[test]
fn values_that_could_add_a_unit_directive_are_refused_before_anything_is_written() {
    let host = SystemdHost::boot();
    let hostile: Vec<(&str, Value)> = vec![
        ("user", json!({"user": "app\nUser=root"})),
        ("nonascii", json!({"user": "ápp"})),
        (
            "group",
            json!({"group": "g\n[Service]\nExecStartPre=/bin/touch /pwned"}),
        ),
        (
            "capnl",
            json!({"capabilities": ["CAP_CHOWN\nAmbientCapabilities=CAP_SYS_ADMIN"]}),
        ),
        ("capadmin", json!({"capabilities": ["CAP_SYS_ADMIN"]})),
        ("capnonascii", json!({"capabilities": ["CAP_NËT_RAW"]})),
        ("syscallnl", json!({"syscalls": ["read\nUser=root"]})),
        ("syscallneg", json!({"syscalls": ["~@system-service"]})),
    ];
    let a = Agent::builder(&unique("sdharden")).systemd(&host).build();
    let c = a.commands("ns");
    let mut lines = vec![c.ensure_namespace("ns")];
    for (name, systemd) in &hostile {
        let spec = capstan_tests::command::Spec::from(spec_running(&host, "ns", name))
            .with("systemd", systemd.clone());
        lines.push(c.prepare(name, name, "r1", spec));
    }
    let applied = a.apply(&lines);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    for (name, _) in &hostile {
        let r = applied.result(name);
        assert_eq!(r["outcome"], "rejected", "{name}: {r}");
        assert_eq!(r["error"]["code"], "invalid_spec", "{name}: {r}");
        assert!(
            !host.unit_dir().join(unit("ns", name, "r1")).exists(),
            "{name}"
        );
    }
    drop(a);

    // Past intake (a spec built in code): the driver's own escaping refuses them.
    let (rt, d) = connect(&host, |_| {});
    for (name, systemd) in hostile {
        let mut spec: Spec = spec_running(&host, "ns", name);
        let settings: SystemdSpec = serde_json::from_value(systemd).expect("a systemd section");
        settings.write_into(&mut spec);
        let r = rev("ns", name, "r1");
        let err = rt
            .block_on(d.prepare(r, &spec))
            .expect_err("refused by the driver");
        assert_eq!(
            err.code(),
            ErrorCode::InvalidSpec,
            "{name}: {}",
            err.report()
        );
        assert!(
            !host.unit_dir().join(naming::unit_name(r)).exists(),
            "{name}"
        );
    }
    assert!(!std::path::Path::new("/pwned").exists());
}

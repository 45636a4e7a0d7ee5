//! The systemd driver against a real systemd, called directly (the agent's use of it is
//! in the sibling modules): the driver contract, the launch environment reaching the
//! process, restarts only on change, failures carrying systemd's results, exits seen
//! over D-Bus, exact retires, ownership, and reloads shared by concurrent activations.

use super::{dump, spec_running};
use capstan_common::{ErrorCode, Spec};
use capstan_driver::testkit::Kit;
use capstan_driver::{BackendState, Driver, LaunchEnv, RevisionRef};
use capstan_systemd::{naming, SystemdConfig, SystemdDriver};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{wait_until, READY};
use std::collections::BTreeMap;

/// A runtime and a driver on `host`'s systemd, for host name `h1`.
pub fn connect(
    host: &SystemdHost,
    tune: impl FnOnce(&mut SystemdConfig),
) -> (tokio::runtime::Runtime, SystemdDriver) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut config = SystemdConfig {
        bus: Some(host.bus_address()),
        unit_dir: host.unit_dir(),
        state_dir: host.state_dir(),
        ..SystemdConfig::default()
    };
    tune(&mut config);
    let driver = rt
        .block_on(SystemdDriver::connect("h1", config))
        .expect("connect to the test host's systemd");
    (rt, driver)
}

pub fn rev<'a>(ns: &'a str, workload: &'a str, revision: &'a str) -> RevisionRef<'a> {
    RevisionRef {
        namespace: ns,
        workload,
        revision,
    }
}

fn launch(pairs: &[(&str, &str)]) -> LaunchEnv {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Prepares and activates `r` with `launch_env`.
pub fn up(
    rt: &tokio::runtime::Runtime,
    d: &SystemdDriver,
    r: RevisionRef<'_>,
    spec: &Spec,
    env: &LaunchEnv,
) {
    rt.block_on(async {
        d.ensure_namespace(r.namespace).await?;
        d.prepare(r, spec).await?;
        d.activate(r, spec, env, None).await
    })
    .unwrap_or_else(|e| panic!("activate {r}: {}", e.report()));
}

#[test]
fn the_driver_keeps_the_contract() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let mut spec = spec_running(&host, "kit", "contract");
    spec.env.insert("MODE".into(), "spec".into());
    let probe = super::kit_env::UnitEnv::of(&host);
    rt.block_on(Kit::new(&d, "kit", spec).with_env_probe(&probe).run())
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log()));
    assert!(
        naming_files(&host).is_empty(),
        "the kit leaves nothing: {:?}",
        naming_files(&host)
    );
}

/// Our files left in the unit dir.
fn naming_files(host: &SystemdHost) -> Vec<String> {
    std::fs::read_dir(host.unit_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| naming::is_capstan_unit_file(n) || n.ends_with(".d"))
        .collect()
}

#[test]
fn the_process_sees_the_spec_env_then_the_launch_env() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let mut spec = spec_running(&host, "ns", "web");
    spec.env = BTreeMap::from([
        ("MODE".into(), "spec".into()),
        ("TOKEN".into(), "from-spec".into()),
    ]);
    let r1 = rev("ns", "web", "r1");
    up(
        &rt,
        &d,
        r1,
        &spec,
        &launch(&[("TOKEN", "opaque-t1"), ("IAM", "opaque-role")]),
    );
    let seen = dump(&host, "ns", "web");
    let env = &seen["env"];
    assert_eq!(env["MODE"], "spec");
    assert_eq!(
        env["TOKEN"], "opaque-t1",
        "the launch env wins on a shared name"
    );
    assert_eq!(env["IAM"], "opaque-role");
    let ours = ["MODE", "TOKEN", "IAM"];
    // Whatever else is there is systemd's own, never a leftover or an injection.
    for name in env.as_object().unwrap().keys() {
        assert!(
            ours.contains(&name.as_str()) || super::systemd_own(name),
            "unexpected variable {name} in {env}"
        );
    }
    let unit = naming::unit_name(r1);
    let dropin = host
        .unit_dir()
        .join(naming::dropin_dir(&unit))
        .join(naming::ENV_DROPIN);
    assert!(dropin.exists(), "the environment lives in the drop-in");
    assert!(
        !std::fs::read_to_string(host.unit_dir().join(&unit))
            .unwrap()
            .contains("opaque-"),
        "the unit itself carries no launch environment"
    );
}

#[test]
fn hostile_values_reach_the_process_byte_for_byte_or_are_refused() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let big = "x%$\\\"".repeat(64 * 1024 / 5);
    let mut spec = super::spec_hostile(&host, "ns", "hostile");
    spec.command.push(big.clone());
    spec.env.insert("HOSTILE_BIG".into(), big.clone());
    up(
        &rt,
        &d,
        rev("ns", "hostile", "r1"),
        &spec,
        &LaunchEnv::new(),
    );
    let seen = dump(&host, "ns", "hostile");
    assert_eq!(super::argv(&seen), spec.command, "argv byte for byte");
    for (name, value) in &spec.env {
        assert_eq!(seen["env"][name], value.as_str(), "{name} byte for byte");
    }
    assert!(!std::path::Path::new("/pwned").exists());
    let unit_text = std::fs::read_to_string(
        host.unit_dir()
            .join(naming::unit_name(rev("ns", "hostile", "r1"))),
    )
    .unwrap();
    let sections: Vec<&str> = unit_text.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(
        sections,
        ["[Unit]", "[Service]", "[Install]"],
        "no value added a section"
    );

    // What cannot be written is refused with a code, and nothing is written for it.
    let mut nul = spec_running(&host, "ns", "nul");
    nul.env.insert("BAD".into(), "a\0b".into());
    let mut dollar_program = spec_running(&host, "ns", "prog");
    dollar_program.command[0] = "/bin/$HOME".into();
    for (workload, spec, code) in [
        ("nul", nul, ErrorCode::InvalidEnv),
        ("prog", dollar_program, ErrorCode::InvalidSpec),
    ] {
        let r = rev("ns", workload, "r1");
        let err = rt
            .block_on(async {
                d.prepare(r, &spec).await?;
                d.activate(r, &spec, &LaunchEnv::new(), None).await
            })
            .expect_err("refused");
        assert_eq!(err.code(), code, "{workload}: {}", err.report());
        assert!(
            !host.unit_dir().join(naming::unit_name(r)).exists(),
            "{workload}: nothing written"
        );
    }
}

#[test]
fn reactivation_restarts_once_on_a_change_and_never_without_one() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let spec = spec_running(&host, "ns", "web");
    let r1 = rev("ns", "web", "r1");
    let unit = naming::unit_name(r1);
    up(&rt, &d, r1, &spec, &launch(&[("T", "opaque-1")]));
    let first = dump(&host, "ns", "web");
    let entered = host.property(&unit, "ActiveEnterTimestamp");
    let reloads = d.bus().reloads();

    rt.block_on(d.activate(r1, &spec, &launch(&[("T", "opaque-1")]), None))
        .unwrap();
    assert_eq!(
        host.property(&unit, "ActiveEnterTimestamp"),
        entered,
        "no restart"
    );
    assert_eq!(d.bus().reloads(), reloads, "no reload either");

    std::fs::remove_file(super::dump_file(&host, "ns", "web")).unwrap();
    rt.block_on(d.activate(r1, &spec, &launch(&[("T", "opaque-2")]), None))
        .unwrap();
    let second = dump(&host, "ns", "web");
    assert_eq!(second["env"]["T"], "opaque-2");
    assert_ne!(second["pid"], first["pid"], "restarted");
    let starts = host
        .journal(&["-u", &unit, "-o", "cat"])
        .lines()
        .filter(|l| l.starts_with("Started "))
        .count();
    assert_eq!(starts, 2, "one start, then one restart");
}

#[test]
fn a_failed_start_carries_the_job_result_and_the_units_result() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let mut spec = spec_running(&host, "ns", "bad");
    // A program that is not there: the start job fails (`Type=exec`).
    spec.command[0] = "/nonexistent/capstan-envdump".into();
    let r1 = rev("ns", "bad", "r1");
    let err = rt
        .block_on(async {
            d.ensure_namespace("ns").await?;
            d.prepare(r1, &spec).await?;
            d.activate(r1, &spec, &LaunchEnv::new(), None).await
        })
        .expect_err("the start fails");
    let report = err.report();
    assert_eq!(err.code(), ErrorCode::DriverFailed, "{report}");
    assert!(report.contains("`failed`"), "the job result: {report}");
    assert!(report.contains("exit-code"), "the unit's Result: {report}");
}

#[test]
fn a_crash_loop_ends_failed_at_the_start_limit_and_each_exit_is_reported() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |c| {
        c.restart_sec_ms = 100;
        c.start_limit_burst = 3;
        c.start_limit_interval_secs = 60;
    });
    let spec = super::spec_crashing_once_flagged(&host, "ns", "crash");
    let r1 = rev("ns", "crash", "r1");
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let d = std::sync::Arc::new(d);
    let watcher = {
        let d = std::sync::Arc::clone(&d);
        rt.spawn(async move { d.watch_exits(tx).await })
    };
    up(&rt, &d, r1, &spec, &LaunchEnv::new());
    dump(&host, "ns", "crash");
    super::start_crash_loop(&host, "ns", "crash", &naming::unit_name(r1));
    let state = wait_until("the unit to be failed", READY, || {
        match rt.block_on(d.state(r1)).unwrap() {
            Some(BackendState::Failed { reason }) => Some(reason),
            _ => None,
        }
    });
    assert!(state.starts_with("exit-code"), "{state}");
    let mut exits = Vec::new();
    wait_until("three exits", READY, || {
        while let Ok(e) = rx.try_recv() {
            exits.push(e);
        }
        exits.len() >= 3
    });
    // The kill (status 9), then the runs that exit 3.
    assert!(exits.iter().all(|e| e.revision == "r1"), "{exits:?}");
    assert_eq!(exits[0].exit_code, Some(9), "{exits:?}");
    assert!(
        exits[1..].iter().all(|e| e.exit_code == Some(3)),
        "{exits:?}"
    );
    drop(rx);
    watcher.abort();
}

#[test]
fn retiring_an_old_revision_leaves_the_newer_one_running() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let spec = spec_running(&host, "ns", "web");
    let (r1, r2) = (rev("ns", "web", "r1"), rev("ns", "web", "r2"));
    up(&rt, &d, r1, &spec, &LaunchEnv::new());
    up(&rt, &d, r2, &spec, &LaunchEnv::new());
    assert_eq!(
        rt.block_on(d.state(r1)).unwrap(),
        Some(BackendState::Stopped),
        "activating r2 stopped r1"
    );
    let u2 = naming::unit_name(r2);
    let entered = host.property(&u2, "ActiveEnterTimestamp");
    rt.block_on(d.retire(r1)).unwrap();
    rt.block_on(d.retire(r1)).unwrap();
    assert_eq!(rt.block_on(d.state(r1)).unwrap(), None);
    assert_eq!(host.property(&u2, "ActiveState"), "active");
    assert_eq!(host.property(&u2, "ActiveEnterTimestamp"), entered);
    assert!(!host.unit_dir().join(naming::unit_name(r1)).exists());
    assert!(!host
        .unit_dir()
        .join(naming::dropin_dir(&naming::unit_name(r1)))
        .exists());
    let err = rt
        .block_on(d.delete_namespace("ns"))
        .expect_err("r2 is still there");
    assert_eq!(err.code(), ErrorCode::NamespaceNotEmpty);
}

#[test]
fn a_unit_that_is_not_ours_is_never_touched() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let r1 = rev("ns", "web", "r1");
    let path = host.unit_dir().join(naming::unit_name(r1));
    let foreign = "[Service]\nExecStart=/bin/true\n";
    std::fs::write(&path, foreign).unwrap();
    let spec = spec_running(&host, "ns", "web");
    for err in [
        rt.block_on(d.prepare(r1, &spec)).expect_err("prepare"),
        rt.block_on(d.activate(r1, &spec, &LaunchEnv::new(), None))
            .expect_err("activate"),
        rt.block_on(d.retire(r1)).expect_err("retire"),
        rt.block_on(d.stop(r1)).expect_err("stop"),
    ] {
        assert_eq!(err.code(), ErrorCode::NotOwned, "{}", err.report());
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), foreign);
}

/// A write killed before its rename leaves its temporary file (the crash loop found
/// one): connecting removes those of our units, slices and env drop-ins, and nothing
/// else.
#[test]
fn connecting_removes_the_temporary_files_a_killed_write_left() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let r1 = rev("ns", "web", "r1");
    up(&rt, &d, r1, &spec_running(&host, "ns", "web"), &launch(&[]));
    drop(d);
    let unit = naming::unit_name(r1);
    let dropins = host.unit_dir().join(naming::dropin_dir(&unit));
    let stale = [
        host.unit_dir().join(format!(".{unit}.4242.0.tmp")),
        host.unit_dir()
            .join(format!(".{}.4242.1.tmp", naming::slice_name("ns"))),
        dropins.join(format!(".{}.4242.0.tmp", naming::ENV_DROPIN)),
    ];
    let kept = [
        host.unit_dir().join(".other.service.4242.0.tmp"),
        dropins.join(naming::ENV_DROPIN),
    ];
    for path in &stale {
        std::fs::write(path, "[Service]\n").unwrap();
    }
    std::fs::write(&kept[0], "").unwrap();
    let (_rt, _d) = connect(&host, |_| {});
    for path in &stale {
        assert!(!path.exists(), "{} removed", path.display());
    }
    for path in &kept {
        assert!(path.exists(), "{} kept", path.display());
    }
}

#[test]
fn concurrent_activations_share_their_reloads() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let d = std::sync::Arc::new(d);
    let names: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    let specs: Vec<Spec> = names.iter().map(|w| spec_running(&host, "ns", w)).collect();
    rt.block_on(async {
        d.ensure_namespace("ns").await?;
        for (w, spec) in names.iter().zip(&specs) {
            d.prepare(rev("ns", w, "r1"), spec).await?;
        }
        Ok::<_, capstan_driver::DriverError>(())
    })
    .unwrap();
    let before = d.bus().reloads();
    rt.block_on(async {
        let tasks: Vec<_> = names
            .iter()
            .zip(&specs)
            .map(|(w, spec)| {
                let (d, w, spec) = (std::sync::Arc::clone(&d), w.clone(), spec.clone());
                tokio::spawn(async move {
                    d.activate(
                        rev("ns", &w, "r1"),
                        &spec,
                        &launch(&[("T", "opaque-1")]),
                        None,
                    )
                    .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    });
    let reloads = d.bus().reloads() - before;
    assert!(
        (1..=3).contains(&reloads),
        "10 activations took {reloads} reloads"
    );
    for w in &names {
        assert_eq!(dump(&host, "ns", w)["env"]["T"], "opaque-1");
    }
}

#[test]
fn activations_one_after_another_of_revisions_prepared_before_share_one_reload() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |_| {});
    let names: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
    let mut specs: Vec<Spec> = names.iter().map(|w| spec_running(&host, "ns", w)).collect();
    for spec in &mut specs {
        spec.env.insert("T".into(), "opaque-spec".into());
    }
    let before = rt
        .block_on(async {
            d.ensure_namespace("ns").await?;
            for (w, spec) in names.iter().zip(&specs) {
                d.prepare(rev("ns", w, "r1"), spec).await?;
            }
            let before = d.bus().reloads();
            for (w, spec) in names.iter().zip(&specs) {
                d.activate(rev("ns", w, "r1"), spec, &LaunchEnv::new(), None)
                    .await?;
            }
            Ok::<_, capstan_driver::DriverError>(before)
        })
        .unwrap();
    assert_eq!(d.bus().reloads() - before, 1, "5 activations in a row");
    for w in &names {
        assert_eq!(dump(&host, "ns", w)["env"]["T"], "opaque-spec");
    }
    // A launch env still reaches the process: a changed drop-in, a reload, a restart.
    let (w, spec) = (&names[0], &specs[0]);
    rt.block_on(d.activate(
        rev("ns", w, "r1"),
        spec,
        &launch(&[("T", "opaque-2")]),
        None,
    ))
    .unwrap();
    assert_eq!(d.bus().reloads() - before, 2);
    wait_until("w0 to see the launch env", READY, || {
        dump(&host, "ns", w)["env"]["T"] == "opaque-2"
    });
}

#[test]
fn a_host_reboot_brings_back_what_intent_runs_and_nothing_else() {
    let mut host = SystemdHost::boot();
    let (web, api, old) = (
        rev("ns", "web", "r2"),
        rev("ns", "api", "r1"),
        rev("ns", "web", "r1"),
    );
    {
        let (rt, d) = connect(&host, |_| {});
        let web_spec = spec_running(&host, "ns", "web");
        up(&rt, &d, old, &web_spec, &LaunchEnv::new());
        up(&rt, &d, web, &web_spec, &launch(&[("T", "opaque-boot")]));
        up(
            &rt,
            &d,
            api,
            &spec_running(&host, "ns", "api"),
            &LaunchEnv::new(),
        );
        dump(&host, "ns", "api");
        rt.block_on(d.stop(api)).unwrap();
    }
    let is_enabled = |host: &SystemdHost, r| {
        let out = host.systemctl(&["is-enabled", &naming::unit_name(r)]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(is_enabled(&host, web), "enabled");
    assert_eq!(is_enabled(&host, api), "disabled", "an explicit stop");
    assert_eq!(is_enabled(&host, old), "disabled", "a replaced revision");
    let before = dump(&host, "ns", "web");
    std::fs::remove_file(super::dump_file(&host, "ns", "web")).unwrap();
    std::fs::remove_file(super::dump_file(&host, "ns", "api")).unwrap();

    host.reboot();
    let after = dump(&host, "ns", "web");
    assert_eq!(
        after["env"]["T"], "opaque-boot",
        "with its launch environment"
    );
    assert_ne!(after["pid"], before["pid"], "a new process of the new boot");
    let (rt, d) = connect(&host, |_| {});
    assert_eq!(
        rt.block_on(d.state(web)).unwrap(),
        Some(BackendState::Running)
    );
    assert_eq!(
        rt.block_on(d.state(api)).unwrap(),
        Some(BackendState::Stopped)
    );
    assert_eq!(
        rt.block_on(d.state(old)).unwrap(),
        Some(BackendState::Stopped)
    );
    assert!(!super::dump_file(&host, "ns", "api").exists());
}

#[test]
fn when_the_agent_manages_the_lifecycle_nothing_is_enabled() {
    let host = SystemdHost::boot();
    let (rt, d) = connect(&host, |c| c.manage_lifecycle = true);
    let r1 = rev("ns", "web", "r1");
    up(
        &rt,
        &d,
        r1,
        &spec_running(&host, "ns", "web"),
        &LaunchEnv::new(),
    );
    let out = host.systemctl(&["is-enabled", &naming::unit_name(r1)]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "disabled");
}

//! `capstan-agent` with `driver = "vm"` (the shipped binary, its `[vm]` section):
//! a revision's lifecycle in order with hooks, the hook's placeholder in the guest's
//! environment byte for byte, a graceful agent stop that stops every running-intent VM
//! (the guest hears its power button) and a startup that boots them again without a
//! hook, an explicitly stopped workload that stays stopped, and activations and
//! retires that leave exactly the VMs intent wants.

use crate::hooks::iam;
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::vm::{spec, VmHost};
use capstan_tests::{unique, wait_until, READY};
use sha2::Digest as _;

fn vm_spec(rev: &str) -> Spec {
    Spec::from(spec(&[("REV", rev)]))
}

/// The SHA-256 the guest's workload reports for the env `records` (written out here,
/// not by the driver's encoder).
fn sha(records: &[&str]) -> String {
    let block: Vec<u8> = records.iter().flat_map(|r| r.bytes().chain([0])).collect();
    capstan_common::signing::to_hex(&sha2::Sha256::digest(&block))
}

#[test]
fn the_agent_carries_a_vm_through_its_lifecycle_with_hooks() {
    let vms = VmHost::new(60);
    let a = Agent::builder(&unique("vmlife"))
        .vm(&vms)
        .hook(iam())
        .build();
    let ns = a.host.clone();
    let c = a.commands(&ns);
    let env = sha(&["DB_TOKEN=opaque-db.tok:42", "REV=r1"]);
    let started = |what: &str| {
        let line = vms.console_line(&ns, "web", "r1", "CAPSTAN-WORKLOAD-START");
        assert!(
            line.ends_with(&format!("environ_sha256={env}")),
            "{what}: {line}"
        );
    };

    // Prepare and activate: the hook's placeholder is in the guest, not in the log.
    a.apply_ok(&c.rollout(&["web"], "r1", vm_spec));
    assert_eq!(vms.qemus().len(), 1);
    started("activated");
    let log = serde_json::to_string(&a.log()).unwrap();
    assert!(!log.contains("opaque-db"), "a placeholder reached the log");

    // A graceful stop stops it (its workload gets TERM), a start boots it again with
    // the same environment and no hook.
    a.run().stop();
    vms.console_line(&ns, "web", "r1", "CAPSTAN-WORKLOAD got TERM");
    assert_eq!(
        vms.qemus(),
        Vec::<i32>::new(),
        "the sweep left a VM running"
    );
    let daemon = a.run();
    assert_eq!(vms.qemus().len(), 1, "startup did not boot web");
    started("started again on startup");
    daemon.stop();
    assert_eq!(vms.qemus(), Vec::<i32>::new());

    // Explicitly stopped: it stays stopped across a restart; started again by command.
    a.apply_ok(&[c.stop("s1", "web")]);
    a.run().stop();
    assert_eq!(
        vms.qemus(),
        Vec::<i32>::new(),
        "an explicitly stopped VM was started"
    );
    a.apply_ok(&[c.start("s2", "web")]);
    assert_eq!(vms.qemus().len(), 1);
    started("started by command");

    // r2 replaces r1, whose files go with its retire; the namespace goes last.
    a.apply_ok(&[
        c.prepare("p2", "web", "r2", vm_spec("r2")),
        c.activate("a2", "web", "r2"),
        c.retire("x1", "web", "r1"),
    ]);
    assert_eq!(vms.qemus().len(), 1);
    let r1 = vms.console(&ns, "web", "r1");
    assert!(!r1.parent().unwrap().exists(), "r1's files are still there");
    vms.console_line(&ns, "web", "r2", "CAPSTAN-WORKLOAD-START");
    a.apply_ok(&[
        c.stop("s3", "web"),
        c.retire("x2", "web", "r2"),
        c.delete_namespace("d"),
    ]);
    assert_eq!(vms.qemus(), Vec::<i32>::new());
    assert!(!vms.data_dir().join("state").join(&ns).exists());

    // The hook ran for the command-driven starts and stops only (a1, s1, s2, a2 with
    // r1's revocation, x1, s3, x2), never for the sweep or the startup.
    let start = "before_workload_start false";
    let stop = "before_workload_stop false";
    assert_eq!(
        a.calls("iam"),
        [start, stop, start, start, stop, stop, stop, stop]
    );
    let (ok, text) = a.verify();
    assert!(ok, "{text}");
}

/// A kill loop: 20 SIGKILLs of `capstan-agent apply` across activations that swap two
/// workloads between r1 and r2, each kill as soon as the revision being activated runs
/// (so most land mid-activation, the old revision still stopping), each followed by a
/// new `apply` on the same commands, which first finishes what the last one was killed
/// in. Every workload ends with exactly one VM, the revision its last activation named,
/// and every activation logged exactly one `workload_started`.
#[test]
fn a_kill_loop_across_activations_ends_with_one_vm_per_workload() {
    const WORKLOADS: usize = 2;
    const KILLS: usize = 20;
    // A short stop timeout: r1s still booting are stopped by `quit` after 2 s, which
    // is where most kills land.
    let vms = VmHost::new(2);
    let a = Agent::builder(&unique("vmcrash")).vm(&vms).build();
    let c = a.commands(&a.host);
    let mut setup = vec![c.ensure_namespace("ns")];
    for w in 0..WORKLOADS {
        let wl = format!("w{w}");
        setup.push(c.prepare(&format!("{wl}.p1"), &wl, "r1", vm_spec("r1")));
        setup.push(c.prepare(&format!("{wl}.p2"), &wl, "r2", vm_spec("r2")));
        setup.push(c.activate(&format!("{wl}.a1"), &wl, "r1"));
    }
    a.apply_ok(&setup);
    assert_eq!(vms.qemus().len(), WORKLOADS);

    // Activation k: workload k % 2, to r2, r2, r1, r1, r2, r2, …
    let target = |k: usize| {
        (
            format!("w{}", k % WORKLOADS),
            ["r2", "r1"][(k / WORKLOADS) % 2],
        )
    };
    let activations: Vec<_> = (0..KILLS)
        .map(|k| {
            let (wl, rev) = target(k);
            c.activate(&format!("k{k}"), &wl, rev)
        })
        .collect();
    let running = |wl: &str, rev: &str| {
        let pidfile = vms.run_dir().join(capstan_driver::short_hash(
            format!("{}/{}/{wl}@{rev}", a.host, a.host).as_bytes(),
        ));
        std::fs::read_to_string(pidfile.join("qemu.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .is_some_and(capstan_tests::vm::is_capstan_qemu)
    };
    let mut mid_command = 0;
    for k in 0..KILLS {
        // Fed through a pipe that stays open until the kill: `apply` cannot reach the
        // end of its input and exit, so the kill hits a live process.
        let (mut apply, feed) = a.start_apply_fed(&activations[..=k]);
        let answers = apply.stdout_lines();
        let (wl, rev) = target(k);
        wait_until(format_args!("{wl}@{rev} to run (kill {k})"), READY, || {
            if let Some(exit) = apply.exited() {
                panic!(
                    "apply ended ({exit}) before {wl}@{rev} ran: {}",
                    apply.stderr()
                );
            }
            running(&wl, rev)
        });
        apply.kill();
        feed.close();
        let answered = answers.rest("the answers of the killed apply").len();
        if activations
            .get(answered)
            .is_some_and(|next| a.in_progress(next.id()))
        {
            mid_command += 1;
        }
    }
    eprintln!("{mid_command} of {KILLS} kills landed mid-command");
    assert!(mid_command > 0, "no kill landed mid-command");
    a.apply_ok(&activations);

    for w in 0..WORKLOADS {
        let (wl, last) = target(KILLS - WORKLOADS + w);
        let other = if last == "r1" { "r2" } else { "r1" };
        assert!(
            running(&wl, last) && !running(&wl, other),
            "{wl}: {last} should run alone"
        );
    }
    assert_eq!(vms.qemus().len(), WORKLOADS, "a VM too many");
    let started = a.events("workload_started");
    let ids = (0..WORKLOADS)
        .map(|w| format!("w{w}.a1"))
        .chain((0..KILLS).map(|k| format!("k{k}")));
    for id in ids {
        let n = started.iter().filter(|e| e["command_id"] == id).count();
        assert_eq!(n, 1, "{id} started {n} times: {started:#?}");
    }
    assert_eq!(started.len(), WORKLOADS + KILLS, "{started:#?}");
    let (ok, text) = a.verify();
    assert!(ok, "{text}");
}

/// Supervision and drift: a VM killed by hand while the agent runs is recorded as an
/// exit (no code: no exit record) and booted again; a revision directory of this host
/// that intent does not know is reported as drift, not removed — and removed once the
/// agent runs with `reap_orphans = true`.
#[test]
fn a_vm_killed_by_hand_is_booted_again_and_a_stray_one_is_drift() {
    let vms = VmHost::new(10);
    let mut a = Agent::builder(&unique("vmsup")).vm(&vms).build();
    let c = a.commands(&a.host);
    a.apply_ok(&c.rollout(&["web"], "r1", vm_spec));
    let ghost = vms
        .data_dir()
        .join("state")
        .join(&a.host)
        .join("ghost")
        .join("r1");
    std::fs::create_dir_all(&ghost).unwrap();
    let identity = serde_json::json!({
        "host": a.host, "namespace": a.host, "workload": "ghost", "revision": "r1",
        "spec_hash": "000000000000", "spec": spec(&[])
    });
    std::fs::write(ghost.join("identity.json"), identity.to_string()).unwrap();

    let daemon = a.run();
    let [before] = vms.qemus()[..] else {
        panic!("not one VM: {:?}", vms.qemus())
    };
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &before.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_until("the supervisor to boot web again", READY, || {
        matches!(vms.qemus()[..], [now] if now != before)
            && a.events("workload_started")
                .iter()
                .any(|e| e["cause"] == "supervisor")
    });
    daemon.stop();

    let exits = a.events("workload_exited");
    let web = exits
        .iter()
        .find(|e| e["workload"] == "web")
        .unwrap_or_else(|| panic!("no exit recorded for web: {exits:#?}"));
    assert_eq!(web["exit_code"], serde_json::Value::Null, "{web}");
    let drift = a.events("drift_detected");
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert_eq!(drift[0]["workload"], "ghost");
    assert_eq!(drift[0]["reaped"], false);
    assert!(
        ghost.join("identity.json").exists(),
        "reported, not removed"
    );
    assert_eq!(
        vms.qemus(),
        Vec::<i32>::new(),
        "the graceful stop left a VM"
    );

    a.reconfigure(|b| b.reap_orphans(true));
    a.run().stop();
    let drift = a.events("drift_detected");
    let reaped = drift.last().map(|d| d["reaped"].clone());
    assert_eq!(reaped, Some(serde_json::json!(true)), "{drift:#?}");
    assert!(!ghost.exists(), "the stray revision was not reaped");
    let web = vms.console(&a.host, "web", "r1");
    assert!(
        web.with_file_name("identity.json").exists(),
        "web's revision went too"
    );
}

/// Leave-running (an agent upgrade where the agent does not run under the shipped
/// unit: `vm.md`, *Limits*): the agent exits without stopping the VM, and the next one
/// adopts it by its pidfile and command line — the same QEMU, no second start.
#[test]
fn leave_running_keeps_the_vm_and_the_next_agent_adopts_it() {
    let vms = VmHost::new(10);
    let a = Agent::builder(&unique("vmlr")).vm(&vms).build();
    a.apply_ok(&a.commands(&a.host).rollout(&["web"], "r1", vm_spec));
    let [before] = vms.qemus()[..] else {
        panic!("not one VM: {:?}", vms.qemus())
    };
    a.run_with(&["--leave-running"], &[]).stop();
    assert_eq!(vms.qemus(), [before], "leave-running stopped the VM");
    let daemon = a.run();
    assert_eq!(vms.qemus(), [before], "adopted, not restarted");
    daemon.stop();
    assert_eq!(
        vms.qemus(),
        Vec::<i32>::new(),
        "the graceful stop left it running"
    );
    assert_eq!(
        a.events("workload_started").len(),
        1,
        "only the activation started it"
    );
    assert!(
        a.events("drift_detected").is_empty(),
        "it is known, not drift"
    );
}

/// Readiness gates a VM's activation: with an `http` check, r2 (whose guest serves
/// HTTP once booted) replaces r1 only when a `GET /` through QEMU's forwarded port
/// answers 200; r3, whose guest never serves, fails `not_ready` after its deadline, is
/// stopped, and r2 runs on.
#[test]
fn an_http_check_gates_a_vm_activation() {
    let vms = VmHost::new(10);
    let a = Agent::builder(&unique("vmready")).vm(&vms).build();
    let c = a.commands(&a.host);
    let checked = |rev: &str, serves: bool, deadline_ms: u32| {
        let mut spec = serde_json::to_value(spec(&[("REV", rev)])).unwrap();
        spec["vm"]["network"] = "user".into();
        if serves {
            spec["env"]["HTTP_PORT"] = "8080".into();
        }
        spec["readiness"] = serde_json::json!({
            "check": {"http": {"port": 8080, "path": "/"}},
            "interval_ms": 500, "timeout_ms": 1000, "deadline_ms": deadline_ms
        });
        Spec::from(serde_json::from_value::<capstan_common::Spec>(spec).unwrap())
    };
    let mut setup = c.rollout(&["web"], "r1", vm_spec);
    setup.push(c.prepare("p2", "web", "r2", checked("r2", true, 120_000)));
    setup.push(c.prepare("p3", "web", "r3", checked("r3", false, 8_000)));
    a.apply_ok(&setup);
    a.apply_ok(&[c.activate("a2", "web", "r2")]);
    // Ready means served: the guest's workload had said so on its console.
    vms.console_line(
        &a.host,
        "web",
        "r2",
        "CAPSTAN-WORKLOAD serving http on 8080",
    );
    assert_eq!(vms.qemus().len(), 1, "r1 still runs beside r2");

    let applied = a.apply(&[c.activate("a3", "web", "r3")]);
    assert_eq!(
        applied.exit,
        capstan_tests::process::Exit::Code(1),
        "{applied}"
    );
    let error = &applied.results[0]["error"];
    assert_eq!(error["code"], "not_ready", "{applied}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was not ready within 8000 ms"),
        "{message}"
    );
    assert!(
        message.contains("GET / on 127.0.0.1:"),
        "the last probe's words: {message}"
    );
    let [left] = vms.qemus()[..] else {
        panic!("not one VM: {:?}", vms.qemus())
    };
    let r2 = capstan_vm::launch::Vm::new(
        &a.host,
        capstan_driver::RevisionRef {
            namespace: &a.host,
            workload: "web",
            revision: "r2",
        },
        &vms.data_dir().join("state"),
        &vms.run_dir(),
    );
    let pid: i32 = std::fs::read_to_string(r2.pidfile())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(left, pid, "the VM left running is not r2's");
}

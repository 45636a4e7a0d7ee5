//! The VM driver under the shipped `capstan-agent.service`, in a real systemd: each
//! QEMU runs in a transient scope of its own, so a `--leave-running` stop of the
//! agent's unit (`KillMode=mixed`, which kills everything left in the unit's cgroup)
//! leaves the VM running, and the next start of the unit adopts that same QEMU.

use crate::systemd::service::{install_unit, AGENT_UNIT};
use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::systemd::SystemdHost;
use capstan_tests::vm::{spec, VmHost};
use capstan_tests::{binary, unique, wait_until, READY};

/// The pid (as the host's PID namespace numbers it) of each QEMU of `vms` running in
/// `host`, by its pidfile and its command line read inside.
fn qemus_inside(host: &SystemdHost, vms: &VmHost) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(vms.run_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("qemu.pid")).ok())
        .map(|p| p.trim().to_string())
        .filter(|pid| {
            let out = host.nsenter(&["cat", &format!("/proc/{pid}/cmdline")]);
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("process=capstan-vm")
        })
        .collect()
}

#[test]
fn a_vm_outlives_its_agents_unit_stopped_with_leave_running() {
    let host = SystemdHost::boot();
    let vms = VmHost::new_in(host.dir(), 10);
    let name = unique("vmsd");
    let a = Agent::builder(&name).vm(&vms).build_in(host.dir());
    let c = a.commands(&name);
    // Made from outside the host, then killed: the unit's startup boots it again,
    // from inside.
    a.apply_ok(&c.rollout(&["web"], "r1", |rev| Spec::from(spec(&[("REV", rev)]))));
    let [outside] = vms.qemus()[..] else {
        panic!("not one VM: {:?}", vms.qemus())
    };
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &outside.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_until("the QEMU killed", READY, || vms.qemus().is_empty());

    let bin = host.install(&binary("capstan-agent"));
    install_unit(
        &host,
        AGENT_UNIT,
        &format!(
            "ExecStart=\nExecStart={bin} --config {config} --data-dir {data} --host {name} \
             --log-format json run --leave-running\nStateDirectory=\nReadWritePaths={dir}\n",
            bin = bin.display(),
            config = a.config_file().display(),
            data = a.data_dir().display(),
            dir = host.dir().display(),
        ),
    );
    host.systemctl_ok(&["start", AGENT_UNIT]);
    let [pid] = &qemus_inside(&host, &vms)[..] else {
        panic!(
            "the unit's startup did not boot one VM: {:?}\n{}",
            qemus_inside(&host, &vms),
            host.journal(&["--unit", AGENT_UNIT, "--output", "cat"])
        )
    };
    let cgroup = host.nsenter(&["cat", &format!("/proc/{pid}/cgroup")]);
    let cgroup = String::from_utf8_lossy(&cgroup.stdout).to_string();
    assert!(
        cgroup.contains("/capstan-vm-") && !cgroup.contains(AGENT_UNIT),
        "QEMU is not in a scope of its own: {cgroup}"
    );

    host.systemctl_ok(&["stop", AGENT_UNIT]);
    assert_eq!(host.property(AGENT_UNIT, "Result"), "success");
    assert_eq!(
        qemus_inside(&host, &vms),
        std::slice::from_ref(pid),
        "stopping the agent's unit took the VM along"
    );
    let started = a.events("workload_started").len();
    host.systemctl_ok(&["start", AGENT_UNIT]);
    assert_eq!(
        qemus_inside(&host, &vms),
        std::slice::from_ref(pid),
        "adopted, not restarted"
    );
    host.systemctl_ok(&["stop", AGENT_UNIT]);
    assert_eq!(a.events("workload_started").len(), started, "started again");
    // The VM goes with the host (SIGKILL to its PID 1 ends the namespace).
    host.kill();
}

//! `vm`: `--units` revisions prepared and activated through the agent's executor with
//! the real VM driver, against as many plain `qemu-system-x86_64 -daemonize` launches
//! of the same guest with the same command line (the driver's own, `-name` apart), in
//! the same run; `--rounds` rounds, alternating who goes first, the median reported.
//! Both sides are timed until QEMU runs (the driver also asks QMP that the guest runs,
//! and writes its files and log records); the guests' boots are not waited for. Each
//! side's VMs are killed before the other side goes. Needs the test guest
//! (`$CAPSTAN_VM_GUEST_DIR`, `.ci/vmguest.sh`) and QEMU; skipped (with the reason)
//! without them. The guests run under TCG, as in the tests.

use crate::apply::{command, succeeded};
use crate::replay::median;
use crate::roundtrip::round;
use crate::Args;
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::Op;
use capstan_driver::RevisionRef;
use capstan_tests::vm::{spec, VmHost};
use capstan_vm::launch::{argv_block, env_block, qemu_args, Vm};
use capstan_vm::VmDriver;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn run(args: &Args) -> anyhow::Result<()> {
    if std::env::var_os("CAPSTAN_VM_GUEST_DIR").is_none() {
        println!("vm            skipped: CAPSTAN_VM_GUEST_DIR is not set (export CAPSTAN_VM_GUEST_DIR=$(.ci/vmguest.sh))");
        return Ok(());
    }
    if let Some(why) = crate::needs::tools(&["qemu-system-x86_64"]) {
        println!("vm            skipped: {why}");
        return Ok(());
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        let mut pair = [None, None];
        for side in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
            pair[side] = Some(match side {
                0 => activations(r, args.units).await?,
                _ => launches(r, args.units).await?,
            });
        }
        let [Some(a), Some(b)] = pair else {
            unreachable!("both sides ran")
        };
        ours.push(a.as_secs_f64() * 1e3);
        theirs.push(b.as_secs_f64() * 1e3);
    }
    let (ms, baseline) = (median(&mut ours), median(&mut theirs));
    println!(
        "{}",
        json!({
            "bench": "vm",
            "revisions": args.units,
            "rounds": args.rounds,
            "ms": round(ms),
            "each_round_ms": ours.iter().map(|x| round(*x)).collect::<Vec<_>>(),
            "baseline": {
                "what": format!("{} x qemu-system-x86_64 -daemonize, the driver's command line, the same guest (TCG)", args.units),
                "ms": round(baseline),
                "each_round_ms": theirs.iter().map(|x| round(*x)).collect::<Vec<_>>(),
            },
            "ratio": round(ms / baseline),
            "target": "ratio <= 1.2",
        })
    );
    Ok(())
}

/// Every one of the `n` VMs a side started runs.
fn all_running(vms: &VmHost, n: usize) -> anyhow::Result<()> {
    let running = vms.qemus().len();
    anyhow::ensure!(running == n, "{running} VMs run, not {n}");
    Ok(())
}

/// `n` workloads prepared and activated through an executor, one after another; the
/// namespace is ensured first (not timed). The VMs are killed with their `VmHost`.
async fn activations(round: usize, n: usize) -> anyhow::Result<Duration> {
    let vms = VmHost::new(2);
    let host = format!("bench{}", std::process::id());
    let driver = Arc::new(VmDriver::open(&host, vms.config.clone(), vms.data_dir()).await?);
    let log = Arc::new(Log::open(
        &vms.data_dir().join("log"),
        LogOptions::default(),
    )?);
    let executor = Executor::new(host.clone(), log, driver);
    let ns = format!("r{round}");
    let cmd = |id: String, op: Op| {
        let mut c = command(id, op);
        c.host = host.clone();
        c
    };
    let op = Op::EnsureNamespace {
        namespace: ns.clone(),
    };
    succeeded(&executor, cmd("ns".into(), op)).await?;
    let t = Instant::now();
    for w in 0..n {
        let (workload, revision) = (format!("w{w}"), "r1".to_string());
        let prepare = Op::PrepareRevision {
            namespace: ns.clone(),
            workload: workload.clone(),
            revision: revision.clone(),
            spec: spec(&[]),
        };
        succeeded(&executor, cmd(format!("{w}.p"), prepare)).await?;
        let activate = Op::ActivateRevision {
            namespace: ns.clone(),
            workload,
            revision,
        };
        succeeded(&executor, cmd(format!("{w}.a"), activate)).await?;
    }
    let took = t.elapsed();
    all_running(&vms, n)?;
    Ok(took)
}

/// `n` × `qemu-system-x86_64` with the driver's command line for the same guest, each
/// after writing its env and argv files, one after another until `-daemonize` returns.
async fn launches(round: usize, n: usize) -> anyhow::Result<Duration> {
    let vms = VmHost::new(2);
    let settings = capstan_vm::spec::check(&spec(&[]))
        .map_err(|r| anyhow::anyhow!("the guest's spec: {}", r.message))?;
    let ns = format!("q{round}");
    let t = Instant::now();
    for w in 0..n {
        let workload = format!("w{w}");
        let rev = RevisionRef {
            namespace: &ns,
            workload: &workload,
            revision: "r1",
        };
        let vm = Vm::new("plain", rev, &vms.data_dir().join("state"), &vms.run_dir());
        for dir in [&vm.state, &vm.run] {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(vm.env(), env_block(&Default::default()))?;
        std::fs::write(vm.argv(), argv_block(&[]))?;
        let out = tokio::process::Command::new("qemu-system-x86_64")
            .args(qemu_args(&vm, &settings, &vms.config.images_dir, None))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .output()
            .await?;
        anyhow::ensure!(out.status.success(), "qemu: {out:?}");
    }
    let took = t.elapsed();
    all_running(&vms, n)?;
    Ok(took)
}

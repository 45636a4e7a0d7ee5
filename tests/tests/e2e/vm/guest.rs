//! What reaches a real guest and what comes back from it: the launch environment byte
//! for byte (the guest's workload reports the SHA-256 of its own environ), the ACPI
//! power button as TERM to the workload, the workload's exit code through the exit
//! record, a VM found again by a new driver (an agent restart, leave-running), and one
//! killed by hand reported.

use capstan_driver::{BackendState, Driver, Exit, LaunchEnv, RevisionRef};
use capstan_tests::vm::{spec, VmHost};
use capstan_vm::launch::Vm;
use capstan_vm::VmDriver;
use sha2::Digest as _;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "guest";

fn rev(workload: &str) -> RevisionRef<'_> {
    RevisionRef {
        namespace: NS,
        workload,
        revision: "r1",
    }
}

fn open(rt: &tokio::runtime::Runtime, vms: &VmHost) -> Arc<VmDriver> {
    Arc::new(
        rt.block_on(VmDriver::open("h1", vms.config.clone(), vms.data_dir()))
            .unwrap_or_else(|e| panic!("open: {}", e.report())),
    )
}

/// The exit feed of `driver`, running on `rt`.
fn exits(
    rt: &tokio::runtime::Runtime,
    driver: &Arc<VmDriver>,
) -> tokio::sync::mpsc::Receiver<Exit> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let d = driver.clone();
    rt.spawn(async move { d.watch_exits(tx).await });
    rx
}

fn next_exit(rt: &tokio::runtime::Runtime, rx: &mut tokio::sync::mpsc::Receiver<Exit>) -> Exit {
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(120), rx.recv()).await })
        .expect("an exit within 120 s")
        .expect("the exit feed ended")
}

fn state(rt: &tokio::runtime::Runtime, driver: &VmDriver, workload: &str) -> Option<BackendState> {
    rt.block_on(driver.state(rev(workload))).expect("state")
}

fn pid(vms: &VmHost, workload: &str) -> String {
    let vm = Vm::new(
        "h1",
        rev(workload),
        &vms.data_dir().join("state"),
        &vms.run_dir(),
    );
    std::fs::read_to_string(vm.pidfile())
        .expect("a pidfile")
        .trim()
        .to_string()
}

/// Given a spec env and a launch env with values a shell or a command line would
/// mangle, when the revision is activated, then the guest's workload runs with exactly
/// their merged block (the same SHA-256 in the guest), and no value is on QEMU's
/// command line.
#[test]
fn the_guest_runs_with_the_launch_env_byte_for_byte() {
    let vms = VmHost::new(30);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let driver = open(&rt, &vms);
    let spec = spec(&[
        ("PCT", "100% of $HOME is ${PATH} and `x` \\n"),
        ("QUOTES", "it's \"quoted\" 'twice'"),
        ("NEWLINES", "line1\nline2\r\nline3\n"),
        ("UTF8", "héllo wörld — 日本語 🚀"),
        ("EQUALS", "a=b=c"),
        ("EMPTY", ""),
    ]);
    let launch: LaunchEnv = [
        ("DB_PASSWORD", "opaque-s3cr3t.value:1"),
        ("UTF8", "opaque-the-launch-env-wins"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    rt.block_on(async {
        driver.ensure_namespace(NS).await?;
        driver.prepare(rev("env"), &spec).await?;
        driver.activate(rev("env"), &spec, &launch, None).await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    // Written out here, not by the driver's own encoder: what the guest must see.
    let block = [
        "DB_PASSWORD=opaque-s3cr3t.value:1",
        "EMPTY=",
        "EQUALS=a=b=c",
        "NEWLINES=line1\nline2\r\nline3\n",
        "PCT=100% of $HOME is ${PATH} and `x` \\n",
        "QUOTES=it's \"quoted\" 'twice'",
        "UTF8=opaque-the-launch-env-wins",
    ]
    .iter()
    .flat_map(|r| r.bytes().chain([0]))
    .collect::<Vec<u8>>();
    let expected = capstan_common::signing::to_hex(&sha2::Sha256::digest(&block));
    let line = vms.console_line(NS, "env", "r1", "CAPSTAN-WORKLOAD-START");
    assert!(
        line.contains(&format!("environ_bytes={} ", block.len()))
            && line.ends_with(&format!("environ_sha256={expected}")),
        "the guest saw another environment: {line} (expected {} bytes, {expected})",
        block.len()
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid(&vms, "env"))).expect("cmdline");
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("s3cr3t"),
        "a launch env value is on QEMU's command line"
    );
    rt.block_on(async {
        driver.retire(rev("env")).await?;
        driver.delete_namespace(NS).await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(vms.qemus(), Vec::<i32>::new());
}

/// Given a booted guest, when its revision is stopped, then the guest's workload gets
/// TERM (the power button, not a kill), and the exit feed reports its exit code 0; a
/// workload that ends on its own is reported with its own code (3).
#[test]
fn a_stop_reaches_the_workload_and_exits_come_with_their_codes() {
    let vms = VmHost::new(60);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let driver = open(&rt, &vms);
    let mut rx = exits(&rt, &driver);
    let serve = spec(&[]);
    let quits = spec(&[("EXIT_AFTER", "1")]);
    rt.block_on(async {
        driver.ensure_namespace(NS).await?;
        driver
            .activate(rev("serve"), &serve, &LaunchEnv::new(), None)
            .await?;
        driver
            .activate(rev("quits"), &quits, &LaunchEnv::new(), None)
            .await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    // The workload that exits by itself.
    let exit = next_exit(&rt, &mut rx);
    assert_eq!(
        (exit.workload.as_str(), exit.exit_code),
        ("quits", Some(3)),
        "{exit:?}"
    );
    assert_eq!(state(&rt, &driver, "quits"), Some(BackendState::Stopped));
    // The one that serves until stopped: stopped once its power button is heard.
    vms.console_line(NS, "serve", "r1", "CAPSTAN-WORKLOAD-START");
    rt.block_on(driver.stop(rev("serve")))
        .unwrap_or_else(|e| panic!("{}", e.report()));
    vms.console_line(NS, "serve", "r1", "CAPSTAN-WORKLOAD got TERM");
    let exit = next_exit(&rt, &mut rx);
    assert_eq!(
        (exit.workload.as_str(), exit.exit_code),
        ("serve", Some(0)),
        "{exit:?}"
    );
    assert_eq!(state(&rt, &driver, "serve"), Some(BackendState::Stopped));
    rt.block_on(async {
        driver.retire(rev("serve")).await?;
        driver.retire(rev("quits")).await?;
        driver.delete_namespace(NS).await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
}

/// Given a VM started by one driver, when a new driver opens the same directories (the
/// agent restarted, leaving it running), then it finds the VM running and activating it
/// again with the same environment keeps that QEMU; when the VM is killed by hand, the
/// new driver's exit feed reports it (no exit record: no code), it reads stopped, and a
/// resume boots it again.
#[test]
fn a_running_vm_is_found_again_and_one_killed_by_hand_is_reported() {
    let vms = VmHost::new(30);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let spec = spec(&[("A", "1")]);
    let first = open(&rt, &vms);
    rt.block_on(async {
        first.ensure_namespace(NS).await?;
        first
            .activate(rev("kept"), &spec, &LaunchEnv::new(), None)
            .await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    let before = pid(&vms, "kept");
    drop(first);
    let second = open(&rt, &vms);
    assert_eq!(state(&rt, &second, "kept"), Some(BackendState::Running));
    let mut rx = exits(&rt, &second);
    rt.block_on(second.activate(rev("kept"), &spec, &LaunchEnv::new(), None))
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        pid(&vms, "kept"),
        before,
        "an activation with the same env restarted the VM"
    );
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &before])
        .status()
        .expect("kill");
    assert!(killed.success());
    let exit = next_exit(&rt, &mut rx);
    assert_eq!(
        (exit.workload.as_str(), exit.exit_code),
        ("kept", None),
        "{exit:?}"
    );
    assert_eq!(state(&rt, &second, "kept"), Some(BackendState::Stopped));
    rt.block_on(second.resume(rev("kept")))
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(state(&rt, &second, "kept"), Some(BackendState::Running));
    assert_ne!(pid(&vms, "kept"), before);
    rt.block_on(async {
        second.retire(rev("kept")).await?;
        second.delete_namespace(NS).await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(vms.qemus(), Vec::<i32>::new());
}

/// Given a spec with a base disk image (and QEMU's user network), when two revisions
/// are prepared, then each has its own copy-on-write overlay backed by the base (never
/// the base itself), a VM boots with it and a NIC attached, and a retire removes
/// exactly that revision's overlay.
#[test]
fn each_revision_boots_its_own_overlay_of_the_disk_image() {
    let vms = VmHost::new(30);
    let base = vms.config.images_dir.join("base.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("16M")
        .status()
        .expect("qemu-img");
    assert!(made.success());
    let base_before = std::fs::read(&base).unwrap();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let driver = open(&rt, &vms);
    let mut with_disk = serde_json::to_value(spec(&[])).unwrap();
    with_disk["vm"]["disk"] = "base.qcow2".into();
    with_disk["vm"]["network"] = "user".into();
    let with_disk: capstan_common::Spec = serde_json::from_value(with_disk).unwrap();
    let r2 = RevisionRef {
        revision: "r2",
        ..rev("disk")
    };
    rt.block_on(async {
        driver.ensure_namespace(NS).await?;
        driver.prepare(rev("disk"), &with_disk).await?;
        driver.prepare(r2, &with_disk).await?;
        driver
            .activate(rev("disk"), &with_disk, &LaunchEnv::new(), None)
            .await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    let state = vms.data_dir().join("state").join(NS).join("disk");
    for r in ["r1", "r2"] {
        let info = std::process::Command::new("qemu-img")
            .args(["info", "--output", "json", "-U"])
            .arg(state.join(r).join("disk.qcow2"))
            .output()
            .expect("qemu-img info");
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("info JSON");
        assert_eq!(
            info["backing-filename"],
            base.display().to_string(),
            "{r}: {info}"
        );
    }
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid(&vms, "disk"))).unwrap();
    let drive = format!(
        "file={},if=virtio",
        state.join("r1").join("disk.qcow2").display()
    );
    assert!(
        cmdline
            .split(|b| *b == 0)
            .any(|a| a.starts_with(drive.as_bytes())),
        "no {drive} on QEMU's command line"
    );
    assert!(cmdline
        .split(|b| *b == 0)
        .any(|a| a == b"virtio-net-pci,netdev=net0"));
    vms.console_line(NS, "disk", "r1", "CAPSTAN-WORKLOAD-START");
    rt.block_on(driver.retire(rev("disk")))
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert!(!state.join("r1").exists());
    assert!(
        state.join("r2").join("disk.qcow2").exists(),
        "r2's overlay went too"
    );
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_before,
        "the base image was written"
    );
    rt.block_on(async {
        driver.retire(r2).await?;
        driver.delete_namespace(NS).await
    })
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(vms.qemus(), Vec::<i32>::new());
}

//! Hostile VM specs reach no QEMU: a kernel or disk outside the images dir, a comma
//! that would add a QEMU option, a kernel command line smuggling quotes or lines, a
//! section field the driver does not have (a fw_cfg entry of its own), an env name
//! shaped like a fw_cfg path, sizes out of range — each rejected with a stable code by
//! the agent (the coordinator refuses the same at submission:
//! `coordinator/src/spec_rules.rs`), nothing staged, nothing booted. A well-formed
//! kernel the host does not have fails `image_not_found`, also making nothing.

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::unique;
use capstan_tests::vm::{spec, VmHost};
use serde_json::{json, Value};

#[test]
fn hostile_specs_are_rejected_with_a_code_and_boot_nothing() {
    let vms = VmHost::new(10);
    let a = Agent::builder(&unique("vmbad")).vm(&vms).build();
    let c = a.commands(&a.host);
    a.apply_ok(&[c.ensure_namespace("ns")]);
    let with = |field: &str, value: Value| {
        let mut s = serde_json::to_value(spec(&[])).unwrap();
        s["vm"][field] = value;
        Spec::from(serde_json::from_value::<capstan_common::Spec>(s).unwrap())
    };
    let good = || Spec::from(spec(&[]));
    let cases = [
        (
            with("kernel", json!("../../../etc/shadow")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("kernel", json!("/boot/vmlinuz")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("initrd", json!("initramfs.cpio.gz,if=none")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("disk", json!("base.qcow2,file.driver=ssh")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("append", json!("quiet\" init=/bin/sh")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("append", json!("quiet\ninit=/bin/sh")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("append", json!("capstan_secret=é")),
            "rejected",
            "invalid_spec",
        ),
        (
            with("fw_cfg", json!({"name": "opt/capstan/env"})),
            "rejected",
            "invalid_spec",
        ),
        (
            with("memory_mib", json!(1u64 << 30)),
            "rejected",
            "invalid_spec",
        ),
        (with("vcpus", json!(1000)), "rejected", "invalid_spec"),
        (
            with("accel", json!("kvm,foo=bar")),
            "rejected",
            "invalid_spec",
        ),
        (
            good().env("opt/capstan/argv", "x"),
            "rejected",
            "invalid_env",
        ),
        (good().env("A", "x\u{0}y"), "rejected", "invalid_env"),
        (good().command(&["init"]), "rejected", "invalid_spec"),
        (
            good().with("image", "busybox:1"),
            "rejected",
            "invalid_spec",
        ),
        (
            with("kernel", json!("not-here/vmlinuz")),
            "failed",
            "image_not_found",
        ),
    ];
    let lines: Vec<_> = (1..)
        .zip(&cases)
        .map(|(n, (spec, _, _))| c.prepare(&format!("b{n}"), "web", "r1", spec.clone()))
        .collect();
    let expected: Vec<_> = cases.iter().map(|(_, o, c)| (*o, *c)).collect();
    a.apply_expecting(&lines, &expected);
    assert!(a.intent()["workloads"].as_object().unwrap().is_empty());
    let staged = vms.data_dir().join("state").join(&a.host).join("web");
    assert!(
        !staged.exists(),
        "something was staged: {}",
        staged.display()
    );
    assert_eq!(vms.qemus(), Vec::<i32>::new());
    // The agent goes on: a good spec after them is prepared.
    a.apply_ok(&[c.prepare("ok", "web", "r1", good())]);
    assert!(staged.join("r1").join("identity.json").exists());
}

//! The VM driver, called directly, keeps the driver contract
//! (`capstan_driver::testkit`) against real QEMU, the launch environment included: the
//! kit reads the fw_cfg file each running QEMU was started with (what the guest gets;
//! `guest.rs` checks the guest sees exactly that).

use capstan_driver::testkit::{EnvProbe, Kit};
use capstan_driver::RevisionRef;
use capstan_tests::vm::{spec, VmHost};
use capstan_vm::launch::{Vm, FW_CFG_ENV};
use capstan_vm::VmDriver;
use std::collections::BTreeMap;

/// The environment a revision's running QEMU hands its guest: the file its command
/// line names for fw_cfg `opt/capstan/env`.
pub struct FwCfgEnv<'a> {
    pub host: &'a str,
    pub vms: &'a VmHost,
}

#[async_trait::async_trait]
impl EnvProbe for FwCfgEnv<'_> {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let vm = Vm::new(
            self.host,
            rev,
            &self.vms.data_dir().join("state"),
            &self.vms.run_dir(),
        );
        let pid = std::fs::read_to_string(vm.pidfile())
            .map_err(|e| format!("{rev} runs no QEMU: {e}"))?;
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim()))
            .map_err(|e| format!("QEMU {} of {rev}: {e}", pid.trim()))?;
        let prefix = format!("name={FW_CFG_ENV},file=");
        let file = cmdline
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix(&prefix))
            .ok_or_else(|| format!("QEMU of {rev} has no {FW_CFG_ENV}"))?;
        let block = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        block
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| {
                let r = String::from_utf8(r.to_vec()).map_err(|e| e.to_string())?;
                let (k, v) = r
                    .split_once('=')
                    .ok_or_else(|| format!("{r:?} has no '='"))?;
                Ok((k.to_string(), v.to_string()))
            })
            .collect()
    }
}

#[test]
fn the_driver_keeps_the_contract() {
    // A short stop timeout: the kit stops guests still booting, whose power button
    // nothing hears yet; those end by `quit`.
    let vms = VmHost::new(2);
    let host = "kit";
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let driver = rt
        .block_on(VmDriver::open(host, vms.config.clone(), vms.data_dir()))
        .unwrap_or_else(|e| panic!("open: {}", e.report()));
    let probe = FwCfgEnv { host, vms: &vms };
    rt.block_on(
        Kit::new(&driver, "kit", spec(&[("REV", "spec"), ("KEEP", "x")]))
            .with_env_probe(&probe)
            .run(),
    )
    .unwrap_or_else(|e| panic!("{}", capstan_common::report(&e)));
    assert_eq!(vms.qemus(), Vec::<i32>::new(), "QEMUs left running");
}

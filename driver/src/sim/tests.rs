//! The sim against the driver contract.

use super::*;
use crate::testkit::{ContractError, Kit};
use capstan_common::DriverKind;

fn spec() -> Spec {
    Spec {
        driver: DriverKind::Sim,
        image: None,
        command: vec![],
        env: BTreeMap::new(),
        working_dir: None,
        mounts: vec![],
        ports: vec![],
    }
}

#[tokio::test]
async fn the_sim_keeps_the_driver_contract() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    Kit::new(&sim, "kit", spec()).run().await.unwrap();
    assert_eq!(SimHost::load(dir.path()).unwrap(), SimHost::default());
}

/// Activates without stopping the previous revision: the kit must say so.
struct KeepsPrevious(SimDriver);

#[async_trait::async_trait]
impl Driver for KeepsPrevious {
    fn kind(&self) -> DriverKind {
        self.0.kind()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.0.ensure_namespace(namespace).await
    }
    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.0.delete_namespace(namespace).await
    }
    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        self.0.prepare(rev, spec).await
    }
    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        _previous: Option<&str>,
    ) -> Result<(), DriverError> {
        self.0.activate(rev, spec, launch_env, None).await
    }
    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        self.0.start(rev, spec, launch_env).await
    }
    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.resume(rev).await
    }
    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.stop(rev).await
    }
    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.retire(rev).await
    }
    async fn observe(&self) -> Result<Observed, DriverError> {
        self.0.observe().await
    }
}

#[tokio::test]
async fn the_kit_names_the_rule_a_driver_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let driver = KeepsPrevious(SimDriver::open(dir.path(), SimConfig::default()).unwrap());
    let err = Kit::new(&driver, "kit", spec()).run().await.unwrap_err();
    assert!(
        matches!(err, ContractError::Broken { rule, .. } if rule == "activate stops the previous revision"),
        "{err}"
    );
}

//! The drivers compiled into this build, and opening the one the config names. The
//! agent is their composition: each real driver is a crate behind a cargo feature
//! (`docker`, `systemd`, `kube`, `vm`), so a build links only the backends it can drive. With the
//! `external` feature, `driver = "external"` reaches a driver process over its socket
//! (`docs/driver-protocol.md`); from then on it is treated like a built-in one.

use crate::config::{AgentConfig, DriverSetting};
use capstan_common::DriverKind;
use capstan_driver::{sim::SimDriver, Driver};
use std::path::Path;
use std::sync::Arc;

/// The drivers this build can run (also in `capstan-agent --version`).
pub fn compiled() -> Vec<DriverKind> {
    let mut kinds = vec![DriverKind::SIM];
    if cfg!(feature = "docker") {
        kinds.push(DriverKind::DOCKER);
    }
    if cfg!(feature = "systemd") {
        kinds.push(DriverKind::SYSTEMD);
    }
    if cfg!(feature = "kube") {
        kinds.push(DriverKind::KUBE);
    }
    if cfg!(feature = "vm") {
        kinds.push(DriverKind::VM);
    }
    kinds
}

/// Whether this build can reach external drivers (`driver = "external"`).
pub const EXTERNAL: bool = cfg!(feature = "external");

/// Why the configured driver could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("driver `{0}` is not in this build (it has: {list})", list = list(&compiled()))]
    NotCompiled(DriverSetting),
    #[error("cannot open the sim host")]
    Sim(#[source] std::io::Error),
    #[error("cannot reach the {0} backend")]
    Backend(DriverKind, #[source] capstan_driver::DriverError),
    #[cfg(feature = "external")]
    #[error("cannot connect to the external driver")]
    External(#[source] capstan_external::ConnectError),
}

fn list(kinds: &[DriverKind]) -> String {
    let mut names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    if EXTERNAL {
        names.push("external");
    }
    names.join(", ")
}

/// Opens `config.driver` for `host`, keeping its state (if any) under `data_dir`.
/// `host` labels the objects of the real drivers; the sim driver does not use it.
pub async fn open(
    config: &AgentConfig,
    #[cfg_attr(
        not(any(
            feature = "docker",
            feature = "systemd",
            feature = "kube",
            feature = "vm"
        )),
        allow(unused_variables)
    )]
    host: &str,
    data_dir: &Path,
) -> Result<Arc<dyn Driver>, OpenError> {
    let kind = match config.driver {
        DriverSetting::Builtin(kind) => kind,
        #[cfg(feature = "external")]
        DriverSetting::External => {
            return Ok(Arc::new(
                capstan_external::ExternalDriver::connect(config.external.clone())
                    .await
                    .map_err(OpenError::External)?,
            ))
        }
        #[cfg(not(feature = "external"))]
        DriverSetting::External => return Err(OpenError::NotCompiled(DriverSetting::External)),
    };
    match kind {
        DriverKind::SIM => Ok(Arc::new(
            SimDriver::open(data_dir, config.sim.clone()).map_err(OpenError::Sim)?,
        )),
        #[cfg(feature = "docker")]
        DriverKind::DOCKER => Ok(Arc::new(
            capstan_docker::DockerDriver::connect(host, config.docker.clone())
                .await
                .map_err(|e| OpenError::Backend(DriverKind::DOCKER, e))?,
        )),
        #[cfg(feature = "systemd")]
        DriverKind::SYSTEMD => Ok(Arc::new(
            capstan_systemd::SystemdDriver::connect(host, config.systemd.clone())
                .await
                .map_err(|e| OpenError::Backend(DriverKind::SYSTEMD, e))?,
        )),
        #[cfg(feature = "kube")]
        DriverKind::KUBE => Ok(Arc::new(
            capstan_kube::KubeDriver::connect(host, config.kube.clone())
                .await
                .map_err(|e| OpenError::Backend(DriverKind::KUBE, e))?,
        )),
        #[cfg(feature = "vm")]
        DriverKind::VM => Ok(Arc::new(
            capstan_vm::VmDriver::open(host, config.vm.clone(), data_dir)
                .await
                .map_err(|e| OpenError::Backend(DriverKind::VM, e))?,
        )),
        // Unreachable in a build with every driver.
        #[allow(unreachable_patterns)]
        other => Err(OpenError::NotCompiled(DriverSetting::Builtin(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build with every driver feature has every built-in kind, in `BUILT_IN`'s
    /// order: a kind added there without its feature and its arm in `open` (whose
    /// catch-all would answer "not in this build") fails here. The workspace's test
    /// build has every feature (capstan-tests asks for `kube`).
    #[cfg(all(
        feature = "docker",
        feature = "systemd",
        feature = "kube",
        feature = "vm"
    ))]
    #[test]
    fn a_build_with_every_driver_feature_has_every_built_in_driver() {
        assert_eq!(compiled(), DriverKind::BUILT_IN);
    }

    // Kube is the driver a host agent build leaves out.
    #[cfg(not(feature = "kube"))]
    #[tokio::test]
    async fn a_driver_outside_the_build_is_named_with_what_the_build_has() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = AgentConfig::default();
        config.driver = DriverSetting::Builtin(DriverKind::KUBE);
        let err = open(&config, "h1", dir.path()).await.err().unwrap();
        assert!(matches!(
            err,
            OpenError::NotCompiled(DriverSetting::Builtin(DriverKind::KUBE))
        ));
        assert!(err.to_string().contains("sim"), "{err}");
    }

    #[cfg(feature = "external")]
    #[tokio::test]
    async fn an_external_driver_nobody_serves_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nobody.sock");
        let mut config = AgentConfig::default();
        config.driver = DriverSetting::External;
        config.external = capstan_external::ExternalConfig {
            connect_timeout: Some(0.1),
            ..capstan_external::ExternalConfig::at(&socket)
        };
        let err = open(&config, "h1", dir.path()).await.err().unwrap();
        let OpenError::External(cause) = &err else {
            panic!("{err}");
        };
        assert!(cause.to_string().contains("nobody.sock"), "{cause}");
    }
}

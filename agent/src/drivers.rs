//! The drivers compiled into this build, and opening the one the config names. The
//! agent is their composition: each real driver is a crate behind a cargo feature
//! (`docker`, `systemd`), so a build links only the backends it can drive.

use crate::config::AgentConfig;
use capstan_common::DriverKind;
use capstan_driver::{sim::SimDriver, Driver};
use std::path::Path;
use std::sync::Arc;

/// The drivers this build can run (also in `capstan-agent --version`).
pub fn compiled() -> Vec<DriverKind> {
    let mut kinds = vec![DriverKind::Sim];
    if cfg!(feature = "docker") {
        kinds.push(DriverKind::Docker);
    }
    if cfg!(feature = "systemd") {
        kinds.push(DriverKind::Systemd);
    }
    kinds
}

/// Why the configured driver could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("driver `{0}` is not in this build (it has: {list})", list = list(&compiled()))]
    NotCompiled(DriverKind),
    #[error("cannot open the sim host")]
    Sim(#[source] std::io::Error),
    #[error("cannot reach the {0} backend")]
    Backend(DriverKind, #[source] capstan_driver::DriverError),
}

fn list(kinds: &[DriverKind]) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Opens `config.driver` for `host`, keeping its state (if any) under `data_dir`.
/// `host` labels the objects of the real drivers; the sim driver does not use it.
pub async fn open(
    config: &AgentConfig,
    #[cfg_attr(
        not(any(feature = "docker", feature = "systemd")),
        allow(unused_variables)
    )]
    host: &str,
    data_dir: &Path,
) -> Result<Arc<dyn Driver>, OpenError> {
    match config.driver {
        DriverKind::Sim => Ok(Arc::new(
            SimDriver::open(data_dir, config.sim.clone()).map_err(OpenError::Sim)?,
        )),
        #[cfg(feature = "docker")]
        DriverKind::Docker => Ok(Arc::new(
            capstan_docker::DockerDriver::connect(host, config.docker.clone())
                .await
                .map_err(|e| OpenError::Backend(DriverKind::Docker, e))?,
        )),
        #[cfg(feature = "systemd")]
        DriverKind::Systemd => Ok(Arc::new(
            capstan_systemd::SystemdDriver::connect(host, config.systemd.clone())
                .await
                .map_err(|e| OpenError::Backend(DriverKind::Systemd, e))?,
        )),
        other => Err(OpenError::NotCompiled(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_driver_outside_the_build_is_named_with_what_the_build_has() {
        let dir = tempfile::tempdir().unwrap();
        let config = AgentConfig {
            driver: DriverKind::Kube,
            ..AgentConfig::default()
        };
        let err = open(&config, "h1", dir.path()).await.err().unwrap();
        assert!(matches!(err, OpenError::NotCompiled(DriverKind::Kube)));
        assert!(err.to_string().contains("sim"), "{err}");
    }
}

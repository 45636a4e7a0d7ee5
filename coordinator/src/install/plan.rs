//! What `capstan install` does on one host, decided from what is there (pure).
//!
//! The order of the steps is fixed: the package first (its postinst enables the unit,
//! and on an upgrade its prerm/postinst stop the old agent leaving its workloads
//! running and start the new one), then the config, then `systemctl enable`, then a
//! start (if the agent is not running by then) or a restart (if it runs and its config
//! changed). Nothing to do is reported as `unchanged`.

use std::fmt;

/// What a host holds before anything is done, read over SSH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The capstan-agent version dpkg says is installed (`ii`), if any.
    pub installed: Option<String>,
    /// Whether `/etc/capstan/agent.toml` has the wanted bytes, mode 0640, root:root.
    pub config_same: bool,
    /// `systemctl is-enabled capstan-agent` said `enabled`.
    pub enabled: bool,
    /// `systemctl is-active capstan-agent` said `active`.
    pub active: bool,
}

/// What was asked: the package's version, and whether a different installed version
/// may be replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub version: String,
    pub upgrade: bool,
}

/// How the agent is (re)started once package and config are in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// It runs with the wanted config already (or the postinst starts it).
    Nothing,
    /// It does not run: `systemctl start`.
    Start,
    /// It runs with an older config: `systemctl restart`.
    Restart,
}

/// The package step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Package {
    /// The wanted version is installed.
    Keep,
    /// Not installed: `dpkg -i`.
    Install,
    /// Another version is installed and `--upgrade` was given: `dpkg -i`.
    Upgrade { from: String },
}

/// The steps for one host, in the order they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub package: Package,
    pub write_config: bool,
    pub enable: bool,
    pub start: Start,
}

/// The one-word result of a host's run, as the summary line prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The package was not installed before.
    Installed,
    /// Another version was installed before (`--upgrade`).
    Upgraded,
    /// The package was there; the config, the enablement or the running state was not.
    Reconfigured,
    /// Nothing was done.
    Unchanged,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Installed => "installed",
            Outcome::Upgraded => "upgraded",
            Outcome::Reconfigured => "reconfigured",
            Outcome::Unchanged => "unchanged",
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("capstan-agent {installed} is installed, the package is {wanted}: pass --upgrade to replace it")]
    VersionDiffers { installed: String, wanted: String },
}

/// Decides the steps for a host holding `observed`, to get `wanted`.
pub fn plan(observed: &Observed, wanted: &Wanted) -> Result<Plan, PlanError> {
    let package = match &observed.installed {
        None => Package::Install,
        Some(v) if *v == wanted.version => Package::Keep,
        Some(v) if wanted.upgrade => Package::Upgrade { from: v.clone() },
        Some(v) => {
            return Err(PlanError::VersionDiffers {
                installed: v.clone(),
                wanted: wanted.version.clone(),
            })
        }
    };
    // Whether the agent runs once the package step is done: a first install does not
    // start it; an upgrade starts it again if it ran (the postinst).
    let running = match package {
        Package::Install => false,
        Package::Keep | Package::Upgrade { .. } => observed.active,
    };
    let write_config = !observed.config_same;
    let start = if !running {
        Start::Start
    } else if write_config {
        Start::Restart
    } else {
        Start::Nothing
    };
    // A first install's postinst enables the unit.
    let enable = !observed.enabled && package != Package::Install;
    Ok(Plan {
        package,
        write_config,
        enable,
        start,
    })
}

impl Plan {
    /// The summary word for this plan once carried out.
    pub fn outcome(&self) -> Outcome {
        match self.package {
            Package::Install => Outcome::Installed,
            Package::Upgrade { .. } => Outcome::Upgraded,
            Package::Keep if self.write_config || self.enable || self.start != Start::Nothing => {
                Outcome::Reconfigured
            }
            Package::Keep => Outcome::Unchanged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(
        installed: Option<&str>,
        config_same: bool,
        enabled: bool,
        active: bool,
    ) -> Observed {
        Observed {
            installed: installed.map(str::to_string),
            config_same,
            enabled,
            active,
        }
    }

    fn wanted(version: &str, upgrade: bool) -> Wanted {
        Wanted {
            version: version.to_string(),
            upgrade,
        }
    }

    #[test]
    fn a_bare_host_gets_the_package_the_config_and_a_start() {
        let p = plan(&observed(None, false, false, false), &wanted("1.0", false)).unwrap();
        assert_eq!(p.package, Package::Install);
        assert!(p.write_config);
        assert!(!p.enable, "the postinst enables it");
        assert_eq!(p.start, Start::Start);
        assert_eq!(p.outcome(), Outcome::Installed);
    }

    #[test]
    fn a_host_holding_everything_is_left_alone() {
        let p = plan(
            &observed(Some("1.0"), true, true, true),
            &wanted("1.0", false),
        )
        .unwrap();
        assert_eq!(
            p,
            Plan {
                package: Package::Keep,
                write_config: false,
                enable: false,
                start: Start::Nothing
            }
        );
        assert_eq!(p.outcome(), Outcome::Unchanged);
        let again = plan(
            &observed(Some("1.0"), true, true, true),
            &wanted("1.0", true),
        )
        .unwrap();
        assert_eq!(
            again.outcome(),
            Outcome::Unchanged,
            "--upgrade to the same version"
        );
    }

    #[test]
    fn a_changed_config_restarts_a_running_agent_without_reinstalling() {
        let p = plan(
            &observed(Some("1.0"), false, true, true),
            &wanted("1.0", false),
        )
        .unwrap();
        assert_eq!(p.package, Package::Keep);
        assert!(p.write_config);
        assert_eq!(p.start, Start::Restart);
        assert_eq!(p.outcome(), Outcome::Reconfigured);
    }

    #[test]
    fn a_stopped_or_disabled_agent_is_started_and_enabled() {
        let p = plan(
            &observed(Some("1.0"), true, false, false),
            &wanted("1.0", false),
        )
        .unwrap();
        assert!(p.enable);
        assert_eq!(p.start, Start::Start);
        assert!(!p.write_config);
        assert_eq!(p.outcome(), Outcome::Reconfigured);
    }

    #[test]
    fn another_version_needs_upgrade() {
        let err = plan(
            &observed(Some("0.9"), true, true, true),
            &wanted("1.0", false),
        )
        .unwrap_err();
        assert_eq!(
            err,
            PlanError::VersionDiffers {
                installed: "0.9".into(),
                wanted: "1.0".into()
            }
        );
        assert!(err.to_string().contains("--upgrade"), "{err}");
    }

    #[test]
    fn an_upgrade_of_a_running_agent_leaves_the_restart_to_the_package() {
        let p = plan(
            &observed(Some("0.9"), true, true, true),
            &wanted("1.0", true),
        )
        .unwrap();
        assert_eq!(p.package, Package::Upgrade { from: "0.9".into() });
        assert_eq!(
            p.start,
            Start::Nothing,
            "prerm stops it, postinst starts it"
        );
        assert_eq!(p.outcome(), Outcome::Upgraded);
        let stopped = plan(
            &observed(Some("0.9"), true, true, false),
            &wanted("1.0", true),
        )
        .unwrap();
        assert_eq!(
            stopped.start,
            Start::Start,
            "the postinst starts only what ran"
        );
        let changed = plan(
            &observed(Some("0.9"), false, true, true),
            &wanted("1.0", true),
        )
        .unwrap();
        assert_eq!(
            changed.start,
            Start::Restart,
            "the new config needs a restart"
        );
    }
}

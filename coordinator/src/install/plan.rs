//! What `capstan install` does on one host, decided from what is there (pure).
//!
//! The order of the steps is fixed: the package first (its postinst enables the unit,
//! and on an upgrade its prerm/postinst stop the old agent leaving its workloads
//! running and start the new one), then the config, then `systemctl enable`, then a
//! start (if the agent is not running by then) or a restart (if it runs and its config
//! changed). Nothing to do is reported as `unchanged`.
//!
//! A package older than the one installed ([`super::version::compare`]) is a
//! downgrade, refused unless `--allow-downgrade`, and then only when the package says
//! it reads the storage layout the host's log is in (its `X-Capstan-Log-Layouts`
//! field; the host's `capstan-agent log layout`): an agent that cannot read its log
//! refuses to start, and one before that refusal existed took it for empty. Any
//! package that says which layouts it reads is refused on a host whose log is in
//! another.

use super::version;
use std::cmp::Ordering;
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
    /// The storage layout the host's log is in.
    pub log_layout: LogLayout,
}

/// The storage layout of a host's log, as `capstan-agent log layout` said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogLayout {
    /// There is no log (`none`).
    None,
    /// The log is in this layout (`2`; a newer build's as its marker says).
    In(String),
    /// It could not be told: no answer (no agent installed that has `log layout`,
    /// or it failed).
    Unknown,
}

/// What was asked: the package's version and the log layouts it reads, and what may
/// be replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub version: String,
    /// The layouts the package's `X-Capstan-Log-Layouts` names; `None` without one
    /// (a package built before it existed).
    pub layouts: Option<Vec<String>>,
    /// `--upgrade`: another (not older) installed version may be replaced.
    pub upgrade: bool,
    /// `--allow-downgrade`: an installed version may be replaced by an older one.
    pub allow_downgrade: bool,
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
    /// A newer version is installed and `--allow-downgrade` was given: `dpkg -i`.
    Downgrade { from: String },
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
    /// A newer version was installed before (`--allow-downgrade`).
    Downgraded,
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
            Outcome::Downgraded => "downgraded",
            Outcome::Reconfigured => "reconfigured",
            Outcome::Unchanged => "unchanged",
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("capstan-agent {installed} is installed, the package is {wanted}: pass --upgrade to replace it")]
    VersionDiffers { installed: String, wanted: String },
    #[error("downgrade from {from} to {to} refused: pass --allow-downgrade")]
    Downgrade { from: String, to: String },
    #[error("cannot tell whether {to} is older than the installed {from}: pass --allow-downgrade to install it all the same")]
    Incomparable { from: String, to: String },
    #[error("downgrade from {from} to {to} refused: {why}")]
    DowngradeUnreadable {
        from: String,
        to: String,
        why: Unreadable,
    },
    #[error("capstan-agent {to} refused: {why}")]
    Unreadable { to: String, why: Unreadable },
}

/// Why a package may not go onto a host: its build would not read the host's log.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Unreadable {
    #[error("the package reads log layouts {reads}, its log is in layout {layout}")]
    Layout { reads: String, layout: String },
    #[error("the package does not say which log layouts it reads (no X-Capstan-Log-Layouts: built before capstan-agent said it), its log is in layout {layout}")]
    Undeclared { layout: String },
    #[error("which layout its log is in cannot be told (`capstan-agent log layout` did not answer there)")]
    HostUnknown,
}

/// Whether a build reading `reads` reads a log in `layout`; `strict` (a downgrade):
/// only when both are known.
fn readable(reads: Option<&[String]>, layout: &LogLayout, strict: bool) -> Result<(), Unreadable> {
    let layout = match layout {
        LogLayout::None => return Ok(()),
        LogLayout::In(l) => l,
        LogLayout::Unknown if strict => return Err(Unreadable::HostUnknown),
        LogLayout::Unknown => return Ok(()),
    };
    match reads {
        Some(reads) if reads.contains(layout) => Ok(()),
        Some(reads) => Err(Unreadable::Layout {
            reads: reads.join(", "),
            layout: layout.clone(),
        }),
        None if strict => Err(Unreadable::Undeclared {
            layout: layout.clone(),
        }),
        None => Ok(()),
    }
}

/// The package step for a host with `installed`, to get `wanted`.
fn package(
    installed: Option<&String>,
    layout: &LogLayout,
    wanted: &Wanted,
) -> Result<Package, PlanError> {
    let to = || wanted.version.clone();
    let reads = wanted.layouts.as_deref();
    let Some(from) = installed else {
        readable(reads, layout, false).map_err(|why| PlanError::Unreadable { to: to(), why })?;
        return Ok(Package::Install);
    };
    if *from == wanted.version {
        return Ok(Package::Keep);
    }
    let order = version::compare(&wanted.version, from);
    if matches!(order, Some(Ordering::Less) | None) {
        let from = from.clone();
        if !wanted.allow_downgrade {
            return Err(match order {
                None => PlanError::Incomparable { from, to: to() },
                Some(_) => PlanError::Downgrade { from, to: to() },
            });
        }
        return match readable(reads, layout, true) {
            Ok(()) => Ok(Package::Downgrade { from }),
            Err(why) => Err(PlanError::DowngradeUnreadable {
                from,
                to: to(),
                why,
            }),
        };
    }
    if !wanted.upgrade {
        return Err(PlanError::VersionDiffers {
            installed: from.clone(),
            wanted: to(),
        });
    }
    readable(reads, layout, false).map_err(|why| PlanError::Unreadable { to: to(), why })?;
    Ok(Package::Upgrade { from: from.clone() })
}

/// Decides the steps for a host holding `observed`, to get `wanted`.
pub fn plan(observed: &Observed, wanted: &Wanted) -> Result<Plan, PlanError> {
    let package = package(observed.installed.as_ref(), &observed.log_layout, wanted)?;
    // Whether the agent runs once the package step is done: a first install does not
    // start it; an upgrade (or a downgrade) starts it again if it ran (the postinst).
    let running = match package {
        Package::Install => false,
        Package::Keep | Package::Upgrade { .. } | Package::Downgrade { .. } => observed.active,
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
            Package::Downgrade { .. } => Outcome::Downgraded,
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
            log_layout: LogLayout::In("2".into()),
        }
    }

    fn wanted(version: &str, upgrade: bool) -> Wanted {
        Wanted {
            version: version.to_string(),
            layouts: Some(vec!["1".into(), "2".into()]),
            upgrade,
            allow_downgrade: false,
        }
    }

    /// A host running `installed`, its log in `layout`, all else as wanted.
    fn host(installed: &str, layout: LogLayout) -> Observed {
        Observed {
            log_layout: layout,
            ..observed(Some(installed), true, true, true)
        }
    }

    /// `version`, reading `layouts`, with `--upgrade --allow-downgrade`.
    fn allowed(version: &str, layouts: Option<&[&str]>) -> Wanted {
        Wanted {
            layouts: layouts.map(|l| l.iter().map(|s| s.to_string()).collect()),
            allow_downgrade: true,
            ..wanted(version, true)
        }
    }

    fn in_layout(layout: &str) -> LogLayout {
        LogLayout::In(layout.into())
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

    #[test]
    fn given_an_older_package_when_downgrades_are_not_allowed_then_it_is_refused() {
        for upgrade in [false, true] {
            let err = plan(&host("0.2.0", in_layout("2")), &wanted("0.1.0", upgrade)).unwrap_err();
            assert_eq!(
                err.to_string(),
                "downgrade from 0.2.0 to 0.1.0 refused: pass --allow-downgrade"
            );
        }
        let pre = plan(&host("1.0.0", in_layout("2")), &wanted("1.0.0~rc1", true)).unwrap_err();
        assert!(matches!(pre, PlanError::Downgrade { .. }), "{pre}");
    }

    #[test]
    fn given_allow_downgrade_when_the_package_reads_the_hosts_layout_then_it_is_downgraded() {
        let p = plan(
            &host("0.2.0", in_layout("2")),
            &allowed("0.1.0", Some(&["1", "2"])),
        )
        .unwrap();
        assert_eq!(
            p.package,
            Package::Downgrade {
                from: "0.2.0".into()
            }
        );
        assert_eq!(
            p.start,
            Start::Nothing,
            "prerm stops it, postinst starts it"
        );
        assert_eq!(p.outcome(), Outcome::Downgraded);
        assert_eq!(p.outcome().to_string(), "downgraded");
        // Without --upgrade too: --allow-downgrade says it.
        let alone = Wanted {
            upgrade: false,
            ..allowed("0.1.0", Some(&["2"]))
        };
        assert!(plan(&host("0.2.0", in_layout("2")), &alone).is_ok());
        // A host without a log has nothing to misread.
        let bare = plan(&host("0.2.0", LogLayout::None), &allowed("0.1.0", None)).unwrap();
        assert_eq!(bare.outcome(), Outcome::Downgraded);
    }

    #[test]
    fn given_allow_downgrade_when_the_package_would_not_read_the_log_then_it_is_refused() {
        let refused = |observed: LogLayout, layouts: Option<&[&str]>| {
            plan(&host("0.2.0", observed), &allowed("0.1.0", layouts))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(in_layout("2"), Some(&["1"])),
            "downgrade from 0.2.0 to 0.1.0 refused: the package reads log layouts 1, its log is in layout 2"
        );
        assert_eq!(
            refused(in_layout("3"), Some(&["1", "2"])),
            "downgrade from 0.2.0 to 0.1.0 refused: the package reads log layouts 1, 2, its log is in layout 3"
        );
        let undeclared = refused(in_layout("2"), None);
        assert!(
            undeclared.contains("does not say which log layouts it reads")
                && undeclared.ends_with("its log is in layout 2"),
            "{undeclared}"
        );
        let unknown = refused(LogLayout::Unknown, Some(&["1", "2"]));
        assert!(unknown.contains("cannot be told"), "{unknown}");
    }

    #[test]
    fn given_versions_that_cannot_be_compared_then_it_is_a_downgrade_to_allow() {
        let err = plan(&host("0.2.0", in_layout("2")), &wanted("nightly", true)).unwrap_err();
        assert!(matches!(err, PlanError::Incomparable { .. }), "{err}");
        assert!(err.to_string().contains("pass --allow-downgrade"), "{err}");
        let p = plan(
            &host("0.2.0", in_layout("2")),
            &allowed("nightly", Some(&["2"])),
        )
        .unwrap();
        assert_eq!(p.outcome(), Outcome::Downgraded);
    }

    #[test]
    fn given_a_newer_package_or_the_same_release_then_it_is_an_upgrade_as_before() {
        for version in ["0.3.0", "0.2.0-1", "0.2.0+local"] {
            let p = plan(&host("0.2.0", in_layout("2")), &wanted(version, true)).unwrap();
            assert_eq!(
                p.package,
                Package::Upgrade {
                    from: "0.2.0".into()
                },
                "{version}"
            );
        }
        // A package that says it does not read the host's log is refused, upgrade or not.
        let newer = Wanted {
            layouts: Some(vec!["3".into()]),
            ..wanted("0.3.0", true)
        };
        let err = plan(&host("0.2.0", in_layout("1")), &newer).unwrap_err();
        assert_eq!(
            err.to_string(),
            "capstan-agent 0.3.0 refused: the package reads log layouts 3, its log is in layout 1"
        );
        let fresh = Observed {
            installed: None,
            ..host("0.2.0", in_layout("1"))
        };
        assert!(matches!(
            plan(&fresh, &newer),
            Err(PlanError::Unreadable { .. })
        ));
        // One that does not say, or a host that cannot tell, is let through as before.
        let quiet = Wanted {
            layouts: None,
            ..wanted("0.3.0", true)
        };
        assert!(plan(&host("0.2.0", in_layout("2")), &quiet).is_ok());
        assert!(plan(&host("0.2.0", LogLayout::Unknown), &wanted("0.3.0", true)).is_ok());
    }
}

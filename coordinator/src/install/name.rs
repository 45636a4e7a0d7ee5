//! The name `capstan install` gives a host (pure): the one its agent registers
//! under, whose key it registers and whose NATS credentials (`<name>.nk`) it hands
//! the host.
//!
//! The name is the operator's, never the host's: the config's `host` when it says
//! one, else the target's host as written (`root@web-1` → `web-1`). It must be a DNS
//! label (what the agent takes as a name: an address such as `10.0.0.5` is not one,
//! so such a target's config must say `host`), no reserved name
//! ([`crate::natsconf::RESERVED_HOSTS`]: `coordinator` would be handed the
//! coordinators' credentials), and no two targets may share one. The host's own
//! hostname, as the probe reads it, must then agree with it, or that host stops
//! before anything is written: what a host says of itself is only checked, never
//! believed.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("{name:?} ({from}) is not a host name: a DNS label, 1-63 of [a-z0-9-] starting and ending alphanumeric{}",
        if *from == From::Target { "; an address needs `host = \"<name>\"` in its config (--config-dir)" } else { "" })]
    NotALabel { name: String, from: From },
    #[error("{name:?} ({from}) is reserved: `capstan-coordinator nats-config` keeps the coordinators' credentials under that name; give the host another")]
    Reserved { name: String, from: From },
    #[error("the host says its hostname is {said:?}, not {name}: the name {name} ({from}) is not this host's; rename the host or fix the target")]
    Disagrees {
        name: String,
        from: From,
        said: String,
    },
    #[error("the config's `host` is {value}, not a string")]
    NotAString { value: String },
    #[error("{first} and {second} would both be named {name}: each host needs a name of its own")]
    Shared {
        name: String,
        first: String,
        second: String,
    },
}

/// Where a name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// The config's `host`.
    Config,
    /// The target's host, as written.
    Target,
}

impl fmt::Display for From {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            From::Config => "the config's `host`",
            From::Target => "the target's host",
        })
    }
}

/// A host's name and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    pub name: String,
    pub from: From,
}

/// The name of the host `target_host` (as the target writes it) whose config is
/// `config`.
pub fn of(config: &toml::Table, target_host: &str) -> Result<Name, NameError> {
    let (name, from) = match config.get("host") {
        Some(toml::Value::String(h)) => (h.as_str(), From::Config),
        Some(other) => {
            return Err(NameError::NotAString {
                value: other.to_string(),
            })
        }
        None => (target_host, From::Target),
    };
    let name = name.to_string();
    if !capstan_common::validate::is_dns_label(&name) {
        return Err(NameError::NotALabel { name, from });
    }
    if crate::natsconf::RESERVED_HOSTS.contains(&name.as_str()) {
        return Err(NameError::Reserved { name, from });
    }
    Ok(Name { name, from })
}

/// Checks the hostname the probe read (`hostname`) against `name`: read as the agent
/// reads its own (its first label, lower-cased), it must be the name.
pub fn agrees(name: &Name, hostname: &str) -> Result<(), NameError> {
    let said = hostname.trim();
    let first = said
        .split('.')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if first == name.name {
        return Ok(());
    }
    Err(NameError::Disagrees {
        name: name.name.clone(),
        from: name.from,
        said: said.to_string(),
    })
}

/// Checks that no two targets (as written, with their names) share a name.
pub fn distinct<'a>(named: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), NameError> {
    let mut seen: std::collections::BTreeMap<&str, &str> = Default::default();
    for (target, name) in named {
        if let Some(first) = seen.insert(name, target) {
            return Err(NameError::Shared {
                name: name.to_string(),
                first: first.to_string(),
                second: target.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str, from: From) -> Name {
        Name {
            name: name.into(),
            from,
        }
    }

    /// The name of `target` whose config says `host` (if any).
    fn name(host: Option<&str>, target: &str) -> Result<Name, NameError> {
        let mut config: toml::Table = toml::from_str("driver = \"sim\"\n").unwrap();
        if let Some(h) = host {
            config.insert("host".into(), h.into());
        }
        of(&config, target)
    }

    #[test]
    fn the_name_is_the_configs_host_else_the_target_as_written() {
        assert_eq!(
            name(Some("web-1"), "10.0.0.5"),
            Ok(named("web-1", From::Config))
        );
        assert_eq!(name(None, "web-2"), Ok(named("web-2", From::Target)));
        let numeric: toml::Table = toml::from_str("host = 5\n").unwrap();
        assert_eq!(
            of(&numeric, "web-1"),
            Err(NameError::NotAString { value: "5".into() })
        );
    }

    #[test]
    fn a_name_that_is_not_a_dns_label_is_refused_saying_where_it_came_from() {
        let err = name(None, "10.0.0.5").unwrap_err();
        assert_eq!(
            err,
            NameError::NotALabel {
                name: "10.0.0.5".into(),
                from: From::Target
            }
        );
        assert!(
            err.to_string()
                .contains("needs `host = \"<name>\"` in its config"),
            "{err}"
        );
        for bad in ["Web-1", "web_1", "-web", "web.example.com", "fd00::2", ""] {
            assert!(
                matches!(name(None, bad), Err(NameError::NotALabel { .. })),
                "{bad}"
            );
            assert!(
                matches!(
                    name(Some(bad), "web-1"),
                    Err(NameError::NotALabel {
                        from: From::Config,
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_coordinators_name_is_reserved_from_the_target_and_the_config() {
        for (config, target, from) in [
            (None, "coordinator", From::Target),
            (Some("coordinator"), "10.0.0.5", From::Config),
        ] {
            let err = name(config, target).unwrap_err();
            assert_eq!(
                err,
                NameError::Reserved {
                    name: "coordinator".into(),
                    from
                }
            );
            assert!(err.to_string().contains("is reserved"), "{err}");
        }
    }

    #[test]
    fn a_host_whose_hostname_is_another_name_is_refused() {
        let web = named("web-1", From::Target);
        assert_eq!(agrees(&web, "web-1"), Ok(()));
        assert_eq!(agrees(&web, "web-1.example.com\n"), Ok(()));
        assert_eq!(agrees(&web, "WEB-1"), Ok(()), "the agent lower-cases it");
        let err = agrees(&web, "coordinator").unwrap_err();
        assert_eq!(
            err,
            NameError::Disagrees {
                name: "web-1".into(),
                from: From::Target,
                said: "coordinator".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "the host says its hostname is \"coordinator\", not web-1: the name web-1 \
             (the target's host) is not this host's; rename the host or fix the target"
        );
        assert!(agrees(&named("web-1", From::Config), "web-2").is_err());
        assert!(agrees(&web, "").is_err());
    }

    #[test]
    fn two_targets_may_not_share_a_name() {
        assert_eq!(distinct([("a", "a"), ("10.0.0.5", "b")]), Ok(()));
        assert_eq!(
            distinct([("10.0.0.4", "web"), ("b", "b"), ("10.0.0.5", "web")]),
            Err(NameError::Shared {
                name: "web".into(),
                first: "10.0.0.4".into(),
                second: "10.0.0.5".into()
            })
        );
    }
}

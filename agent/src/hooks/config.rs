//! `[[hooks]]` in the agent config: the ordered list of owners, validated once at
//! load. Every error names the hook (and the offending phase or executable).

use super::{HookKind, HookOwner, Phase, DEFAULT_TIMEOUT};
use capstan_common::nats::{NatsConfig, NatsError};
use serde::Deserialize;
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest timeout accepted, in seconds.
const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// One `[[hooks]]` table, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// The owner's name: 1-63 of `[a-z0-9_-]`, unique.
    pub name: String,
    /// `exec` or `nats`.
    pub kind: String,
    /// `exec`: the program and its arguments; argv[0] must be an executable file (an
    /// absolute path, or a name found on `PATH`).
    #[serde(default)]
    pub argv: Vec<String>,
    /// `nats`: the request/reply subject (no wildcards).
    pub subject: Option<String>,
    /// `nats`: the server, e.g. `nats://127.0.0.1:4222`, when it needs no credentials
    /// (else `url` goes in `[hooks.nats]`).
    pub url: Option<String>,
    /// `nats`: the connection with credentials and TLS: the same keys as the agent's
    /// `[nats]` section (`url`, `user` + `password`/`password_file`, `nkey_seed_file`,
    /// `creds_file`, `tls_ca_file`, `tls_cert_file` + `tls_key_file`, `require_tls`).
    pub nats: Option<NatsConfig>,
    /// Seconds (fractions allowed) before a call is killed and counts as failed.
    pub timeout: Option<f64>,
    /// The phases this owner takes part in (at least one).
    #[serde(default)]
    pub phases: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum HookConfigError {
    #[error("hook {index}: `name` {name:?} must be 1-63 of [a-z0-9_-]")]
    Name { index: usize, name: String },
    #[error("hook {0:?} is configured twice")]
    Duplicate(String),
    #[error("hook {0:?}: `phases` is empty")]
    NoPhases(String),
    #[error("hook {hook:?}: unknown phase {phase:?} (expected after_namespace_prepared, before_workload_start, before_workload_stop or before_namespace_delete)")]
    UnknownPhase { hook: String, phase: String },
    #[error("hook {hook:?}: it grants in {phase} but does not take {revoke}, so what it grants could never be revoked or compensated; list {revoke} too")]
    Unpaired {
        hook: String,
        phase: Phase,
        revoke: Phase,
    },
    #[error("hook {hook:?}: phase {phase} is listed twice")]
    RepeatedPhase { hook: String, phase: Phase },
    #[error("hook {hook:?}: unknown kind {kind:?} (expected exec or nats)")]
    UnknownKind { hook: String, kind: String },
    #[error("hook {0:?}: nats hooks need `url` or a `[hooks.nats]` table (not both) and a `subject` without wildcards or spaces (and no `argv`)")]
    Nats(String),
    #[error("hook {hook:?}: invalid `[hooks.nats]` connection settings")]
    NatsConnection {
        hook: String,
        #[source]
        source: NatsError,
    },
    #[error("hook {0:?}: exec hooks need a non-empty `argv` (and no `subject`, `url` or `[hooks.nats]`)")]
    Argv(String),
    #[error("hook {hook:?}: executable {path:?} not found or not executable")]
    Executable { hook: String, path: PathBuf },
    #[error("hook {0:?}: `timeout` must be more than 0 and at most 3600 seconds")]
    Timeout(String),
}

fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Dot-separated non-empty tokens of printable ASCII, no wildcards.
fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && t.bytes().all(|b| b.is_ascii_graphic())
        })
}

fn parse_phase(s: &str) -> Option<Phase> {
    Phase::ALL.into_iter().find(|p| p.as_str() == s)
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// argv[0] as an absolute path: itself when it has a `/`, else the first hit on PATH.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// Validates the configured owners, in order.
pub fn owners(configs: &[HookConfig]) -> Result<Vec<HookOwner>, HookConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(configs.len());
    for (index, c) in configs.iter().enumerate() {
        let name = c.name.clone();
        if !valid_name(&name) {
            return Err(HookConfigError::Name { index, name });
        }
        if !seen.insert(name.clone()) {
            return Err(HookConfigError::Duplicate(name));
        }
        if c.phases.is_empty() {
            return Err(HookConfigError::NoPhases(name));
        }
        let mut phases = Vec::new();
        for p in &c.phases {
            let phase = parse_phase(p).ok_or_else(|| HookConfigError::UnknownPhase {
                hook: name.clone(),
                phase: p.clone(),
            })?;
            if phases.contains(&phase) {
                return Err(HookConfigError::RepeatedPhase { hook: name, phase });
            }
            phases.push(phase);
        }
        for phase in &phases {
            let Some(revoke) = phase.compensation() else {
                continue;
            };
            if !phases.contains(&revoke) {
                return Err(HookConfigError::Unpaired {
                    hook: name,
                    phase: *phase,
                    revoke,
                });
            }
        }
        let timeout = match c.timeout {
            None => DEFAULT_TIMEOUT,
            Some(t) if t > 0.0 && t <= MAX_TIMEOUT_SECS => Duration::from_secs_f64(t),
            Some(_) => return Err(HookConfigError::Timeout(name)),
        };
        let kind = match c.kind.as_str() {
            "exec" => {
                if c.argv.is_empty() || c.subject.is_some() || c.url.is_some() || c.nats.is_some() {
                    return Err(HookConfigError::Argv(name));
                }
                let program = resolve(&c.argv[0]).ok_or_else(|| HookConfigError::Executable {
                    hook: name.clone(),
                    path: PathBuf::from(&c.argv[0]),
                })?;
                let mut argv = c.argv.clone();
                argv[0] = program.to_string_lossy().into_owned();
                HookKind::Exec { argv }
            }
            "nats" => {
                let nats = match (&c.url, &c.nats) {
                    (Some(url), None) if !url.is_empty() => NatsConfig {
                        url: url.clone(),
                        ..NatsConfig::default()
                    },
                    (None, Some(nats)) if !nats.url.is_empty() => nats.clone(),
                    _ => return Err(HookConfigError::Nats(name)),
                };
                match &c.subject {
                    Some(subject) if c.argv.is_empty() && valid_subject(subject) => {
                        nats.validate()
                            .map_err(|source| HookConfigError::NatsConnection {
                                hook: name.clone(),
                                source,
                            })?;
                        HookKind::Nats {
                            nats: Box::new(nats),
                            subject: subject.clone(),
                        }
                    }
                    _ => return Err(HookConfigError::Nats(name)),
                }
            }
            other => {
                return Err(HookConfigError::UnknownKind {
                    hook: name,
                    kind: other.to_string(),
                })
            }
        };
        out.push(HookOwner {
            name,
            kind,
            timeout,
            phases,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(name: &str, argv: &[&str], phases: &[&str]) -> HookConfig {
        HookConfig {
            name: name.into(),
            kind: "exec".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            subject: None,
            url: None,
            nats: None,
            timeout: None,
            phases: phases.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn err(configs: &[HookConfig]) -> String {
        owners(configs).unwrap_err().to_string()
    }

    #[test]
    fn an_owner_that_grants_without_revoking_is_refused_by_name() {
        let e = err(&[
            hook(
                "ok",
                &["/bin/true"],
                &["before_workload_start", "before_workload_stop"],
            ),
            hook("iam", &["/bin/true"], &["before_workload_start"]),
        ]);
        assert!(e.contains(r#"hook "iam""#), "{e}");
        assert!(e.contains("list before_workload_stop too"), "{e}");
        let e = err(&[hook("net", &["/bin/true"], &["after_namespace_prepared"])]);
        assert!(e.contains("list before_namespace_delete too"), "{e}");
        // Revoking without granting is allowed (a drain on stop).
        owners(&[hook("drain", &["/bin/true"], &["before_workload_stop"])]).unwrap();
    }

    #[test]
    fn valid_owners_keep_config_order_and_resolve_path() {
        let o = owners(&[
            hook(
                "iam",
                &["sh", "-c", "true"],
                &["before_workload_start", "before_workload_stop"],
            ),
            hook(
                "net",
                &["/bin/true"],
                &["after_namespace_prepared", "before_namespace_delete"],
            ),
        ])
        .unwrap();
        assert_eq!(o[0].name, "iam");
        assert!(matches!(&o[0].kind, HookKind::Exec { argv } if argv[0].ends_with("/sh")));
        assert_eq!(
            o[1].phases,
            vec![Phase::AfterNamespacePrepared, Phase::BeforeNamespaceDelete]
        );
        assert_eq!(o[1].timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn an_empty_phase_list_names_the_hook() {
        assert!(err(&[hook("iam", &["/bin/true"], &[])]).contains("\"iam\""));
    }

    #[test]
    fn an_unknown_phase_is_named() {
        let e = err(&[hook("iam", &["/bin/true"], &["before_lunch"])]);
        assert!(e.contains("before_lunch") && e.contains("iam"), "{e}");
    }

    #[test]
    fn a_duplicate_name_is_named() {
        let h = hook("iam", &["/bin/true"], &["before_workload_stop"]);
        let e = err(&[h.clone(), h]);
        assert!(e.contains("\"iam\" is configured twice"), "{e}");
    }

    #[test]
    fn a_missing_executable_is_named() {
        let e = err(&[hook(
            "iam",
            &["/nonexistent/capstan-hook"],
            &["before_workload_stop"],
        )]);
        assert!(
            e.contains("/nonexistent/capstan-hook") && e.contains("iam"),
            "{e}"
        );
        let e = err(&[hook(
            "net",
            &["capstan-no-such-hook"],
            &["before_workload_stop"],
        )]);
        assert!(e.contains("capstan-no-such-hook"), "{e}");
    }

    #[test]
    fn nats_owners_need_a_url_and_a_plain_subject_and_timeouts_are_bounded() {
        let mut h = hook("bus", &[], &["before_workload_stop"]);
        h.kind = "nats".into();
        h.subject = Some("iam.hooks".into());
        h.url = Some("nats://127.0.0.1:4222".into());
        let o = owners(std::slice::from_ref(&h)).unwrap();
        assert!(matches!(&o[0].kind, HookKind::Nats { subject, .. } if subject == "iam.hooks"));
        for bad in ["iam.*", "iam.>", "iam..x", "", "a b"] {
            h.subject = Some(bad.into());
            assert!(err(std::slice::from_ref(&h)).contains("\"bus\""), "{bad}");
        }
        h.subject = Some("iam.hooks".into());
        h.url = None;
        assert!(err(&[h]).contains("url"));
        let mut h = hook("slow", &["/bin/true"], &["before_workload_stop"]);
        h.timeout = Some(0.0);
        assert!(err(&[h]).contains("timeout"));
    }
}

//! The pure half of the docker driver: names, labels, hashes and the container
//! definition built from a spec. No I/O here, so all of it is unit-tested.

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, Mount, MountTypeEnum, NetworkingConfig,
    PortBinding, RestartPolicy, RestartPolicyNameEnum,
};
use capstan_common::Spec;
use capstan_driver::RevisionRef;
use std::collections::{BTreeMap, HashMap};

/// Every object capstan creates carries this label, set to `true`.
pub const MANAGED: &str = "io.capstan.managed";
/// The agent host that owns the object: agents sharing a dockerd never touch each
/// other's objects.
pub const HOST: &str = "io.capstan.host";
pub const NAMESPACE: &str = "io.capstan.namespace";
pub const WORKLOAD: &str = "io.capstan.workload";
pub const REVISION: &str = "io.capstan.revision";
/// The hash of the revision's spec (its canonical JSON).
pub const SPEC_HASH: &str = "io.capstan.spec-hash";
/// The hash of the environment the container was created with (spec env + launch
/// env). Labels cannot change after creation, so a different hash means "recreate".
pub const ENV_HASH: &str = "io.capstan.env-hash";

/// The longest container name we create: a DNS label's length, so the name also
/// works as a hostname.
pub const MAX_NAME: usize = 63;

/// The bridge network of a namespace.
pub fn network_name(namespace: &str) -> String {
    format!("capstan-{namespace}")
}

/// The readable container name, `capstan-<ns>-<workload>-<rev>`, or when that is too
/// long its head and a hash of the full triple. Two triples can spell the same readable
/// name (`a`+`b-c` vs `a-b`+`c`): the driver then falls back to [`hashed_name`].
pub fn container_name(rev: RevisionRef<'_>) -> String {
    let plain = format!(
        "capstan-{}-{}-{}",
        rev.namespace, rev.workload, rev.revision
    );
    if plain.len() <= MAX_NAME {
        plain
    } else {
        hashed_name(rev)
    }
}

/// A name unique to the triple: `<head of the readable name>-<12 hex of its hash>`.
pub fn hashed_name(rev: RevisionRef<'_>) -> String {
    let plain = format!(
        "capstan-{}-{}-{}",
        rev.namespace, rev.workload, rev.revision
    );
    let hash =
        short_hash(format!("{}\n{}\n{}", rev.namespace, rev.workload, rev.revision).as_bytes());
    let head_len = MAX_NAME - hash.len() - 1;
    let head = plain[..plain.len().min(head_len)].trim_end_matches('-');
    format!("{head}-{hash}")
}

pub use capstan_driver::{short_hash, spec_hash};

/// The hash recorded in [`ENV_HASH`].
pub fn env_hash(env: &BTreeMap<String, String>) -> String {
    let mut bytes = Vec::new();
    for (k, v) in env {
        bytes.extend_from_slice(k.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(v.as_bytes());
        bytes.push(0);
    }
    short_hash(&bytes)
}

/// The first env entry that cannot be written into a container (`NAME=value` form):
/// a name that is empty or holds `=` or NUL, or a value holding NUL.
pub fn bad_env(env: &BTreeMap<String, String>) -> Option<&str> {
    env.iter()
        .find(|(k, v)| !capstan_common::validate::is_env_name(k) || v.contains('\0'))
        .map(|(k, _)| k.as_str())
}

/// Labels on a revision's container.
pub fn container_labels(
    host: &str,
    rev: RevisionRef<'_>,
    spec: &Spec,
    env: &BTreeMap<String, String>,
) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED.into(), "true".into()),
        (HOST.into(), host.into()),
        (NAMESPACE.into(), rev.namespace.into()),
        (WORKLOAD.into(), rev.workload.into()),
        (REVISION.into(), rev.revision.into()),
        (SPEC_HASH.into(), spec_hash(spec)),
        (ENV_HASH.into(), env_hash(env)),
    ])
}

/// Labels on a namespace's network.
pub fn network_labels(host: &str, namespace: &str) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED.into(), "true".into()),
        (HOST.into(), host.into()),
        (NAMESPACE.into(), namespace.into()),
    ])
}

/// True when `labels` say the object is ours on `host`.
pub fn is_ours(labels: Option<&HashMap<String, String>>, host: &str) -> bool {
    labels.is_some_and(|l| {
        l.get(MANAGED).map(String::as_str) == Some("true")
            && l.get(HOST).map(String::as_str) == Some(host)
    })
}

/// True when `labels` say the object is ours on `host` and carry every `extra` label:
/// what [`label_filter`] asks the engine for, checked on what it answered.
pub fn matches(
    labels: Option<&HashMap<String, String>>,
    host: &str,
    extra: &[(&str, &str)],
) -> bool {
    is_ours(labels, host)
        && extra
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(*k)).map(String::as_str) == Some(*v))
}

/// The list filter selecting this host's objects, narrowed by extra `key=value` labels.
pub fn label_filter(host: &str, extra: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    let mut labels = vec![format!("{MANAGED}=true"), format!("{HOST}={host}")];
    labels.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
    HashMap::from([("label".to_string(), labels)])
}

/// The container definition of a revision: the spec as given, restart policy "no"
/// (the agent supervises), attached to the namespace's network.
pub fn container_body(
    host: &str,
    rev: RevisionRef<'_>,
    spec: &Spec,
    env: &BTreeMap<String, String>,
) -> ContainerCreateBody {
    let network = network_name(rev.namespace);
    let mut exposed = HashMap::new();
    let mut bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    for p in &spec.ports {
        let key = format!("{}/{}", p.container_port, p.protocol.as_str());
        exposed.insert(key.clone(), HashMap::new());
        bindings
            .entry(key)
            .or_default()
            .get_or_insert_with(Vec::new)
            .push(PortBinding {
                host_ip: p.host_ip.clone(),
                host_port: Some(if p.host_port == 0 {
                    String::new()
                } else {
                    p.host_port.to_string()
                }),
            });
    }
    let mounts = spec
        .mounts
        .iter()
        .map(|m| Mount {
            source: Some(m.source.clone()),
            target: Some(m.target.clone()),
            read_only: Some(m.read_only),
            typ: Some(if m.source.starts_with('/') {
                MountTypeEnum::BIND
            } else {
                MountTypeEnum::VOLUME
            }),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    ContainerCreateBody {
        image: spec.image.clone(),
        cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
        env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: spec.working_dir.clone(),
        labels: Some(container_labels(host, rev, spec, env)),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(HostConfig {
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            network_mode: Some(network.clone()),
            port_bindings: (!bindings.is_empty()).then_some(bindings),
            mounts: (!mounts.is_empty()).then_some(mounts),
            ..Default::default()
        }),
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                network,
                EndpointSettings {
                    aliases: Some(vec![rev.workload.to_string()]),
                    ..Default::default()
                },
            )])),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::{DriverKind, PortMapping, Protocol};
    use capstan_driver::{merged_env, LaunchEnv};

    fn rev<'a>(ns: &'a str, wl: &'a str, r: &'a str) -> RevisionRef<'a> {
        RevisionRef {
            namespace: ns,
            workload: wl,
            revision: r,
        }
    }

    fn spec() -> Spec {
        Spec {
            driver: DriverKind::DOCKER,
            image: Some("capstan-test/busybox:1".into()),
            command: vec!["sleep".into(), "1".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            working_dir: Some("/tmp".into()),
            ports: vec![PortMapping {
                container_port: 80,
                host_port: 0,
                host_ip: Some("127.0.0.1".into()),
                protocol: Protocol::Tcp,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn names_are_readable_and_bounded() {
        assert_eq!(container_name(rev("ns", "web", "r1")), "capstan-ns-web-r1");
        let long = "a".repeat(63);
        let name = container_name(rev(&long, &long, "r1"));
        assert_eq!(name.len(), MAX_NAME);
        assert!(name.starts_with("capstan-aaa"));
        // Different triples never share a hashed name.
        assert_ne!(
            hashed_name(rev("a", "b-c", "d")),
            hashed_name(rev("a-b", "c", "d"))
        );
        assert_eq!(
            container_name(rev("a", "b-c", "d")),
            container_name(rev("a-b", "c", "d"))
        );
    }

    #[test]
    fn env_hash_follows_the_merged_env() {
        let s = spec();
        let none = LaunchEnv::new();
        let some = LaunchEnv::from([("TOKEN".into(), "opaque-x".into())]);
        let (a, b) = (merged_env(&s, &none), merged_env(&s, &some));
        assert_ne!(env_hash(&a), env_hash(&b));
        assert_eq!(env_hash(&a), env_hash(&merged_env(&s, &none)));
        assert_eq!(b.get("TOKEN").map(String::as_str), Some("opaque-x"));
    }

    #[test]
    fn bad_env_is_caught() {
        let mut env = BTreeMap::from([("OK".to_string(), "v".to_string())]);
        assert_eq!(bad_env(&env), None);
        env.insert("A=B".into(), "v".into());
        assert_eq!(bad_env(&env), Some("A=B"));
        let nul = BTreeMap::from([("X".to_string(), "a\0b".to_string())]);
        assert_eq!(bad_env(&nul), Some("X"));
    }

    #[test]
    fn matches_checks_the_host_and_every_extra_label() {
        let s = spec();
        let env = merged_env(&s, &LaunchEnv::new());
        let labels = container_labels("h1", rev("ns", "web", "r1"), &s, &env);
        let l = Some(&labels);
        assert!(matches(l, "h1", &[]));
        assert!(matches(l, "h1", &[(NAMESPACE, "ns"), (REVISION, "r1")]));
        // What an engine reading label filters as "any of" could return.
        assert!(!matches(l, "h2", &[(NAMESPACE, "ns")]));
        assert!(!matches(l, "h1", &[(NAMESPACE, "ns"), (REVISION, "r2")]));
        assert!(!matches(None, "h1", &[]));
    }

    #[test]
    fn body_carries_the_spec() {
        let s = spec();
        let env = merged_env(&s, &LaunchEnv::new());
        let body = container_body("h1", rev("ns", "web", "r1"), &s, &env);
        assert_eq!(body.cmd, Some(vec!["sleep".to_string(), "1".to_string()]));
        assert_eq!(body.env, Some(vec!["A=1".to_string()]));
        assert_eq!(body.working_dir.as_deref(), Some("/tmp"));
        let labels = body.labels.unwrap();
        assert!(is_ours(Some(&labels), "h1"));
        assert!(!is_ours(Some(&labels), "h2"));
        assert_eq!(labels[REVISION], "r1");
        let hc = body.host_config.unwrap();
        assert_eq!(
            hc.restart_policy.unwrap().name,
            Some(RestartPolicyNameEnum::NO)
        );
        assert_eq!(hc.network_mode.as_deref(), Some("capstan-ns"));
        let b = &hc.port_bindings.unwrap()["80/tcp"];
        assert_eq!(b.as_ref().unwrap()[0].host_ip.as_deref(), Some("127.0.0.1"));
    }
}

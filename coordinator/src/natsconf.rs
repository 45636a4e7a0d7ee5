//! `capstan-coordinator nats-config`: the nats-server accounts that confine each host
//! to itself (`docs/nats.md`, *Security model*).
//!
//! - `CAPSTAN`: the coordinators (one nkey user). Holds the fleet's JetStream: the
//!   command stream and the registry, binding and key buckets.
//! - `HOST_<host>`: the host's agent (one nkey user). No JetStream of its own, and
//!   nothing but what it imports: from `CAPSTAN` its own command subject (a stream
//!   import: it hears each command published for it, its bell), the coordinators'
//!   answer to its sync requests (`capstan.v1.sync.<host>`) and its own heartbeat
//!   key — no JetStream API of the fleet's, no consumer, no ack; from `STORE_<host>`
//!   its own record subject, results and direct gets of its own last record and
//!   progress, each under exactly the subject it names, the direct gets under
//!   [`nats_layout::HOST_API_PREFIX`] (nothing that waits in the server's JetStream
//!   API queue). It exports its RPC subjects and its result notices to `CAPSTAN`.
//!   Limits: [`HOST_MAX_CONNECTIONS`], [`HOST_MAX_SUBSCRIPTIONS`].
//! - `STORE_<host>`: no users. The host's event stream and results bucket, bounded
//!   by this account's file quota (`--host-quota`; no memory: it holds file streams
//!   only, and memory quotas are reserved from the server's `max_memory_store` at
//!   start, which thousands of hosts' would exhaust). It exports what the host may
//!   use to `HOST_<host>` and its whole JetStream API to `CAPSTAN`, which imports it
//!   under [`nats_layout::store_api_prefix`].
//!
//! Why accounts and not permissions: the server checks a client's permission on the
//! subject it publishes to, not on the reply subject it names, and JetStream answers
//! on that reply subject with the account's rights: with users of one account, a
//! host could have its answers stored in another host's stream. Across a service
//! import the reply subject is the importer's own (the server maps it to a private
//! `_R_` subject), so whatever a host names as a reply lands in its own account,
//! where nothing but its own imports listens. And a storage account without users
//! means the host never shares an account with a JetStream it could address.
//!
//! [`render`] is pure (the config text from the names and public keys);
//! [`generate`] keeps the nkeys in `<out>/credentials/` and reuses them, so running it
//! again with more hosts changes nothing for the hosts already there.

use capstan_common::nats_layout;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The accounts to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    /// The coordinators' user's public nkey.
    pub coordinator: String,
    /// Each host and its user's public nkey, in order.
    pub hosts: Vec<(String, String)>,
    /// Each host's storage quota (`max_file` of `STORE_<host>`), e.g. `2G`.
    pub host_quota: String,
    /// The fleet account's quota (`max_file` of `CAPSTAN`), e.g. `8G`.
    pub fleet_quota: String,
}

#[derive(Debug, thiserror::Error)]
pub enum NatsConfError {
    #[error("{0:?} is not a host name (a DNS label, 1-63 of [a-z0-9-])")]
    Host(String),
    #[error("host {0} is listed twice")]
    Duplicate(String),
    #[error("no hosts: give --host NAME or --hosts-file FILE")]
    NoHosts,
    #[error("{0:?} is not a size (digits, then K, M, G or T)")]
    Size(String),
    #[error("--fleet-quota {0} is too small: the command stream alone reserves 1 GiB of it; give it at least 2G")]
    FleetQuota(String),
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} does not hold an nkey user seed", path.display())]
    Seed { path: PathBuf },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `2G`, `512M`, `100000`: what nats-server takes as a size; its bytes.
pub fn check_size(size: &str) -> Result<u64, NatsConfError> {
    let digits = size.trim_end_matches(['K', 'M', 'G', 'T']);
    let suffix = &size[digits.len()..];
    let bad = || NatsConfError::Size(size.to_string());
    if digits.is_empty() || suffix.len() > 1 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let shift = match suffix {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => 40,
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(bad)
}

/// The host names of a hosts file: one a line, `#` comments; `user@host[:port]`
/// (as `capstan install` takes them) gives `host`.
pub fn hosts_of(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let host = l.rsplit_once('@').map_or(l, |(_, h)| h);
            host.split(':').next().unwrap_or(host).to_string()
        })
        .collect()
}

fn host_account(host: &str) -> String {
    format!("\"HOST_{host}\"")
}

fn store_account(host: &str) -> String {
    format!("\"STORE_{host}\"")
}

/// What host `host`'s agent may use of the fleet's account (`CAPSTAN`): hear its
/// command subject (a stream), ask for its commands (a service answered by the
/// coordinators), put its heartbeat. `(subject, kind)`.
fn from_fleet(host: &str) -> Vec<(String, Kind)> {
    vec![
        (nats_layout::cmd_subject(host), Kind::Stream),
        (nats_layout::sync_subject(host), Kind::Service),
        (
            format!("$KV.{}.{host}", nats_layout::HOSTS_BUCKET),
            Kind::Service,
        ),
    ]
}

/// How a subject is shared between two accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Messages published in the exporting account reach the importer's subscribers.
    Stream,
    /// The importer's requests (or plain publishes) reach the exporting account;
    /// their replies come back into the importer's own account.
    Service,
}

/// The most connections a host's account may hold at once: the agent needs one, and a
/// reconnect after a partition may find its old one not yet timed out.
pub const HOST_MAX_CONNECTIONS: u32 = 4;

/// The most subscriptions each connection of a host's account may hold (nats-server
/// applies an account's `max_subscriptions` to each connection): the agent needs a few
/// (its command bell, its RPC subject, its replies).
pub const HOST_MAX_SUBSCRIPTIONS: u32 = 32;

/// What host `host`'s agent may use of its storage account: publish its records and
/// read its last one, put its results and read its own progress. Direct gets and
/// publishes only: no request that waits in the server's JetStream API queue, which
/// every account shares (a host flooding it — once with its own streams' info — had
/// the coordinators' requests dropped).
fn from_store(host: &str) -> Vec<(String, bool, Option<&'static str>)> {
    let evt = nats_layout::EVT_STREAM;
    let results = format!("KV_{}", nats_layout::RESULTS_BUCKET);
    let bucket = nats_layout::RESULTS_BUCKET;
    vec![
        (nats_layout::evt_subject(host), false, None),
        (
            format!(
                "$JS.API.DIRECT.GET.{evt}.{}",
                nats_layout::evt_subject(host)
            ),
            true,
            None,
        ),
        (format!("$KV.{bucket}.{host}.>"), false, None),
        (
            format!("$JS.API.DIRECT.GET.{results}.$KV.{bucket}.{host}._progress"),
            true,
            None,
        ),
    ]
}

fn export(out: &mut String, subject: &str, to: &str, response: Option<&str>) {
    export_as(out, Kind::Service, subject, to, response);
}

fn export_as(out: &mut String, kind: Kind, subject: &str, to: &str, response: Option<&str>) {
    let kind = match kind {
        Kind::Stream => "stream",
        Kind::Service => "service",
    };
    let _ = write!(out, "      {{ {kind}: \"{subject}\", accounts: [{to}]");
    if let Some(r) = response {
        let _ = write!(out, ", response_type: {r}");
    }
    out.push_str(" }\n");
}

fn import(out: &mut String, account: &str, subject: &str, api: bool) {
    import_as(out, Kind::Service, account, subject, api);
}

fn import_as(out: &mut String, kind: Kind, account: &str, subject: &str, api: bool) {
    let kind = match kind {
        Kind::Stream => "stream",
        Kind::Service => "service",
    };
    let _ = write!(
        out,
        "      {{ {kind}: {{ account: {account}, subject: \"{subject}\" }}"
    );
    if api {
        let to = subject.replacen("$JS.API", nats_layout::HOST_API_PREFIX, 1);
        let _ = write!(out, ", to: \"{to}\"");
    }
    out.push_str(" }\n");
}

/// The nats-server config for `accounts`.
pub fn render(accounts: &Accounts) -> String {
    let mut out = String::new();
    let names: Vec<&str> = accounts.hosts.iter().map(|(h, _)| h.as_str()).collect();
    let _ = writeln!(
        out,
        "# Generated by `capstan-coordinator nats-config` ({} hosts: {}).\n\
         # Each host's agent is confined to an account of its own; docs/nats.md,\n\
         # \"Security model\", says what each part is for. Regenerate it (the same output\n\
         # directory keeps every key) rather than editing it; restart the server after\n\
         # adding hosts (a reload does not take new accounts in: docs/nats.md).\n\
         # Run: nats-server -c nats-server.conf -js -sd /var/lib/nats",
        names.len(),
        names.join(", ")
    );
    out.push_str("jetstream {\n  max_memory_store: 256M\n}\n\naccounts {\n");
    // The fleet's account.
    let _ = writeln!(
        out,
        "  CAPSTAN {{\n    jetstream {{ max_file: {}, max_mem: 64M }}\n    users = [ {{ nkey: {} }} ]",
        accounts.fleet_quota, accounts.coordinator
    );
    out.push_str("    exports = [\n");
    for (host, _) in &accounts.hosts {
        let _ = writeln!(
            out,
            "      # {host}: its command bell, its sync requests, its heartbeat"
        );
        for (subject, kind) in from_fleet(host) {
            export_as(&mut out, kind, &subject, &host_account(host), None);
        }
    }
    out.push_str("    ]\n    imports = [\n");
    for (host, _) in &accounts.hosts {
        let _ = writeln!(
            out,
            "      # {host}: its RPC, its result notices, its storage's JetStream API"
        );
        let _ = writeln!(
            out,
            "      {{ service: {{ account: {}, subject: \"{}\" }} }}",
            host_account(host),
            nats_layout::rpc_subject(host, "*")
        );
        let _ = writeln!(
            out,
            "      {{ stream: {{ account: {}, subject: \"capstan.v1.res.{host}.>\" }} }}",
            host_account(host)
        );
        let _ = writeln!(
            out,
            "      {{ service: {{ account: {}, subject: \"$JS.API.>\" }}, to: \"{}.>\" }}",
            store_account(host),
            nats_layout::store_api_prefix(host)
        );
    }
    out.push_str("    ]\n  }\n");
    for (host, nkey) in &accounts.hosts {
        let _ = writeln!(
            out,
            "\n  # host {host}\n  {} {{\n    users = [ {{ nkey: {nkey} }} ]\n    \
             limits {{ max_connections: {HOST_MAX_CONNECTIONS}, max_subscriptions: {HOST_MAX_SUBSCRIPTIONS} }}\n    \
             imports = [",
            host_account(host)
        );
        for (subject, kind) in from_fleet(host) {
            import_as(&mut out, kind, "CAPSTAN", &subject, false);
        }
        for (subject, api, _) in from_store(host) {
            import(&mut out, &store_account(host), &subject, api);
        }
        let _ = writeln!(
            out,
            "    ]\n    exports = [\n      {{ service: \"{}\", accounts: [CAPSTAN] }}\n      {{ stream: \"capstan.v1.res.{host}.>\", accounts: [CAPSTAN] }}\n    ]\n  }}",
            nats_layout::rpc_subject(host, "*")
        );
        let _ = writeln!(
            out,
            "  {} {{\n    jetstream {{ max_file: {}, max_mem: 0 }}\n    exports = [",
            store_account(host),
            accounts.host_quota
        );
        for (subject, _, _) in from_store(host) {
            export(&mut out, &subject, &host_account(host), None);
        }
        export(&mut out, "$JS.API.>", "CAPSTAN", Some("stream"));
        out.push_str("    ]\n  }\n");
    }
    out.push_str("}\n");
    out
}

/// The user's public nkey from the seed in `path`, made there (0600) first if
/// there is none.
fn user_key(path: &Path) -> Result<String, NatsConfError> {
    match std::fs::read_to_string(path) {
        Ok(seed) => nkeys::KeyPair::from_seed(seed.trim())
            .ok()
            .filter(|k| k.public_key().starts_with('U'))
            .map(|k| k.public_key())
            .ok_or_else(|| NatsConfError::Seed {
                path: path.to_path_buf(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let pair = nkeys::KeyPair::new_user();
            let seed = pair.seed().map_err(|_| NatsConfError::Seed {
                path: path.to_path_buf(),
            })?;
            let write = |source| NatsConfError::Write {
                path: path.to_path_buf(),
                source,
            };
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(write)?;
            writeln!(file, "{seed}").map_err(write)?;
            Ok(pair.public_key())
        }
        Err(source) => Err(NatsConfError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Names no host may have: `coordinator.nk` holds the coordinators' seed next to the
/// hosts' `<host>.nk` (`capstan install` would hand a host so named that seed).
pub const RESERVED_HOSTS: &[&str] = &["coordinator"];

/// The credentials directory of an output directory: `<host>.nk` and
/// `coordinator.nk`, nkey seeds (mode 0600).
pub fn credentials_dir(out: &Path) -> PathBuf {
    out.join("credentials")
}

/// Writes `<out>/nats-server.conf` for `hosts`, with the nkeys in
/// [`credentials_dir`] (made where missing, reused where present).
pub fn generate(
    out: &Path,
    hosts: &[String],
    host_quota: &str,
    fleet_quota: &str,
) -> Result<Accounts, NatsConfError> {
    if hosts.is_empty() {
        return Err(NatsConfError::NoHosts);
    }
    check_size(host_quota)?;
    if check_size(fleet_quota)? < 2 << 30 {
        return Err(NatsConfError::FleetQuota(fleet_quota.to_string()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for h in hosts {
        if !capstan_common::validate::is_dns_label(h) || RESERVED_HOSTS.contains(&h.as_str()) {
            return Err(NatsConfError::Host(h.clone()));
        }
        if !seen.insert(h) {
            return Err(NatsConfError::Duplicate(h.clone()));
        }
    }
    let creds = credentials_dir(out);
    std::fs::create_dir_all(&creds).map_err(|source| NatsConfError::Write {
        path: creds.clone(),
        source,
    })?;
    let accounts = Accounts {
        coordinator: user_key(&creds.join("coordinator.nk"))?,
        hosts: hosts
            .iter()
            .map(|h| Ok((h.clone(), user_key(&creds.join(format!("{h}.nk")))?)))
            .collect::<Result<_, NatsConfError>>()?,
        host_quota: host_quota.to_string(),
        fleet_quota: fleet_quota.to_string(),
    };
    let path = out.join("nats-server.conf");
    let tmp = out.join(".nats-server.conf.tmp");
    let write = |source| NatsConfError::Write {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, render(&accounts)).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)?;
    Ok(accounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Accounts {
        Accounts {
            coordinator: "UCOORD".into(),
            hosts: vec![("h1".into(), "UH1".into()), ("web-2".into(), "UH2".into())],
            host_quota: "2G".into(),
            fleet_quota: "8G".into(),
        }
    }

    #[test]
    fn each_host_gets_exactly_its_own_subjects() {
        let text = render(&two());
        // h1's account imports only h1's subjects; nothing of web-2's.
        let h1 = text
            .split("\"HOST_h1\" {")
            .nth(1)
            .and_then(|t| t.split("\"STORE_h1\" {").next())
            .unwrap();
        assert!(!h1.contains("web-2"), "{h1}");
        for wanted in [
            "{ stream: { account: CAPSTAN, subject: \"capstan.v1.cmd.h1\" } }",
            "{ service: { account: CAPSTAN, subject: \"capstan.v1.sync.h1\" } }",
            "\"$KV.capstan_hosts.h1\"",
            "\"capstan.v1.evt.h1\"",
            "\"$KV.capstan_results.h1.>\"",
            "nkey: UH1",
        ] {
            assert!(h1.contains(wanted), "{wanted} in {h1}");
        }
        // Every export of the fleet's account names the one account it is for.
        let capstan = text.split("  CAPSTAN {").nth(1).unwrap();
        let exports = capstan.split("imports = [").next().unwrap();
        for line in exports
            .lines()
            .filter(|l| l.contains("service:") || l.contains("stream:"))
        {
            let host = if line.contains(".h1\"") {
                "\"HOST_h1\""
            } else {
                "\"HOST_web-2\""
            };
            assert!(line.contains(&format!("accounts: [{host}]")), "{line}");
        }
        assert!(text.contains("\"STORE_web-2\" {\n    jetstream { max_file: 2G, max_mem: 0 }"));
        assert!(
            h1.contains("    limits { max_connections: 4, max_subscriptions: 32 }\n"),
            "{h1}"
        );
        // Nothing of the fleet's JetStream for a host: no consumer, no ack, no API;
        // of its own storage's API only direct gets (no request for the API queue).
        for denied in [
            "CONSUMER",
            "$JS.ACK",
            "CAPSTAN_CMD",
            "CAPSTAN_COMMANDS",
            "STREAM.",
        ] {
            assert!(!h1.contains(denied), "{denied} in {h1}");
        }
        assert!(text.contains("to: \"capstan.store.web-2.API.>\""));
        assert!(!text.contains("password"));
    }

    #[test]
    fn hosts_files_sizes_and_names() {
        assert_eq!(
            hosts_of("# fleet\nroot@web-1\nweb-2:2222 # port\n\nroot@db-1:22\n"),
            ["web-1", "web-2", "db-1"]
        );
        assert_eq!(check_size("2G").unwrap(), 2 << 30);
        assert_eq!(check_size("512M").unwrap(), 512 << 20);
        assert_eq!(check_size("100000").unwrap(), 100_000);
        for bad in ["", "G", "2GB", "-1", "2 G"] {
            assert!(
                matches!(check_size(bad), Err(NatsConfError::Size(ref s)) if s == bad),
                "{bad}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let bad = generate(dir.path(), &["Web_1".into()], "2G", "8G").unwrap_err();
        assert!(matches!(bad, NatsConfError::Host(_)), "{bad}");
        let twice = generate(dir.path(), &["a".into(), "a".into()], "2G", "8G").unwrap_err();
        assert!(matches!(twice, NatsConfError::Duplicate(_)), "{twice}");
        let small = generate(dir.path(), &["a".into()], "2G", "1G").unwrap_err();
        assert!(matches!(small, NatsConfError::FleetQuota(_)), "{small}");
    }

    /// `packaging/nats-server.conf` is this generator's output for h1 and h2 (with
    /// example keys): regenerate it when the layout changes
    /// (`CAPSTAN_REGENERATE=1 cargo test -p capstan-coordinator shipped_example`).
    #[test]
    fn the_shipped_example_is_what_the_generator_writes() {
        let shipped = include_str!("../../packaging/nats-server.conf");
        let nkeys: Vec<&str> = shipped
            .split("nkey: ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        let [coordinator, h1, h2] = nkeys[..] else {
            panic!("three users in the example: {nkeys:?}");
        };
        let accounts = Accounts {
            coordinator: coordinator.into(),
            hosts: vec![("h1".into(), h1.into()), ("h2".into(), h2.into())],
            host_quota: "2G".into(),
            fleet_quota: "8G".into(),
        };
        if std::env::var_os("CAPSTAN_REGENERATE").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/nats-server.conf");
            std::fs::write(path, render(&accounts)).expect("write the example");
            return;
        }
        assert_eq!(shipped, render(&accounts));
    }

    #[test]
    fn keys_are_kept_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let first = generate(dir.path(), &["h1".into()], "2G", "8G").unwrap();
        let second = generate(dir.path(), &["h1".into(), "h2".into()], "2G", "8G").unwrap();
        assert_eq!(first.coordinator, second.coordinator);
        assert_eq!(first.hosts[0], second.hosts[0]);
        assert_ne!(second.hosts[0].1, second.hosts[1].1);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(credentials_dir(dir.path()).join("h2.nk"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let conf = std::fs::read_to_string(dir.path().join("nats-server.conf")).unwrap();
        assert_eq!(conf, render(&second));
    }
}

//! `capstan-coordinator nats-config`: the nats-server accounts that confine each host
//! to itself (`docs/nats.md`, *Security model*).
//!
//! - `CAPSTAN` ([`FLEET`]): the coordinators (one nkey user). Holds the fleet's
//!   JetStream: the command stream and the registry, binding and key buckets. Exports
//!   to each host its command subject, sync service and heartbeat key, three exports
//!   in all whose host token must be the importing account's name. Imports nothing.
//! - `CAPSTAN_HOSTS` ([`REACH`]): the coordinators' second user. Imports from each
//!   host its RPC subjects and result notices, and from each host's shard the
//!   shard's JetStream API under [`nats_layout::store_api_prefix`]. Exports nothing.
//! - `<host>`: the host's agent (one nkey user), the account named as the host. No
//!   JetStream of its own, and nothing but what it imports: from `CAPSTAN` its own
//!   command subject (a stream import: it hears each command published for it, its
//!   bell), the coordinators' answer to its sync requests (`capstan.v1.sync.<host>`)
//!   and its own heartbeat key — no JetStream API of the fleet's, no consumer, no
//!   ack; from its storage shard its own record subject, results and direct gets of
//!   its own last record and progress, each under exactly the subject it names, the
//!   direct gets under [`nats_layout::HOST_API_PREFIX`] (nothing that waits in the
//!   server's JetStream API queue). It exports its RPC subjects and its result
//!   notices to `CAPSTAN_HOSTS`. Limits: [`HOST_MAX_CONNECTIONS`],
//!   [`HOST_MAX_SUBSCRIPTIONS`].
//! - `SHARD_<n>`: no users. One event stream and one results bucket for the hosts
//!   [`shards`] puts there (at most `--hosts-per-shard`), each host's records on its
//!   own subjects only, bounded together by this account's file quota
//!   (`--shard-quota`; no memory: it holds file streams only, and memory quotas are
//!   reserved from the server's `max_memory_store` at start). It exports to each of
//!   its hosts what that host may use, and its whole JetStream API to
//!   `CAPSTAN_HOSTS`, which imports it once per host, under
//!   [`nats_layout::store_api_prefix`]: a coordinator finds a host's storage by the
//!   host's name alone. Shards, not an
//!   account per host: a stream is a Raft group on a cluster, and two per host were
//!   most of an idle fleet's server CPU and of a registration's time.
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

pub mod shards;

use capstan_common::nats_layout;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The accounts to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    /// The coordinators' user's public nkey ([`FLEET`]).
    pub coordinator: String,
    /// The coordinators' second user's public nkey ([`REACH`]).
    pub coordinator_hosts: String,
    /// Each host, in order.
    pub hosts: Vec<Host>,
    /// Each storage shard's quota (`max_file` of `SHARD_<n>`), e.g. `16G`.
    pub shard_quota: String,
    /// The fleet account's quota (`max_file` of `CAPSTAN`), e.g. `8G`.
    pub fleet_quota: String,
}

/// One host of [`Accounts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    /// Its user's public nkey.
    pub nkey: String,
    /// Its storage shard (`SHARD_<shard>`).
    pub shard: u32,
}

/// How many hosts share a storage shard unless told (`--hosts-per-shard`).
pub const DEFAULT_HOSTS_PER_SHARD: u32 = 100;

/// The most hosts a shard may be given: past a few hundred, one host filling the
/// shard's quota pauses too many others' audit copies.
pub const MAX_HOSTS_PER_SHARD: u32 = 1000;

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
    #[error("--hosts-per-shard {0} is not 1 to {MAX_HOSTS_PER_SHARD}")]
    HostsPerShard(u32),
    #[error("{}:{line}: not `<host> <shard>` (a host once, a shard a number)", path.display())]
    ShardsLine { path: PathBuf, line: usize },
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

/// The fleet's account: the coordinators' user, the fleet's JetStream.
pub const FLEET: &str = "CAPSTAN";

/// The coordinators' second account: their reach into each host (its RPC, its result
/// notices, its storage's API). Apart from [`FLEET`] so that the account every host
/// imports from imports nothing itself: nats-server checks each import for cycles
/// through the exporter's own imports, and with the hosts' imports in the fleet's
/// account that made loading a config quadratic in the hosts (10,000 hosts took
/// 150 s to start, 10 s with the two apart).
pub const REACH: &str = "CAPSTAN_HOSTS";

/// A host's account is named as the host: the fleet's exports then give each host
/// its own subjects by `account_token_position` (a handful of exports, not three a
/// host, whose checks were also quadratic).
fn host_account(host: &str) -> String {
    format!("\"{host}\"")
}

fn shard_account(shard: u32) -> String {
    format!("SHARD_{shard}")
}

/// What host `host`'s agent may use of the fleet's account (`CAPSTAN`): hear its
/// command subject (a stream), ask for its commands (a service answered by the
/// coordinators), beat (a core publish every coordinator hears). `(subject, kind)`.
fn from_fleet(host: &str) -> Vec<(String, Kind)> {
    vec![
        (nats_layout::cmd_subject(host), Kind::Stream),
        (nats_layout::sync_subject(host), Kind::Service),
        (nats_layout::beat_subject(host), Kind::Service),
    ]
}

/// What the fleet's account exports to the hosts: `(subject, kind, position of the
/// host token)`; each host imports its own (see [`from_fleet`]).
const FLEET_EXPORTS: [(&str, Kind, u8); 3] = [
    ("capstan.v1.cmd.*", Kind::Stream, 4),
    ("capstan.v1.sync.*", Kind::Service, 4),
    ("capstan.v1.beat.*", Kind::Service, 4),
];

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

/// What host `host`'s agent may use of its storage shard: publish its records and
/// read its last one, put its results and read its own progress — on its own subjects
/// only, whoever else shares the shard. Direct gets and
/// publishes only: no request that waits in the server's JetStream API queue, which
/// every account shares (a host flooding it — once with its own streams' info — had
/// the coordinators' requests dropped).
fn from_store(host: &str) -> Vec<(String, bool)> {
    let evt = nats_layout::EVT_STREAM;
    let results = format!("KV_{}", nats_layout::RESULTS_BUCKET);
    let bucket = nats_layout::RESULTS_BUCKET;
    vec![
        (nats_layout::evt_subject(host), false),
        (
            format!(
                "$JS.API.DIRECT.GET.{evt}.{}",
                nats_layout::evt_subject(host)
            ),
            true,
        ),
        (format!("$KV.{bucket}.{host}.>"), false),
        (
            format!("$JS.API.DIRECT.GET.{results}.$KV.{bucket}.{host}._progress"),
            true,
        ),
    ]
}

/// A service export of `subject` to account `to`.
fn export(out: &mut String, subject: &str, to: &str, response: Option<&str>) {
    let _ = write!(out, "      {{ service: \"{subject}\", accounts: [{to}]");
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

/// The most a standalone server may store: the fleet's quota and every shard's. The
/// quotas are ceilings, not reservations of disk, but nats-server 2.9 refuses to
/// start JetStream when they add up to more than `max_file_store` (by default 75 % of
/// the free disk), so the config says it; size the disk for what the fleet writes.
fn max_file_store(accounts: &Accounts, shards: usize) -> u64 {
    let size = |s: &str| check_size(s).unwrap_or(0);
    size(&accounts.fleet_quota) + shards as u64 * size(&accounts.shard_quota)
}

/// The nats-server config for `accounts`.
pub fn render(accounts: &Accounts) -> String {
    let mut out = String::new();
    let mut shards: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
    for h in &accounts.hosts {
        shards.entry(h.shard).or_default().push(&h.name);
    }
    let names: Vec<&str> = accounts.hosts.iter().map(|h| h.name.as_str()).collect();
    let _ = writeln!(
        out,
        "# Generated by `capstan-coordinator nats-config` ({} hosts, {} storage shards: {}).\n\
         # Each host's agent is confined to an account of its own; docs/nats.md,\n\
         # \"Security model\", says what each part is for. Regenerate it (the same output\n\
         # directory keeps every key and each host's shard) rather than editing it; restart\n\
         # the server after adding hosts (a reload does not take new accounts in: docs/nats.md).\n\
         # Run: nats-server -c nats-server.conf -js -sd /var/lib/nats",
        names.len(),
        shards.len(),
        match names.len() {
            0..=8 => names.join(", "),
            n => format!("{}, … {}", names[..4].join(", "), names[n - 1]),
        }
    );
    let _ = writeln!(
        out,
        "jetstream {{\n  max_memory_store: 256M\n  max_file_store: {}\n}}\n\naccounts {{",
        max_file_store(accounts, shards.len())
    );
    // The fleet's account: what each host may use of it is exported once, to the
    // account whose name is the subject's host token.
    let _ = writeln!(
        out,
        "  {FLEET} {{\n    jetstream {{ max_file: {}, max_mem: 64M }}\n    users = [ {{ nkey: {} }} ]\n    \
         # each host's command bell, sync requests and heartbeat: its own only (the\n    \
         # subject's host token must be the importing account's name)\n    exports = [",
        accounts.fleet_quota, accounts.coordinator
    );
    for (subject, kind, position) in FLEET_EXPORTS {
        let kind = match kind {
            Kind::Stream => "stream",
            Kind::Service => "service",
        };
        let _ = writeln!(
            out,
            "      {{ {kind}: \"{subject}\", account_token_position: {position} }}"
        );
    }
    out.push_str("    ]\n  }\n");
    // The coordinators' reach into each host: its RPC, its result notices, its
    // storage's JetStream API.
    let _ = writeln!(
        out,
        "\n  {REACH} {{\n    users = [ {{ nkey: {} }} ]\n    imports = [",
        accounts.coordinator_hosts
    );
    for h in &accounts.hosts {
        let host = &h.name;
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
            shard_account(h.shard),
            nats_layout::store_api_prefix(host)
        );
    }
    out.push_str("    ]\n  }\n");
    for h in &accounts.hosts {
        let host = &h.name;
        let _ = writeln!(
            out,
            "\n  # host {host} (storage: {})\n  {} {{\n    users = [ {{ nkey: {} }} ]\n    \
             limits {{ max_connections: {HOST_MAX_CONNECTIONS}, max_subscriptions: {HOST_MAX_SUBSCRIPTIONS} }}\n    \
             imports = [",
            shard_account(h.shard),
            host_account(host),
            h.nkey
        );
        for (subject, kind) in from_fleet(host) {
            import_as(&mut out, kind, FLEET, &subject, false);
        }
        for (subject, api) in from_store(host) {
            import(&mut out, &shard_account(h.shard), &subject, api);
        }
        let _ = writeln!(
            out,
            "    ]\n    exports = [\n      {{ service: \"{}\", accounts: [{REACH}] }}\n      {{ stream: \"capstan.v1.res.{host}.>\", accounts: [{REACH}] }}\n    ]\n  }}",
            nats_layout::rpc_subject(host, "*")
        );
    }
    for (shard, hosts) in &shards {
        let _ = writeln!(
            out,
            "\n  # storage shard {shard}: {}\n  {} {{\n    jetstream {{ max_file: {}, max_mem: 0 }}\n    exports = [",
            hosts.join(", "),
            shard_account(*shard),
            accounts.shard_quota
        );
        for host in hosts {
            for (subject, _) in from_store(host) {
                export(&mut out, &subject, &host_account(host), None);
            }
        }
        export(&mut out, "$JS.API.>", REACH, Some("stream"));
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

/// Names no host may have: `coordinator.nk` and `coordinator-hosts.nk` hold the
/// coordinators' seeds next to the hosts' `<host>.nk` (`capstan install` would hand a
/// host so named that seed).
pub const RESERVED_HOSTS: &[&str] = &["coordinator", "coordinator-hosts"];

/// The credentials directory of an output directory: `<host>.nk`, `coordinator.nk`
/// and `coordinator-hosts.nk`, nkey seeds (mode 0600).
pub fn credentials_dir(out: &Path) -> PathBuf {
    out.join("credentials")
}

/// What `nats-config` is asked for.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub hosts: &'a [String],
    pub hosts_per_shard: u32,
    pub shard_quota: &'a str,
    pub fleet_quota: &'a str,
}

fn write_atomically(out: &Path, name: &str, text: &str) -> Result<(), NatsConfError> {
    let path = out.join(name);
    let tmp = out.join(format!(".{name}.tmp"));
    let write = |source| NatsConfError::Write {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, text).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)
}

/// Writes `<out>/nats-server.conf` for the request's hosts, with the nkeys in
/// [`credentials_dir`] (made where missing, reused where present) and each host's
/// storage shard in [`shards::shards_file`] (kept where present).
pub fn generate(out: &Path, request: &Request) -> Result<Accounts, NatsConfError> {
    let hosts = request.hosts;
    if hosts.is_empty() {
        return Err(NatsConfError::NoHosts);
    }
    if !(1..=MAX_HOSTS_PER_SHARD).contains(&request.hosts_per_shard) {
        return Err(NatsConfError::HostsPerShard(request.hosts_per_shard));
    }
    check_size(request.shard_quota)?;
    if check_size(request.fleet_quota)? < 2 << 30 {
        return Err(NatsConfError::FleetQuota(request.fleet_quota.to_string()));
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
    let shards_path = shards::shards_file(out);
    let kept = match std::fs::read_to_string(&shards_path) {
        Ok(text) => shards::parse(&shards_path, &text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
        Err(source) => {
            return Err(NatsConfError::Read {
                path: shards_path,
                source,
            })
        }
    };
    let assigned = shards::assign(&kept, hosts, request.hosts_per_shard);
    let accounts = Accounts {
        coordinator: user_key(&creds.join("coordinator.nk"))?,
        coordinator_hosts: user_key(&creds.join("coordinator-hosts.nk"))?,
        hosts: hosts
            .iter()
            .zip(assigned)
            .map(|(h, shard)| {
                Ok(Host {
                    name: h.clone(),
                    nkey: user_key(&creds.join(format!("{h}.nk")))?,
                    shard,
                })
            })
            .collect::<Result<_, NatsConfError>>()?,
        shard_quota: request.shard_quota.to_string(),
        fleet_quota: request.fleet_quota.to_string(),
    };
    let listed: Vec<(&str, u32)> = accounts
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h.shard))
        .collect();
    // The shards first: a config naming a shard the file does not would move hosts
    // on the next run.
    write_atomically(out, "shards", &shards::render(&listed))?;
    write_atomically(out, "nats-server.conf", &render(&accounts))?;
    Ok(accounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, nkey: &str, shard: u32) -> Host {
        Host {
            name: name.into(),
            nkey: nkey.into(),
            shard,
        }
    }

    fn three() -> Accounts {
        Accounts {
            coordinator: "UCOORD".into(),
            coordinator_hosts: "UREACH".into(),
            hosts: vec![
                host("h1", "UH1", 0),
                host("web-2", "UH2", 0),
                host("db-3", "UH3", 1),
            ],
            shard_quota: "16G".into(),
            fleet_quota: "8G".into(),
        }
    }

    fn request(hosts: &[String]) -> Request<'_> {
        Request {
            hosts,
            hosts_per_shard: 2,
            shard_quota: "16G",
            fleet_quota: "8G",
        }
    }

    /// The text of one account's block (up to the next account's comment).
    fn block<'a>(text: &'a str, account: &str) -> &'a str {
        let at = text.find(&format!("  {account} {{")).expect(account);
        let rest = &text[at..];
        &rest[..rest.find("\n\n").unwrap_or(rest.len())]
    }

    #[test]
    fn each_host_gets_exactly_its_own_subjects() {
        let text = render(&three());
        // h1's account imports only h1's subjects, from its shard; nothing of
        // web-2's, with which it shares the shard.
        let h1 = block(&text, "\"h1\"");
        assert!(!h1.contains("web-2"), "{h1}");
        for wanted in [
            "{ stream: { account: CAPSTAN, subject: \"capstan.v1.cmd.h1\" } }",
            "{ service: { account: CAPSTAN, subject: \"capstan.v1.sync.h1\" } }",
            "{ service: { account: CAPSTAN, subject: \"capstan.v1.beat.h1\" } }",
            "{ service: { account: SHARD_0, subject: \"capstan.v1.evt.h1\" } }",
            "{ service: { account: SHARD_0, subject: \"$KV.capstan_results.h1.>\" } }",
            "{ service: \"capstan.v1.rpc.h1.*\", accounts: [CAPSTAN_HOSTS] }",
            "nkey: UH1",
        ] {
            assert!(h1.contains(wanted), "{wanted} in {h1}");
        }
        // The fleet's account exports three subjects, each to the account named by
        // the subject's host token, and imports nothing.
        let capstan = block(&text, "CAPSTAN");
        assert!(capstan.contains(
            "    exports = [\n      { stream: \"capstan.v1.cmd.*\", account_token_position: 4 }\n      \
             { service: \"capstan.v1.sync.*\", account_token_position: 4 }\n      \
             { service: \"capstan.v1.beat.*\", account_token_position: 4 }\n    ]\n  }"
        ), "{capstan}");
        assert!(!capstan.contains("imports"), "{capstan}");
        // Each shard exports each of its hosts' subjects to that host alone.
        let shard0 = block(&text, "SHARD_0");
        assert!(shard0.starts_with("  SHARD_0 {\n    jetstream { max_file: 16G, max_mem: 0 }"));
        for line in shard0.lines().filter(|l| l.contains("service:")) {
            if line.contains("\"$JS.API.>\"") {
                assert!(line.contains("accounts: [CAPSTAN_HOSTS], response_type: stream"));
                continue;
            }
            let host = if line.contains(".h1") { "h1" } else { "web-2" };
            assert!(line.contains(&format!("accounts: [\"{host}\"]")), "{line}");
        }
        assert!(!shard0.contains("db-3"), "{shard0}");
        assert!(block(&text, "SHARD_1").contains("capstan.v1.evt.db-3"));
        // The coordinators' second account reaches each host's storage by the host's
        // name, and its RPC; it exports nothing.
        let reach = block(&text, "CAPSTAN_HOSTS");
        for wanted in [
            "users = [ { nkey: UREACH } ]",
            "{ service: { account: SHARD_0, subject: \"$JS.API.>\" }, to: \"capstan.store.web-2.API.>\" }",
            "{ service: { account: SHARD_1, subject: \"$JS.API.>\" }, to: \"capstan.store.db-3.API.>\" }",
            "{ service: { account: \"h1\", subject: \"capstan.v1.rpc.h1.*\" } }",
            "{ stream: { account: \"db-3\", subject: \"capstan.v1.res.db-3.>\" } }",
        ] {
            assert!(reach.contains(wanted), "{wanted} in {reach}");
        }
        assert!(!reach.contains("exports"), "{reach}");
        assert!(
            h1.contains("    limits { max_connections: 4, max_subscriptions: 32 }\n"),
            "{h1}"
        );
        // Nothing of the fleet's JetStream for a host: no consumer, no ack, no API;
        // of its shard's API only direct gets (no request for the API queue).
        for denied in [
            "CONSUMER",
            "$JS.ACK",
            "CAPSTAN_CMD",
            "CAPSTAN_COMMANDS",
            "STREAM.",
        ] {
            assert!(!h1.contains(denied), "{denied} in {h1}");
        }
        // The server may store the fleet's quota and both shards'.
        assert!(text.contains(&format!("  max_file_store: {}\n", 40u64 << 30)));
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
        let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let bad = generate(dir.path(), &request(&hosts(&["Web_1"]))).unwrap_err();
        assert!(matches!(bad, NatsConfError::Host(_)), "{bad}");
        let twice = generate(dir.path(), &request(&hosts(&["a", "a"]))).unwrap_err();
        assert!(matches!(twice, NatsConfError::Duplicate(_)), "{twice}");
        let a = hosts(&["a"]);
        let small = Request {
            fleet_quota: "1G",
            ..request(&a)
        };
        let small = generate(dir.path(), &small).unwrap_err();
        assert!(matches!(small, NatsConfError::FleetQuota(_)), "{small}");
        for per_shard in [0, MAX_HOSTS_PER_SHARD + 1] {
            let wrong = Request {
                hosts_per_shard: per_shard,
                ..request(&a)
            };
            let wrong = generate(dir.path(), &wrong).unwrap_err();
            assert!(matches!(wrong, NatsConfError::HostsPerShard(_)), "{wrong}");
        }
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
        let [coordinator, coordinator_hosts, h1, h2] = nkeys[..] else {
            panic!("four users in the example: {nkeys:?}");
        };
        let accounts = Accounts {
            coordinator: coordinator.into(),
            coordinator_hosts: coordinator_hosts.into(),
            hosts: vec![host("h1", h1, 0), host("h2", h2, 0)],
            shard_quota: "16G".into(),
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
    fn keys_and_shards_are_kept_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let names = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let first = generate(dir.path(), &request(&names(&["h1", "h2", "h3"]))).unwrap();
        let shards = |a: &Accounts| a.hosts.iter().map(|h| h.shard).collect::<Vec<_>>();
        assert_eq!(shards(&first), [0, 0, 1]);
        // h2 removed, h4 and h5 added: h4 takes h2's place, nobody moves.
        let second = generate(dir.path(), &request(&names(&["h1", "h3", "h4", "h5"]))).unwrap();
        assert_eq!(first.coordinator, second.coordinator);
        assert_eq!(first.hosts[0], second.hosts[0]);
        assert_eq!(first.hosts[2], second.hosts[1]);
        assert_eq!(shards(&second), [0, 1, 0, 1]);
        assert_ne!(second.hosts[2].nkey, second.hosts[3].nkey);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(credentials_dir(dir.path()).join("h4.nk"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let conf = std::fs::read_to_string(dir.path().join("nats-server.conf")).unwrap();
        assert_eq!(conf, render(&second));
        // An operator moves h1 to a shard of its own: the next run keeps it there.
        let file = shards::shards_file(dir.path());
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, text.replace("h1 0", "h1 9")).unwrap();
        let third = generate(dir.path(), &request(&names(&["h1", "h3", "h4", "h5"]))).unwrap();
        assert_eq!(shards(&third), [9, 1, 0, 1]);
        std::fs::write(&file, "h1 zero\n").unwrap();
        let junk = generate(dir.path(), &request(&names(&["h1"]))).unwrap_err();
        assert!(
            matches!(junk, NatsConfError::ShardsLine { line: 1, .. }),
            "{junk}"
        );
    }
}

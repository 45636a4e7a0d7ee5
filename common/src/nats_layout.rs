//! The NATS layout of protocol v1: the names of its subjects, streams, buckets and
//! account prefixes, and the heartbeat's timing. Pure names; the JSON that travels
//! there is in `answers`, the connection code in `nats` (feature `nats`). Documented
//! in `docs/nats.md`.

/// The JetStream stream holding every host's commands (limits retention; nothing
/// per host reads it through a consumer: `docs/nats.md`, *Delivery*).
pub const CMD_STREAM: &str = "CAPSTAN_COMMANDS";
/// The work-queue command stream of releases before [`CMD_STREAM`], each host's agent
/// reading it through a durable consumer of its own. A coordinator moves what it
/// still holds into [`CMD_STREAM`] and deletes it (`nats::migrate_commands`).
pub const LEGACY_CMD_STREAM: &str = "CAPSTAN_CMD";
/// The JetStream stream holding every host's log records: the central audit copy.
pub const EVT_STREAM: &str = "CAPSTAN_EVT";
/// The KV bucket of host heartbeats of releases before [`beat_subject`]: no longer
/// made or read (an existing one ages out; `docs/nats.md`, *Upgrading*).
pub const LEGACY_HOSTS_BUCKET: &str = "capstan_hosts";
/// The KV bucket the coordinators share to find a command's host by id.
pub const COMMANDS_BUCKET: &str = "capstan_commands";
/// The KV bucket of command results: what happened to each command, written by its
/// host's agent (key [`result_key`]), read by the coordinators in one get.
pub const RESULTS_BUCKET: &str = "capstan_results";
/// The KV bucket of the hosts' registered public keys (`capstan_host_keys`, key =
/// host): written by the coordinators only, what host signatures are checked against.
pub const HOST_KEYS_BUCKET: &str = "capstan_host_keys";
/// How often an agent beats in a fleet small enough for the fastest pace, and
/// until a coordinator tells it the fleet's pace (`SyncAnswer::beat_secs`).
pub const HEARTBEAT_SECS: u64 = 5;
/// The slowest pace a coordinator may tell an agent (an answer saying more is held
/// to it).
pub const MAX_HEARTBEAT_SECS: u64 = 600;

/// `capstan.v1.beat.<host>`: the host's signed heartbeat, a core NATS message every
/// coordinator hears and keeps in memory (nothing stored). The host is the
/// subject's: on per-host accounts only host `host` can publish here.
pub fn beat_subject(host: &str) -> String {
    format!("capstan.v1.beat.{host}")
}

/// `capstan.v1.cmd.<host>`: the host's commands.
pub fn cmd_subject(host: &str) -> String {
    format!("capstan.v1.cmd.{host}")
}

/// `capstan.v1.evt.<host>`: the host's log records, in seq order.
pub fn evt_subject(host: &str) -> String {
    format!("capstan.v1.evt.{host}")
}

/// `capstan.v1.rpc.<host>.<verb>`: request/reply to the agent.
pub fn rpc_subject(host: &str, verb: &str) -> String {
    format!("capstan.v1.rpc.{host}.{verb}")
}

/// The durable consumer an agent of a release before [`CMD_STREAM`] read its commands
/// through, on [`LEGACY_CMD_STREAM`].
pub fn consumer_name(host: &str) -> String {
    format!("agent-{host}")
}

/// `capstan.v1.sync.<host>`: the host's request for its next commands, answered by
/// the coordinators (a queue group) from [`CMD_STREAM`]. The host is the subject's,
/// never the body's: on per-host accounts only host `host` can publish here.
pub fn sync_subject(host: &str) -> String {
    format!("capstan.v1.sync.{host}")
}

/// `capstan.v1.probe.<host>`: what an agent on per-host accounts sends a request to
/// after each beat, to learn that its connection still carries traffic both ways. It
/// stays in the host's own account, where nothing imports or answers it: the server
/// answers at once that nobody listens (a no-responders status), a round trip like a
/// PING's at the beat's pace instead of every few seconds.
pub fn probe_subject(host: &str) -> String {
    format!("capstan.v1.probe.{host}")
}

/// The queue group the coordinators answer [`sync_subject`] in.
pub const SYNC_QUEUE: &str = "capstan-sync";

/// The key of a command's entry in [`RESULTS_BUCKET`]: `<host>.<hex of the id>`, so
/// that permissions can give each agent `$KV.capstan_results.<host>.>` and nothing else.
pub fn result_key(host: &str, id: &str) -> String {
    format!("{host}.{}", crate::signing::to_hex(id.as_bytes()))
}

/// The subject a put of [`result_key`] is published on (and can be subscribed to).
pub fn result_subject(host: &str, id: &str) -> String {
    format!("$KV.{RESULTS_BUCKET}.{}", result_key(host, id))
}

/// The key of a command's **final** result (`done`): [`result_key`] and `.done`.
/// A result is put here once the command is done, and under [`result_key`] while it
/// is not, so a final result is never overwritten by an unfinished one: whoever holds
/// the host's NATS credentials can put one of its older signed results again, but
/// only under the key it came from, and a reader that finds the final key never
/// looks at the other (`docs/nats.md`, *Replays*).
pub fn final_result_key(host: &str, id: &str) -> String {
    format!("{}.done", result_key(host, id))
}

/// The subject a put of [`final_result_key`] is published on.
pub fn final_result_subject(host: &str, id: &str) -> String {
    format!("$KV.{RESULTS_BUCKET}.{}", final_result_key(host, id))
}

/// `capstan.v1.res.<host>.<hex of the id>`: a notice of each result put, carrying the
/// same bytes and signature, for a coordinator's `wait` to follow (on per-host
/// accounts a put into the host's storage is not seen by a subscription of the
/// coordinator's account; a plain publish of the host's is).
pub fn result_notice_subject(host: &str, id: &str) -> String {
    format!(
        "capstan.v1.res.{host}.{}",
        crate::signing::to_hex(id.as_bytes())
    )
}

/// On per-host accounts (`[nats] host_accounts`), the prefix of the JetStream API an
/// agent uses: its account imports the API subjects it may use from the fleet's
/// account and its storage account under this prefix (its own account has no
/// JetStream, and the server answers `$JS.API` there with "not enabled").
pub const HOST_API_PREFIX: &str = "capstan.js.API";

/// On per-host accounts, the prefix under which the coordinators' account imports
/// the JetStream API of host `host`'s storage account (its event stream and results).
pub fn store_api_prefix(host: &str) -> String {
    format!("capstan.store.{host}.API")
}

/// The inbox prefix an agent uses for its own requests, so that permissions can give
/// each agent its own replies and nobody else's.
pub fn inbox_prefix(host: &str) -> String {
    format!("_INBOX_{host}")
}

/// How far in the future a heartbeat's `at` may be (clock skew) and still count as
/// alive; a beat further ahead is `stale`.
pub const BEAT_SKEW_SECS: u64 = 10;

/// The RPC verbs an agent answers.
pub const RPC_VERBS: &[&str] = &["ping", "status", "intent", "log"];

//! Builders the agent's unit tests share: specs, events (namespace `ns`, workload
//! `web`), intent folded from events, commands, and a rig of the real log, sim driver
//! and executor, with a way to wait on the log instead of sleeping.

use crate::event::{Cause, Event, Record};
use crate::executor::Executor;
use crate::intent::Intent;
use crate::log::{Log, LogOptions};
use capstan_common::{Command, DriverKind, ErrorCode, Op, Phase, Spec};
use capstan_driver::sim::{SimConfig, SimDriver};
use std::sync::Arc;
use std::time::Duration;

/// The host every test command is for.
pub const HOST: &str = "h1";

/// What the test host says about itself in `status` and heartbeats: the sim driver,
/// no capabilities, no alarm.
pub fn host_info() -> crate::transport::HostInfo {
    crate::transport::HostInfo {
        host: HOST.into(),
        version: "test".into(),
        drivers: vec!["sim".into()],
        capabilities: serde_json::json!({}),
        outbox_alarm: Default::default(),
    }
}

/// A sim spec without an image.
pub fn spec() -> Spec {
    spec_for(DriverKind::SIM, None)
}

/// A sim spec running `image` (specs differing only by image are different specs).
pub fn image(image: &str) -> Spec {
    spec_for(DriverKind::SIM, Some(image))
}

/// A spec for `driver`.
pub fn spec_for(driver: DriverKind, image: Option<&str>) -> Spec {
    Spec {
        driver,
        image: image.map(Into::into),
        ..Spec::default()
    }
}

/// Intent folded from `events`, numbered from seq 1.
pub fn given(events: &[Event]) -> Intent {
    let mut intent = Intent::default();
    for (i, e) in events.iter().enumerate() {
        intent.apply(i as u64 + 1, e);
    }
    intent
}

/// Caused by command `id`.
pub fn by(id: &str) -> Cause {
    Cause::Command(id.into())
}

pub fn ns_ready() -> Event {
    Event::NamespaceReady {
        command_id: "c0".into(),
        namespace: "ns".into(),
    }
}

pub fn prepared(rev: &str, spec: Spec) -> Event {
    Event::RevisionPrepared {
        command_id: format!("p-{rev}"),
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        spec,
    }
}

pub fn started(cause: Cause, rev: &str, previous: Option<&str>) -> Event {
    Event::WorkloadStarted {
        cause,
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        previous: previous.map(Into::into),
    }
}

pub fn stopped(cause: Cause, rev: &str) -> Event {
    Event::WorkloadStopped {
        cause,
        namespace: "ns".into(),
        workload: "web".into(),
        revision: Some(rev.into()),
    }
}

pub fn retired(rev: &str) -> Event {
    Event::RevisionRetired {
        command_id: format!("x-{rev}"),
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
    }
}

/// `ns` ready and `web` running `rev` (prepared with `spec`), by command.
pub fn running(rev: &str, spec: Spec) -> Vec<Event> {
    vec![
        ns_ready(),
        prepared(rev, spec),
        started(by(&format!("a-{rev}")), rev, None),
    ]
}

/// Command `id` (`op`, about `web`, naming `rev` or, as a start or stop does, none)
/// received.
pub fn received(id: &str, op: &str, rev: Option<&str>) -> Event {
    Event::CommandReceived {
        command_id: id.into(),
        op: op.into(),
        namespace: "ns".into(),
        workload: Some("web".into()),
        revision: rev.map(Into::into),
        command: String::new(),
    }
}

/// Command `id` completed with `outcome`.
pub fn completed(id: &str, outcome: capstan_common::Outcome) -> Event {
    Event::CommandCompleted {
        command_id: id.into(),
        outcome,
        code: None,
        message: None,
    }
}

/// `owner`'s `phase` call for command `id` began (naming `rev`, as this build does).
pub fn hook_started(id: &str, phase: Phase, owner: &str, rev: Option<&str>) -> Event {
    Event::HookStarted {
        command_id: id.into(),
        phase,
        owner: owner.into(),
        revision: rev.map(Into::into),
    }
}

pub fn hook_succeeded(id: &str, phase: Phase, owner: &str) -> Event {
    Event::HookSucceeded {
        command_id: id.into(),
        phase,
        owner: owner.into(),
    }
}

pub fn hook_failed(id: &str, phase: Phase, owner: &str, code: ErrorCode) -> Event {
    Event::HookFailed {
        command_id: id.into(),
        phase,
        owner: owner.into(),
        code,
    }
}

/// Command `id` activating `rev` with `owners` granting it in turn, every call
/// succeeding; then `rev` running (replacing `previous`), and the command done.
pub fn activated_with(id: &str, rev: &str, previous: Option<&str>, owners: &[&str]) -> Vec<Event> {
    let mut events = vec![received(id, "activate_revision", Some(rev))];
    for o in owners {
        events.push(hook_started(id, Phase::BeforeWorkloadStart, o, Some(rev)));
        events.push(hook_succeeded(id, Phase::BeforeWorkloadStart, o));
    }
    events.push(started(by(id), rev, previous));
    events.push(completed(id, capstan_common::Outcome::Succeeded));
    events
}

pub fn prepare_op(rev: &str, spec: Spec) -> Op {
    Op::PrepareRevision {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
        spec,
    }
}

pub fn activate_op(rev: &str) -> Op {
    Op::ActivateRevision {
        namespace: "ns".into(),
        workload: "web".into(),
        revision: rev.into(),
    }
}

/// Command `id` for [`HOST`].
pub fn command(id: &str, op: Op) -> Command {
    Command {
        v: 1,
        id: id.into(),
        host: HOST.into(),
        issued_at: chrono::Utc::now(),
        deadline: None,
        op,
    }
}

/// Command `id` for [`HOST`] as an input line: `op` with its JSON `fields`.
pub fn line(id: &str, op: &str, fields: &str) -> String {
    format!(
        r#"{{"v":1,"id":"{id}","host":"{HOST}","issued_at":"2026-01-01T00:00:00Z","op":"{op}",{fields}}}"#
    )
}

/// A log and a sim driver in a fresh data dir, and an executor over them.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub sim: Arc<SimDriver>,
    pub executor: Arc<Executor>,
}

impl Rig {
    pub fn new(config: SimConfig) -> Rig {
        Rig::with(config, |e| e)
    }

    /// [`Rig::new`], with the executor finished by `build` (hooks, …).
    pub fn with(config: SimConfig, build: impl FnOnce(Executor) -> Executor) -> Rig {
        Rig::in_dir(
            tempfile::tempdir().unwrap(),
            LogOptions::default(),
            config,
            build,
        )
    }

    /// [`Rig::new`] with these log options (e.g. frequent snapshots, to prune).
    pub fn with_log(options: LogOptions, config: SimConfig) -> Rig {
        Rig::in_dir(tempfile::tempdir().unwrap(), options, config, |e| e)
    }

    fn in_dir(
        dir: tempfile::TempDir,
        options: LogOptions,
        config: SimConfig,
        build: impl FnOnce(Executor) -> Executor,
    ) -> Rig {
        let log = Arc::new(Log::open(&dir.path().join("log"), options).unwrap());
        let sim = Arc::new(SimDriver::open(dir.path(), config).unwrap());
        let executor = Arc::new(build(Executor::new(HOST, log, sim.clone())));
        Rig { dir, sim, executor }
    }

    /// The same data dir opened again (as after a restart): a new log, sim driver and
    /// executor.
    pub fn reopen(self, options: LogOptions, config: SimConfig) -> Rig {
        self.reopen_with(options, config, |e| e)
    }

    /// [`Rig::reopen`], with the new executor finished by `build` (hooks, …).
    pub fn reopen_with(
        self,
        options: LogOptions,
        config: SimConfig,
        build: impl FnOnce(Executor) -> Executor,
    ) -> Rig {
        let Rig { dir, sim, executor } = self;
        drop((sim, executor));
        Rig::in_dir(dir, options, config, build)
    }

    /// Carries `op` out as command `id`, which must succeed.
    pub async fn ok(&self, id: &str, op: Op) {
        let r = self.executor.execute(command(id, op)).await;
        assert_eq!(r.outcome, capstan_common::Outcome::Succeeded, "{id}: {r:?}");
    }

    /// `ns` ready and `web` running `r1`, by commands.
    pub async fn running_r1(&self) {
        let ns = Op::EnsureNamespace {
            namespace: "ns".into(),
        };
        self.ok("ns", ns).await;
        self.ok("p1", prepare_op("r1", spec())).await;
        self.ok("a1", activate_op("r1")).await;
    }

    pub fn records(&self) -> Vec<Record> {
        records(self.executor.log())
    }

    /// The kinds of every record, in order.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.records().iter().map(|r| r.event.kind()).collect()
    }
}

pub fn records(log: &Log) -> Vec<Record> {
    log.read_since(0).map(|r| r.unwrap()).collect()
}

/// Waits (at most 10 s, then fails) until the log's records satisfy `done`,
/// re-checking on every append.
pub async fn wait_for(log: &Log, what: &str, done: impl Fn(&[Record]) -> bool) {
    let mut appended = log.subscribe();
    let wait = async {
        loop {
            appended.borrow_and_update();
            if done(&records(log)) {
                return;
            }
            appended.changed().await.expect("the log is open");
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .is_err()
    {
        let kinds: Vec<_> = records(log).iter().map(|r| r.event.kind()).collect();
        panic!("the log never showed {what}: {kinds:?}");
    }
}

/// The coordinator's OpenAPI description (`coordinator/src/openapi.json`), which
/// describes what the agent answers through it (records, `status`, heartbeats), and
/// a check of a JSON value against one of its schemas.
pub mod openapi {
    use serde_json::Value;

    pub fn description() -> Value {
        serde_json::from_str(include_str!("../../coordinator/src/openapi.json"))
            .expect("the OpenAPI description is JSON")
    }

    /// The schema `components.schemas.<name>`.
    pub fn schema(spec: &Value, name: &str) -> Value {
        let schema = spec["components"]["schemas"][name].clone();
        assert!(schema.is_object(), "no schema {name}");
        schema
    }

    /// Whether `value` is one `schema` allows, as far as these records need: `type`,
    /// `enum`, `pattern` (whole-string hex only), `anyOf`/`oneOf`, and a `$ref` to a
    /// component (an object's keys each one of its properties).
    pub fn allows(spec: &Value, schema: &Value, value: &Value) -> Result<(), String> {
        if let Some(pointer) = schema["$ref"].as_str() {
            let target = spec
                .pointer(pointer.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("no {pointer}"));
            return allows(spec, target, value);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = schema[key].as_array() {
                return if options.iter().any(|o| allows(spec, o, value).is_ok()) {
                    Ok(())
                } else {
                    Err(format!("{value} matches none of {key} {schema}"))
                };
            }
        }
        if let Some(allowed) = schema["enum"].as_array() {
            if !allowed.contains(value) {
                return Err(format!("{value} is not in the enum {allowed:?}"));
            }
        }
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        if !types.is_empty() && !types.contains(&actual) {
            return Err(format!("{value} is {actual}, not {types:?}"));
        }
        if schema["pattern"] == "^[0-9a-f]{64}$" {
            let text = value.as_str().unwrap_or_default();
            if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{value} is not 64 hex digits"));
            }
        }
        if let (Some(object), Some(properties)) =
            (value.as_object(), schema["properties"].as_object())
        {
            for (key, field) in object {
                let Some(property) = properties.get(key) else {
                    return Err(format!("`{key}` is not a property it lists"));
                };
                allows(spec, property, field).map_err(|e| format!("`{key}`: {e}"))?;
            }
            for key in schema["required"].as_array().into_iter().flatten() {
                if !object.contains_key(key.as_str().unwrap()) {
                    return Err(format!("`{key}` is required"));
                }
            }
        }
        Ok(())
    }
}

//! The JSON command lines tests send (`docs/protocol.md`), built as JSON values rather
//! than by hand.

use serde_json::{json, Map, Value};
use std::fmt;

/// The `issued_at` of commands given to `apply` (no `[signing]` there, so any time).
pub const ISSUED_AT: &str = "2026-11-29T10:00:00Z";

/// One command: a JSON object, printed as one line.
#[derive(Debug, Clone, PartialEq)]
pub struct Cmd(Map<String, Value>);

impl Cmd {
    /// `{"v":1,"id":…,"host":…,"issued_at":ISSUED_AT,"op":…}`.
    pub fn new(host: &str, id: &str, op: &str) -> Cmd {
        Cmd(Map::new())
            .with("v", 1)
            .with("id", id)
            .with("host", host)
            .with("issued_at", ISSUED_AT)
            .with("op", op)
    }

    /// Sets field `key` (any JSON value, e.g. an invalid one).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Cmd {
        self.0.insert(key.to_string(), value.into());
        self
    }

    /// Its `id` (empty if it has none).
    pub fn id(&self) -> &str {
        self.0.get("id").and_then(Value::as_str).unwrap_or_default()
    }

    /// Removes field `key`.
    pub fn without(mut self, key: &str) -> Cmd {
        self.0.remove(key);
        self
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Value::Object(self.0.clone()))
    }
}

impl From<Cmd> for String {
    fn from(c: Cmd) -> String {
        c.to_string()
    }
}

/// A revision's spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec(Map<String, Value>);

impl Spec {
    /// `{"driver":"sim"}`.
    pub fn sim() -> Spec {
        Spec(Map::new()).with("driver", "sim")
    }

    /// `{"driver":"docker","image":image}`.
    pub fn docker(image: &str) -> Spec {
        Spec(Map::new())
            .with("driver", "docker")
            .with("image", image)
    }

    /// Sets field `key` (any JSON value, e.g. an invalid one).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Spec {
        self.0.insert(key.to_string(), value.into());
        self
    }

    /// Adds `name=value` to the env.
    pub fn env(mut self, name: &str, value: &str) -> Spec {
        let env = self.0.entry("env").or_insert_with(|| json!({}));
        env.as_object_mut()
            .expect("env is an object")
            .insert(name.to_string(), value.into());
        self
    }

    /// The command (argv).
    pub fn command(self, argv: &[&str]) -> Spec {
        self.with("command", argv)
    }
}

/// The same spec as JSON (e.g. a systemd spec built as `capstan_common::Spec`).
impl From<capstan_common::Spec> for Spec {
    fn from(spec: capstan_common::Spec) -> Spec {
        match serde_json::to_value(spec).expect("a spec is JSON") {
            Value::Object(map) => Spec(map),
            other => panic!("a spec is an object, not {other}"),
        }
    }
}

impl From<Spec> for Value {
    fn from(s: Spec) -> Value {
        Value::Object(s.0)
    }
}

/// Commands for one host and one namespace.
#[derive(Debug, Clone)]
pub struct Commands {
    pub host: String,
    pub ns: String,
}

impl Commands {
    pub fn new(host: &str, ns: &str) -> Commands {
        Commands {
            host: host.to_string(),
            ns: ns.to_string(),
        }
    }

    /// The same commands for another namespace.
    pub fn in_ns(&self, ns: &str) -> Commands {
        Commands::new(&self.host, ns)
    }

    /// `op` on this namespace.
    pub fn ns_op(&self, id: &str, op: &str) -> Cmd {
        Cmd::new(&self.host, id, op).with("namespace", self.ns.as_str())
    }

    /// `op` on `workload` in this namespace.
    pub fn workload_op(&self, id: &str, op: &str, workload: &str) -> Cmd {
        self.ns_op(id, op).with("workload", workload)
    }

    pub fn ensure_namespace(&self, id: &str) -> Cmd {
        self.ns_op(id, "ensure_namespace")
    }

    pub fn delete_namespace(&self, id: &str) -> Cmd {
        self.ns_op(id, "delete_namespace")
    }

    pub fn prepare(&self, id: &str, workload: &str, revision: &str, spec: Spec) -> Cmd {
        self.workload_op(id, "prepare_revision", workload)
            .with("revision", revision)
            .with("spec", spec)
    }

    pub fn activate(&self, id: &str, workload: &str, revision: &str) -> Cmd {
        self.workload_op(id, "activate_revision", workload)
            .with("revision", revision)
    }

    pub fn retire(&self, id: &str, workload: &str, revision: &str) -> Cmd {
        self.workload_op(id, "retire_revision", workload)
            .with("revision", revision)
    }

    pub fn stop(&self, id: &str, workload: &str) -> Cmd {
        self.workload_op(id, "stop_workload", workload)
    }

    pub fn start(&self, id: &str, workload: &str) -> Cmd {
        self.workload_op(id, "start_workload", workload)
    }

    /// The usual start: `ensure_namespace` (id `ns`), then each workload's `revision`
    /// prepared with `spec(revision)` (id `p.<workload>.<revision>`) and activated
    /// (id `a.<workload>.<revision>`).
    pub fn rollout(
        &self,
        workloads: &[&str],
        revision: &str,
        spec: impl Fn(&str) -> Spec,
    ) -> Vec<Cmd> {
        let mut lines = vec![self.ensure_namespace("ns")];
        for w in workloads {
            lines.push(self.prepare(&format!("p.{w}.{revision}"), w, revision, spec(revision)));
            lines.push(self.activate(&format!("a.{w}.{revision}"), w, revision));
        }
        lines
    }
}

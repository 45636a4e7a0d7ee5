//! The protocol's messages and its framing: one JSON object per line, at most
//! [`MAX_LINE`] bytes. `docs/driver-protocol.md` documents every field; this module
//! is that document in types.

use capstan_common::readiness::Check;
use capstan_common::{ErrorCode, Spec};
use capstan_driver::{BackendState, Capabilities, Exit, LaunchEnv, Observed, Probe, RevisionRef};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _};

/// The protocol versions this build speaks, oldest first.
pub const VERSIONS: [u32; 1] = [1];
/// The longest line either side accepts, newline excluded (1 MiB).
pub const MAX_LINE: usize = 1 << 20;

/// A line that is not a protocol message, or a connection that broke.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the connection failed")]
    Io(#[source] std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("a line is longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("a line is not a JSON object")]
    Json(#[source] serde_json::Error),
    #[error("a line is not a protocol message: {0}")]
    Malformed(String),
}

/// The agent's first line: `{"hello":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    /// The versions the agent speaks.
    pub protocol: Vec<u32>,
    /// Who is asking, e.g. `capstan-agent 0.1.0` (for the driver's logs).
    #[serde(default)]
    pub agent: String,
}

/// The driver's answer to the hello: `{"hello":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverHello {
    /// The version chosen, one of those offered.
    pub protocol: u32,
    /// The driver kind it implements (`sim`, `docker`, `systemd`, `kube`).
    pub kind: String,
    /// Who answers, e.g. `capstan-sim-driver 0.1.0` (for the agent's logs).
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub capabilities: WireCapabilities,
}

/// Capabilities as negotiated: a missing one is false (the conservative default), an
/// unknown one is ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WireCapabilities {
    pub manages_lifecycle: bool,
    pub reports_exits: bool,
    pub restarts_exits: bool,
    pub reaps_orphans: bool,
    /// The driver answers `probe` (readiness checks); without it the agent refuses a
    /// spec with `readiness`.
    pub probes: bool,
}

impl From<WireCapabilities> for Capabilities {
    fn from(c: WireCapabilities) -> Capabilities {
        Capabilities {
            manages_lifecycle: c.manages_lifecycle,
            reports_exits: c.reports_exits,
            restarts_exits: c.restarts_exits,
            reaps_orphans: c.reaps_orphans,
            probes: c.probes,
        }
    }
}

impl From<Capabilities> for WireCapabilities {
    fn from(c: Capabilities) -> WireCapabilities {
        WireCapabilities {
            manages_lifecycle: c.manages_lifecycle,
            reports_exits: c.reports_exits,
            restarts_exits: c.restarts_exits,
            reaps_orphans: c.reaps_orphans,
            probes: c.probes,
        }
    }
}

/// A revision's address on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rev {
    pub namespace: String,
    pub workload: String,
    pub revision: String,
}

impl Rev {
    pub fn of(r: RevisionRef<'_>) -> Rev {
        Rev {
            namespace: r.namespace.into(),
            workload: r.workload.into(),
            revision: r.revision.into(),
        }
    }

    pub fn as_rev(&self) -> RevisionRef<'_> {
        RevisionRef {
            namespace: &self.namespace,
            workload: &self.workload,
            revision: &self.revision,
        }
    }
}

/// A request's operation and arguments: the Driver trait, one op per method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    EnsureNamespace {
        namespace: String,
    },
    DeleteNamespace {
        namespace: String,
    },
    Prepare {
        #[serde(flatten)]
        rev: Rev,
        spec: Spec,
    },
    Activate {
        #[serde(flatten)]
        rev: Rev,
        spec: Spec,
        #[serde(default)]
        launch_env: LaunchEnv,
        #[serde(default)]
        previous: Option<String>,
    },
    Start {
        #[serde(flatten)]
        rev: Rev,
        spec: Spec,
        #[serde(default)]
        launch_env: LaunchEnv,
    },
    Resume {
        #[serde(flatten)]
        rev: Rev,
    },
    Stop {
        #[serde(flatten)]
        rev: Rev,
    },
    Retire {
        #[serde(flatten)]
        rev: Rev,
    },
    Observe,
    State {
        #[serde(flatten)]
        rev: Rev,
    },
    /// One readiness probe (only to a driver that announced `probes`).
    Probe {
        #[serde(flatten)]
        rev: Rev,
        check: Check,
        timeout_ms: u64,
    },
    WatchExits,
}

/// The ops this build knows, as spelt on the wire.
pub const OPS: [&str; 12] = [
    "ensure_namespace",
    "delete_namespace",
    "prepare",
    "activate",
    "start",
    "resume",
    "stop",
    "retire",
    "observe",
    "state",
    "probe",
    "watch_exits",
];

/// A request line: `{"id":N,"op":...,<arguments>}`.
pub fn request_line(id: u64, op: &Op) -> String {
    let mut value = serde_json::to_value(op).expect("an op always serialises");
    value
        .as_object_mut()
        .expect("an op is an object")
        .insert("id".into(), id.into());
    value.to_string()
}

/// A request as the driver reads it: its id, and its op or why it cannot be done.
pub fn parse_request(line: &[u8]) -> Result<(u64, Result<Op, ErrorBody>), WireError> {
    let object = object(line)?;
    let id = object
        .get("id")
        .and_then(Value::as_u64)
        .ok_or_else(|| WireError::Malformed("`id` must be an unsigned integer".into()))?;
    let op = match object.get("op").and_then(Value::as_str) {
        None => Err(ErrorBody::new(ErrorCode::UnknownOp, "`op` is missing")),
        Some(op) if !OPS.contains(&op) => Err(ErrorBody::new(
            ErrorCode::UnknownOp,
            format!("unknown op {op:?}"),
        )),
        Some(_) => serde_json::from_value(Value::Object(object))
            .map_err(|e| ErrorBody::new(ErrorCode::InvalidCommand, e.to_string())),
    };
    Ok((id, op))
}

/// A failure as it travels: its stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// An [`ErrorCode`] wire spelling; a code the reader does not know reads as
    /// `driver_failed`.
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code: code.as_str().into(),
            message: message.into(),
        }
    }

    /// The code, `driver_failed` when this build does not know it.
    pub fn error_code(&self) -> ErrorCode {
        serde_json::from_value(Value::String(self.code.clone())).unwrap_or(ErrorCode::DriverFailed)
    }
}

/// An exit as it travels (`{"id":N,"exit":{...}}`, `N` the `watch_exits` request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireExit {
    #[serde(flatten)]
    pub rev: Rev,
    #[serde(default)]
    pub exit_code: Option<i64>,
}

impl From<WireExit> for Exit {
    fn from(e: WireExit) -> Exit {
        Exit {
            namespace: e.rev.namespace,
            workload: e.rev.workload,
            revision: e.rev.revision,
            exit_code: e.exit_code,
        }
    }
}

impl From<&Exit> for WireExit {
    fn from(e: &Exit) -> WireExit {
        WireExit {
            rev: Rev::of(e.rev()),
            exit_code: e.exit_code,
        }
    }
}

/// `observe`'s answer.
/// A `probe`'s answer: `{"ready": true}`, or `{"ready": false, "reason": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireProbe {
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<WireProbe> for Probe {
    fn from(p: WireProbe) -> Probe {
        if p.ready {
            Probe::Ready
        } else {
            Probe::NotReady(
                p.reason
                    .unwrap_or_else(|| "the driver gave no reason".into()),
            )
        }
    }
}

impl From<Probe> for WireProbe {
    fn from(p: Probe) -> WireProbe {
        match p {
            Probe::Ready => WireProbe {
                ready: true,
                reason: None,
            },
            Probe::NotReady(reason) => WireProbe {
                ready: false,
                reason: Some(reason),
            },
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireObserved {
    #[serde(default)]
    pub namespaces: BTreeSet<String>,
    /// `namespace/workload` → revision → state.
    #[serde(default)]
    pub workloads: BTreeMap<String, BTreeMap<String, BackendState>>,
}

impl From<WireObserved> for Observed {
    fn from(o: WireObserved) -> Observed {
        Observed {
            namespaces: o.namespaces,
            workloads: o.workloads,
            changed: Default::default(),
        }
    }
}

impl From<Observed> for WireObserved {
    fn from(o: Observed) -> WireObserved {
        WireObserved {
            namespaces: o.namespaces,
            workloads: o.workloads,
        }
    }
}

/// A line from the driver after the hello.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `{"id":N,"ok":<result>}`: request `N` succeeded (`null` for no result).
    Ok(u64, Value),
    /// `{"id":N,"error":{...}}`: request `N` failed.
    Error(u64, ErrorBody),
    /// `{"id":N,"exit":{...}}`: an exit on the feed that request `N` opened.
    Exit(u64, WireExit),
}

impl Reply {
    pub fn line(&self) -> String {
        let (id, key, value) = match self {
            Reply::Ok(id, v) => (id, "ok", v.clone()),
            Reply::Error(id, e) => (id, "error", serde_json::to_value(e).expect("serialises")),
            Reply::Exit(id, e) => (id, "exit", serde_json::to_value(e).expect("serialises")),
        };
        let mut object = Map::new();
        object.insert("id".into(), (*id).into());
        object.insert(key.into(), value);
        Value::Object(object).to_string()
    }

    pub fn parse(line: &[u8]) -> Result<Reply, WireError> {
        let mut object = object(line)?;
        let id = object
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| WireError::Malformed("`id` must be an unsigned integer".into()))?;
        let field = |e: serde_json::Error| WireError::Malformed(e.to_string());
        if let Some(ok) = object.remove("ok") {
            Ok(Reply::Ok(id, ok))
        } else if let Some(error) = object.remove("error") {
            Ok(Reply::Error(
                id,
                serde_json::from_value(error).map_err(field)?,
            ))
        } else if let Some(exit) = object.remove("exit") {
            Ok(Reply::Exit(
                id,
                serde_json::from_value(exit).map_err(field)?,
            ))
        } else {
            Err(WireError::Malformed(
                "a reply needs `ok`, `error` or `exit`".into(),
            ))
        }
    }
}

/// `{"hello": <hello>}`.
pub fn hello_line(hello: &impl Serialize) -> String {
    serde_json::json!({ "hello": hello }).to_string()
}

/// The hello in `line`, or the error the peer sent instead (`{"error":{...}}`).
pub fn parse_hello<T: serde::de::DeserializeOwned>(
    line: &[u8],
) -> Result<Result<T, ErrorBody>, WireError> {
    let mut object = object(line)?;
    let field = |e: serde_json::Error| WireError::Malformed(format!("hello: {e}"));
    if let Some(hello) = object.remove("hello") {
        Ok(Ok(serde_json::from_value(hello).map_err(field)?))
    } else if let Some(error) = object.remove("error") {
        Ok(Err(serde_json::from_value(error).map_err(field)?))
    } else {
        Err(WireError::Malformed("expected `hello`".into()))
    }
}

fn object(line: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice(line).map_err(WireError::Json)? {
        Value::Object(o) => Ok(o),
        _ => Err(WireError::Malformed("a message is a JSON object".into())),
    }
}

/// Reads one line (without its newline) into `buf`: `Ok(false)` at a clean end of
/// stream. A line over [`MAX_LINE`] is refused without being buffered whole.
pub async fn read_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<bool, WireError> {
    buf.clear();
    loop {
        let chunk = reader.fill_buf().await.map_err(WireError::Io)?;
        if chunk.is_empty() {
            return if buf.is_empty() {
                Ok(false)
            } else {
                Err(WireError::Closed)
            };
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if buf.len() + part.len() > MAX_LINE {
            return Err(WireError::TooLong);
        }
        buf.extend_from_slice(part);
        let used = done.unwrap_or(part.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests;

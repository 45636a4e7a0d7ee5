//! A QMP client on tokio and serde_json: the handful of commands and events the driver
//! needs (`query-status`, `system_powerdown`, `quit`; `SHUTDOWN`), with unknown events
//! and fields read as plain JSON so that any QEMU version works. Not the `qapi` crate:
//! its types are generated from one QEMU version's schema, and it builds slowly
//! (`docs/vm.md`, *Design*).
//!
//! A monitor serves one client at a time (a second one gets no greeting until the
//! first leaves), so every step is bounded by the caller's timeout.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket")]
    Io(#[source] std::io::Error),
    #[error("no answer from QMP within {0:?}")]
    Timeout(Duration),
    #[error("QEMU closed the QMP socket")]
    Closed,
    #[error("QMP sent what is not JSON")]
    Json(#[source] serde_json::Error),
    #[error("QMP refused {command}: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
}

/// A negotiated QMP session.
pub struct Qmp {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
    next_id: u64,
    timeout: Duration,
}

impl Qmp {
    /// Connects to the monitor at `path`, reads its greeting and leaves capability
    /// negotiation; each step within `timeout`.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let stream = tokio::time::timeout(timeout, UnixStream::connect(path))
            .await
            .map_err(|_| QmpError::Timeout(timeout))?
            .map_err(QmpError::Io)?;
        let (read, write) = stream.into_split();
        let mut qmp = Qmp {
            lines: BufReader::new(read).lines(),
            write,
            next_id: 0,
            timeout,
        };
        let greeting = qmp.message().await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Refused {
                command: "greeting".into(),
                class: "Protocol".into(),
                desc: greeting.to_string(),
            });
        }
        qmp.execute("qmp_capabilities").await?;
        Ok(qmp)
    }

    /// The next message (a reply or an event); [`QmpError::Closed`] at EOF.
    async fn message(&mut self) -> Result<Value, QmpError> {
        let line = tokio::time::timeout(self.timeout, self.lines.next_line())
            .await
            .map_err(|_| QmpError::Timeout(self.timeout))?
            .map_err(QmpError::Io)?
            .ok_or(QmpError::Closed)?;
        serde_json::from_str(&line).map_err(QmpError::Json)
    }

    /// Runs `command` (no arguments) and answers its `return`; events read meanwhile
    /// are dropped.
    pub async fn execute(&mut self, command: &str) -> Result<Value, QmpError> {
        self.next_id += 1;
        let id = self.next_id;
        let line = format!("{}\n", json!({ "execute": command, "id": id }));
        self.write
            .write_all(line.as_bytes())
            .await
            .map_err(QmpError::Io)?;
        loop {
            let mut message = self.message().await?;
            if message.get("id") != Some(&json!(id)) {
                continue; // an event
            }
            if let Some(error) = message.get_mut("error") {
                let text = |k: &str| {
                    error
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string()
                };
                return Err(QmpError::Refused {
                    command: command.into(),
                    class: text("class"),
                    desc: text("desc"),
                });
            }
            return Ok(message
                .get_mut("return")
                .map(Value::take)
                .unwrap_or(Value::Null));
        }
    }

    /// Connects to the monitor at `path` and answers the guest's `query-status`
    /// (`running`, `paused`, `shutdown`, …), each step within `timeout`.
    pub async fn status(path: &Path, timeout: Duration) -> Result<String, QmpError> {
        let mut qmp = Qmp::connect(path, timeout).await?;
        let status = qmp.execute("query-status").await?;
        Ok(status["status"].as_str().unwrap_or("unknown").to_string())
    }

    /// Reads events until QEMU closes the monitor (it exits), with no bound: how an
    /// exit watch waits. Answers the `SHUTDOWN` event's `reason`, if one came.
    pub async fn until_closed(mut self) -> Result<Option<String>, QmpError> {
        let mut reason = None;
        loop {
            let line = match self.lines.next_line().await.map_err(QmpError::Io)? {
                Some(line) => line,
                None => return Ok(reason),
            };
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if event.get("event").and_then(Value::as_str) == Some("SHUTDOWN") {
                reason = event["data"]["reason"].as_str().map(str::to_string);
            }
        }
    }
}

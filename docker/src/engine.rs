//! Reads the engine answers that bollard's typed models are too strict for, as raw
//! JSON over the same unix socket: the container list and a container's state.
//!
//! *Why:* engines speaking the Docker API differ in what they put there. Podman (its
//! `podman system service`) reports states the Docker API's enum does not list
//! (`stopping` while a stop is under way, seen with podman 4.3), and bollard's
//! `ContainerSummaryStateEnum` / `ContainerStateStatusEnum` refuse the whole answer
//! ("unknown variant `stopping`"). Here every field is read as a string or left
//! out, and [`backend_state`] maps what was read.

use bollard::ClientVersion;
use capstan_driver::BackendState;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use std::collections::HashMap;

/// A raw read that failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("connecting to the engine's socket")]
    Connect(#[source] std::io::Error),
    #[error("HTTP exchange with the engine")]
    Http(#[source] hyper::Error),
    #[error("bad request to the engine")]
    Request(#[source] hyper::http::Error),
    #[error("the engine answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the engine's answer is not the JSON expected")]
    Json(#[source] serde_json::Error),
    #[error("the engine did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// How long one raw read may take (bollard's requests get the same).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// One container of `GET /containers/json`, only the fields the driver reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Listed {
    #[serde(rename = "Id", default)]
    pub id: String,
    #[serde(rename = "Labels", default)]
    pub labels: Option<HashMap<String, String>>,
}

impl Listed {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }
}

/// `State` of `GET /containers/{id}/json`: both fields may be missing.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct State {
    #[serde(rename = "Status", default)]
    pub status: Option<String>,
    #[serde(rename = "Running", default)]
    pub running: Option<bool>,
}

#[derive(Deserialize)]
struct Inspected {
    #[serde(rename = "State", default)]
    state: Option<State>,
    #[serde(rename = "NetworkSettings", default)]
    network_settings: Option<NetworkSettings>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct NetworkSettings {
    #[serde(rename = "Networks", default)]
    networks: Option<HashMap<String, Endpoint>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Endpoint {
    #[serde(rename = "IPAddress", default)]
    ip_address: Option<String>,
}

impl Inspected {
    fn into_seen(self) -> Seen {
        Seen {
            state: self.state.unwrap_or_default(),
            addresses: (self.network_settings.and_then(|n| n.networks))
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(name, e)| Some((name, e.ip_address?.parse().ok()?)))
                .collect(),
        }
    }
}

/// A container as a readiness probe needs it: its state and its addresses.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub state: State,
    /// Network name → the container's IP address on it (empty ones left out).
    pub addresses: HashMap<String, std::net::IpAddr>,
}

/// What a container's state means to the agent. Known states map as dockerd means
/// them; podman's `stopping` (a stop under way: its processes still run, and
/// podman refuses to start it) is *running*, which is what dockerd reports for the
/// same moment (it shows `running` until the process is gone): the agent then stops
/// it if it must not run, and does not start it again on top of the stop. An unknown
/// state follows the engine's own `Running` flag.
pub fn backend_state(state: &State) -> BackendState {
    let running = match state.status.as_deref() {
        Some("running" | "restarting" | "paused" | "stopping") => true,
        Some(
            "created" | "exited" | "dead" | "removing" | "configured" | "initialized" | "stopped",
        ) => false,
        other => {
            tracing::warn!(
                state = other.unwrap_or("(none)"),
                running = ?state.running,
                "unknown container state: following the engine's Running flag"
            );
            state.running == Some(true)
        }
    };
    if running || state.running == Some(true) {
        BackendState::Running
    } else {
        BackendState::Stopped
    }
}

/// Whether `state` is podman's `stopping`: a start is refused until the stop ends.
pub fn is_stopping(state: &State) -> bool {
    state.status.as_deref() == Some("stopping")
}

/// Raw reads on the engine at `socket` (a path), in the API version negotiated.
#[derive(Debug, Clone)]
pub struct Engine {
    socket: String,
    version: String,
}

impl Engine {
    pub fn new(socket: &str, version: &ClientVersion) -> Engine {
        Engine {
            socket: socket.to_string(),
            version: format!("v{}.{}", version.major_version, version.minor_version),
        }
    }

    /// `GET path` as JSON; `None` when the engine answers 404.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
    ) -> Result<Option<T>, EngineError> {
        tokio::time::timeout(TIMEOUT, self.exchange(path_and_query))
            .await
            .map_err(|_| EngineError::Timeout(TIMEOUT))?
    }

    async fn exchange<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
    ) -> Result<Option<T>, EngineError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(EngineError::Connect)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(EngineError::Http)?;
        // Drives the connection until the answer is read; ends with it.
        tokio::spawn(connection);
        let request = hyper::Request::get(format!("/{}{path_and_query}", self.version))
            .header(hyper::header::HOST, "docker")
            .body(Empty::<Bytes>::new())
            .map_err(EngineError::Request)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(EngineError::Http)?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(EngineError::Http)?
            .to_bytes();
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(EngineError::Json),
            404 => Ok(None),
            _ => Err(EngineError::Status {
                status,
                message: serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(String::from))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned()),
            }),
        }
    }

    /// Every container (stopped ones too) matching `filters`. A 404 is an error
    /// here, never "none": a list read as empty would make `prepare` create again.
    pub async fn containers(
        &self,
        filters: &HashMap<String, Vec<String>>,
    ) -> Result<Vec<Listed>, EngineError> {
        let filters = serde_json::to_string(filters).map_err(EngineError::Json)?;
        let path = format!("/containers/json?all=true&filters={}", percent(&filters));
        self.get(&path).await?.ok_or_else(|| EngineError::Status {
            status: 404,
            message: format!("no container list at {path}"),
        })
    }

    /// The state of container `id`; `None`: it is gone.
    pub async fn state(&self, id: &str) -> Result<Option<State>, EngineError> {
        Ok(self.seen(id).await?.map(|s| s.state))
    }

    /// The state and addresses of container `id`; `None`: it is gone.
    pub async fn seen(&self, id: &str) -> Result<Option<Seen>, EngineError> {
        let found: Option<Inspected> = self
            .get(&format!("/containers/{}/json", percent(id)))
            .await?;
        Ok(found.map(Inspected::into_seen))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(status: Option<&str>, running: Option<bool>) -> BackendState {
        backend_state(&State {
            status: status.map(String::from),
            running,
        })
    }

    #[test]
    fn states_map_as_the_engines_mean_them() {
        for s in ["running", "restarting", "paused"] {
            assert_eq!(state(Some(s), Some(true)), BackendState::Running, "{s}");
        }
        for s in ["created", "exited", "dead", "removing"] {
            assert_eq!(state(Some(s), Some(false)), BackendState::Stopped, "{s}");
        }
        // podman: a stop under way, `Running: false`, processes still there.
        assert_eq!(state(Some("stopping"), Some(false)), BackendState::Running);
        // podman's own words for a container that never ran or has stopped.
        for s in ["configured", "initialized", "stopped"] {
            assert_eq!(state(Some(s), Some(false)), BackendState::Stopped, "{s}");
        }
    }

    #[test]
    fn unknown_or_missing_states_follow_the_running_flag() {
        assert_eq!(state(Some("warping"), Some(true)), BackendState::Running);
        assert_eq!(state(Some("warping"), Some(false)), BackendState::Stopped);
        assert_eq!(state(Some("warping"), None), BackendState::Stopped);
        assert_eq!(state(None, Some(true)), BackendState::Running);
        assert_eq!(state(None, None), BackendState::Stopped);
        // A known "not running" word never hides a container the engine says runs.
        assert_eq!(state(Some("exited"), Some(true)), BackendState::Running);
    }

    #[test]
    fn answers_with_missing_or_unknown_fields_parse() {
        let listed: Vec<Listed> = serde_json::from_str(
            r#"[{"Id":"a","Names":["/x"],"State":"stopping","Labels":{"k":"v"},"Mounts":[{"Type":"weird"}]},
                {"Id":"b"}]"#,
        )
        .unwrap();
        assert_eq!(listed[0].label("k"), Some("v"));
        assert_eq!(listed[1].label("k"), None);
        let i: Inspected = serde_json::from_str(
            r#"{"Id":"a","State":{"Status":"stopping","Running":false,"Health":{"Status":""}}}"#,
        )
        .unwrap();
        assert!(is_stopping(i.state.as_ref().unwrap()));
        let bare: Inspected = serde_json::from_str(r#"{"Id":"a"}"#).unwrap();
        assert!(bare.state.is_none());
    }

    #[test]
    fn addresses_are_read_per_network_and_empty_ones_left_out() {
        let i: Inspected = serde_json::from_str(
            r#"{"NetworkSettings":{"Networks":{"capstan-shop":{"IPAddress":"10.89.0.5","Aliases":null},
                "none":{"IPAddress":""},"odd":{}}}}"#,
        )
        .unwrap();
        let ips = i.into_seen().addresses;
        assert_eq!(ips.len(), 1, "{ips:?}");
        assert_eq!(ips["capstan-shop"].to_string(), "10.89.0.5");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            percent(r#"{"label":["io.capstan.host=h 1"]}"#),
            "%7B%22label%22%3A%5B%22io.capstan.host%3Dh%201%22%5D%7D"
        );
    }
}

//! The coordinator's HTTP API from the caller's side (used by the `capstan` CLI).

use serde_json::Value;
use std::time::Duration;

/// How long [`Client::get`] keeps asking again while the coordinator says `busy`:
/// longer than the longest wait (5 min), so the waits that fill it end meanwhile.
pub const BUSY_PATIENCE: Duration = Duration::from_secs(330);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the coordinator at {base}")]
    Unreachable {
        base: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the coordinator at {base} refused the request: no valid API token (401 unauthorized: {message}); pass --token-file FILE or set CAPSTAN_TOKEN")]
    Unauthorized { base: String, message: String },
    #[error("the coordinator refused the request: the token's role does not allow it (403 forbidden: {message})")]
    Forbidden { message: String },
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// 503 `busy`: as many waits or stream reads as it allows are running.
    #[error("busy: {message} (HTTP 503)")]
    Busy {
        message: String,
        /// Its `Retry-After`.
        retry_after: Duration,
    },
    #[error("the coordinator sent an unreadable answer (HTTP {status})")]
    Decode { status: u16 },
    /// JSON, but not what the request answers ([`Client::get_as`], [`Client::post_as`]).
    #[error("the coordinator's answer is not what the request gives")]
    Answer {
        #[source]
        source: serde_json::Error,
    },
}

impl ClientError {
    /// Whether asking again later may succeed: the coordinator unreachable, or
    /// answering 502/503/504 (its NATS, or a host, not there right now).
    pub fn transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Busy { .. } => true,
            ClientError::Api { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }
}

fn read<T: serde::de::DeserializeOwned>(answer: Value) -> Result<T, ClientError> {
    serde_json::from_value(answer).map_err(|source| ClientError::Answer { source })
}

pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer <token>` when set.
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            token,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `GET path`; asked again after the coordinator's `Retry-After` while it
    /// answers `busy`, for up to [`BUSY_PATIENCE`] (a rollout to more hosts than its
    /// `max_waits` waits its turn).
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        let deadline = tokio::time::Instant::now() + BUSY_PATIENCE;
        loop {
            match self.send(self.request(reqwest::Method::GET, path)).await {
                Err(ClientError::Busy { retry_after, .. })
                    if tokio::time::Instant::now() + retry_after < deadline =>
                {
                    tokio::time::sleep(retry_after).await;
                }
                other => return other,
            }
        }
    }

    /// [`Client::get`], the answer read as the `T` it gives.
    pub async fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, ClientError> {
        read(self.get(path).await?)
    }

    /// [`Client::post`], the answer read as the `T` it gives.
    pub async fn post_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<T, ClientError> {
        read(self.post(path, body).await?)
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.with_body(reqwest::Method::POST, path, body).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.with_body(reqwest::Method::PUT, path, body).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    async fn with_body(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        let request = self
            .request(method, path)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(request).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let response = request
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                base: self.base.clone(),
                source,
            })?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(1), |s| {
                Duration::from_secs(s.clamp(1, 30))
            });
        let bytes = response
            .bytes()
            .await
            .map_err(|_| ClientError::Decode { status })?;
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|_| ClientError::Decode { status })?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let message = value["error"]["message"].as_str().unwrap_or("").to_string();
        let code = value["error"]["code"].as_str().unwrap_or("unknown");
        Err(match (status, code) {
            (401, _) => ClientError::Unauthorized {
                base: self.base.clone(),
                message,
            },
            (403, "forbidden") => ClientError::Forbidden { message },
            (503, "busy") => ClientError::Busy {
                message,
                retry_after,
            },
            _ => ClientError::Api {
                status,
                code: code.to_string(),
                message,
            },
        })
    }
}

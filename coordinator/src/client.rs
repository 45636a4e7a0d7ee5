//! The coordinator's HTTP API from the caller's side (used by the `capstan` CLI).

use serde_json::Value;

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
    #[error("the coordinator sent an unreadable answer (HTTP {status})")]
    Decode { status: u16 },
}

impl ClientError {
    /// Whether asking again later may succeed: the coordinator unreachable, or
    /// answering 502/503/504 (its NATS, or a host, not there right now).
    pub fn transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Api { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }
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

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.send(self.request(reqwest::Method::GET, path)).await
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
        Err(match status {
            401 => ClientError::Unauthorized {
                base: self.base.clone(),
                message,
            },
            403 => ClientError::Forbidden { message },
            _ => ClientError::Api {
                status,
                code: value["error"]["code"]
                    .as_str()
                    .unwrap_or("unknown")
                    .to_string(),
                message,
            },
        })
    }
}

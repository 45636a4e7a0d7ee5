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
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("the coordinator sent an unreadable answer (HTTP {status})")]
    Decode { status: u16 },
}

pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
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
        Err(ClientError::Api {
            status,
            code: value["error"]["code"]
                .as_str()
                .unwrap_or("unknown")
                .to_string(),
            message: value["error"]["message"].as_str().unwrap_or("").to_string(),
        })
    }
}

//! The `nats` runner: the request as the payload of a NATS request on the owner's
//! subject, the reply as the payload of the answer (`{"ok": false}` is a failure).
//! One client per server URL, connected on first use and kept. A dropped call
//! (timeout, cancellation) simply abandons its request.

use super::{CallFailure, HookKind, HookOwner, HookReply, HookRequest, HookRunner};
use std::collections::HashMap;

/// Runs `nats` owners.
#[derive(Default)]
pub struct NatsRunner {
    clients: tokio::sync::Mutex<HashMap<String, async_nats::Client>>,
}

impl NatsRunner {
    async fn client(&self, url: &str) -> Result<async_nats::Client, CallFailure> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(url) {
            return Ok(c.clone());
        }
        let client = async_nats::ConnectOptions::new()
            .request_timeout(None)
            .connect(url)
            .await
            .map_err(|e| {
                tracing::warn!(%url, error = %e, "cannot connect to the NATS server of a hook");
                CallFailure::Spawn
            })?;
        clients.insert(url.to_string(), client.clone());
        Ok(client)
    }
}

#[async_trait::async_trait]
impl HookRunner for NatsRunner {
    async fn call(
        &self,
        owner: &HookOwner,
        request: &HookRequest,
    ) -> Result<HookReply, CallFailure> {
        let HookKind::Nats { url, subject } = &owner.kind else {
            return Err(CallFailure::Spawn);
        };
        let payload = serde_json::to_vec(request).map_err(|_| CallFailure::Spawn)?;
        let client = self.client(url).await?;
        let message = client
            .send_request(
                subject.clone(),
                async_nats::Request::new()
                    .payload(payload.into())
                    .timeout(Some(owner.timeout)),
            )
            .await
            .map_err(|e| match e.kind() {
                async_nats::client::RequestErrorKind::TimedOut => CallFailure::Timeout,
                _ => CallFailure::Spawn,
            })?;
        HookReply::parse(&message.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::Phase;
    use crate::test_nats::server;
    use futures::StreamExt as _;
    use std::time::Duration;

    fn owner(url: &str, subject: &str) -> HookOwner {
        HookOwner {
            name: "bus".into(),
            kind: HookKind::Nats {
                url: url.into(),
                subject: subject.into(),
            },
            timeout: Duration::from_secs(30),
            phases: Phase::ALL.to_vec(),
        }
    }

    fn request(phase: Phase) -> HookRequest {
        HookRequest::sample(phase)
    }

    #[tokio::test]
    async fn a_nats_owner_answers_by_request_reply() {
        let server = server().await;
        let responder = async_nats::connect(&server.url).await.unwrap();
        let mut sub = responder.subscribe("iam.hooks").await.unwrap();
        responder.flush().await.unwrap();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let req: HookRequest = serde_json::from_slice(&msg.payload).unwrap();
                let reply = match req.phase {
                    Phase::BeforeWorkloadStart => r#"{"env":{"IAM_ROLE":"opaque-role.1"}}"#,
                    _ => r#"{"ok":false}"#,
                };
                if let Some(to) = msg.reply {
                    responder.publish(to, reply.into()).await.unwrap();
                }
            }
        });
        let runner = NatsRunner::default();
        let o = owner(&server.url, "iam.hooks");
        let reply = runner
            .call(&o, &request(Phase::BeforeWorkloadStart))
            .await
            .unwrap();
        assert_eq!(reply.env["IAM_ROLE"], "opaque-role.1");
        assert_eq!(
            runner.call(&o, &request(Phase::BeforeWorkloadStop)).await,
            Err(CallFailure::Exit)
        );
        // Nobody listening: a failure, at once.
        let nobody = owner(&server.url, "nobody.home");
        assert_eq!(
            runner
                .call(&nobody, &request(Phase::BeforeWorkloadStop))
                .await,
            Err(CallFailure::Spawn)
        );
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_failure() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let o = owner(&format!("nats://127.0.0.1:{port}"), "iam.hooks");
        assert_eq!(
            NatsRunner::default()
                .call(&o, &request(Phase::BeforeWorkloadStart))
                .await,
            Err(CallFailure::Spawn)
        );
    }
}

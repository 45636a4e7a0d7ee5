//! The `nats` runner: the request as the payload of a NATS request on the owner's
//! subject, the reply as the payload of the answer (`{"ok": false}` is a failure).
//! One client per owner (each has its own credentials), connected on first use with
//! the owner's `[hooks.nats]` settings (the transport's own `NatsConfig` code) and
//! kept. A dropped call (timeout, cancellation) simply abandons its request.

use super::{CallFailure, HookKind, HookOwner, HookReply, HookRequest, HookRunner};
use capstan_common::nats::NatsConfig;
use std::collections::HashMap;

/// Runs `nats` owners.
#[derive(Default)]
pub struct NatsRunner {
    /// By owner name.
    clients: tokio::sync::Mutex<HashMap<String, async_nats::Client>>,
}

impl NatsRunner {
    async fn client(
        &self,
        owner: &str,
        nats: &NatsConfig,
    ) -> Result<async_nats::Client, CallFailure> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(owner) {
            return Ok(c.clone());
        }
        let failed = |e: &dyn std::fmt::Display| {
            tracing::warn!(%owner, url = %nats.url, error = %e, "cannot connect to the NATS server of a hook");
            CallFailure::Spawn
        };
        // No retry on the first connect: an unreachable server fails the call at once.
        let options = async_nats::ConnectOptions::new().request_timeout(None);
        let servers = nats.servers().map_err(|e| failed(&e))?;
        let client = nats
            .authenticate(options)
            .await
            .map_err(|e| failed(&e))?
            .connect(servers)
            .await
            .map_err(|e| failed(&e))?;
        clients.insert(owner.to_string(), client.clone());
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
        let HookKind::Nats { nats, subject } = &owner.kind else {
            return Err(CallFailure::Spawn);
        };
        let payload = serde_json::to_vec(request).map_err(|_| CallFailure::Spawn)?;
        let client = self.client(&owner.name, nats).await?;
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
    use capstan_testsupport::NatsServer;
    use futures::StreamExt as _;
    use std::time::Duration;

    fn owner(url: &str, subject: &str) -> HookOwner {
        with(
            NatsConfig {
                url: url.into(),
                ..NatsConfig::default()
            },
            subject,
        )
    }

    fn with(nats: NatsConfig, subject: &str) -> HookOwner {
        HookOwner {
            name: "bus".into(),
            kind: HookKind::Nats {
                nats: Box::new(nats),
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
        let server = NatsServer::start(&[]);
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

    #[tokio::test]
    async fn a_nats_owner_connects_with_the_credentials_of_its_config() {
        let server = NatsServer::start(&["--user", "capstan", "--pass", "s3cret"]);
        let responder = async_nats::ConnectOptions::new()
            .user_and_password("capstan".into(), "s3cret".into())
            .connect(&server.url)
            .await
            .unwrap();
        let mut sub = responder.subscribe("iam.hooks").await.unwrap();
        responder.flush().await.unwrap();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                if let Some(to) = msg.reply {
                    let reply = r#"{"env":{"IAM_ROLE":"opaque-role.2"}}"#;
                    responder.publish(to, reply.into()).await.unwrap();
                }
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, "s3cret\n").unwrap();
        let config = |user: Option<&str>, password_file: Option<std::path::PathBuf>| NatsConfig {
            url: server.url.clone(),
            user: user.map(Into::into),
            password_file,
            ..NatsConfig::default()
        };
        let start = request(Phase::BeforeWorkloadStart);
        let good = with(config(Some("capstan"), Some(password_file)), "iam.hooks");
        let reply = NatsRunner::default().call(&good, &start).await.unwrap();
        assert_eq!(reply.env["IAM_ROLE"], "opaque-role.2");
        let wrong = dir.path().join("wrong");
        std::fs::write(&wrong, "guess").unwrap();
        for config in [config(None, None), config(Some("capstan"), Some(wrong))] {
            let o = with(config, "iam.hooks");
            assert_eq!(
                NatsRunner::default().call(&o, &start).await,
                Err(CallFailure::Spawn),
                "refused by the server"
            );
        }
    }
}

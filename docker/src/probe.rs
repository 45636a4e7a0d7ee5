//! Readiness probes of a revision's container: `exec` runs the check inside it (the
//! Engine API's exec), `tcp` and `http` reach it at its address on its namespace's
//! network, from the agent.

use super::{backend, DockerDriver};
use bollard::exec::StartExecResults;
use bollard::models::ExecConfig;
use capstan_common::Check;
use capstan_driver::{probe, DriverError, Probe, RevisionRef};
use futures::StreamExt;
use std::time::Duration;

impl DockerDriver {
    /// One probe of `rev`'s container: not ready while it does not run.
    pub(super) async fn probe_container(
        &self,
        rev: RevisionRef<'_>,
        check: &Check,
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let op = "probe";
        let missing = || DriverError::Missing {
            op,
            target: rev.to_string(),
        };
        let container = self.find(op, rev).await?.ok_or_else(missing)?;
        let seen = (self.engine.seen(&container.id).await)
            .map_err(backend(op, rev))?
            .ok_or_else(missing)?;
        if !crate::engine::backend_state(&seen.state).is_running() {
            let status = seen.state.status.as_deref().unwrap_or("not running");
            return Ok(Probe::NotReady(format!("the container is {status}")));
        }
        if let Check::Exec { command } = check {
            return self.exec(rev, &container.id, command, timeout).await;
        }
        let network = crate::naming::network_name(rev.namespace);
        let Some(ip) = seen.addresses.get(&network) else {
            return Ok(Probe::NotReady(format!(
                "the container has no address on network {network}"
            )));
        };
        Ok(probe::network(*ip, check, timeout)
            .await
            .expect("tcp and http are network checks"))
    }

    /// Runs `command` in container `id` and waits for it, within `timeout`: exit 0
    /// passes. A check still running then is left to end by itself (the Engine API
    /// cannot kill an exec) and counts as failed.
    async fn exec(
        &self,
        rev: RevisionRef<'_>,
        id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<Probe, DriverError> {
        let op = "probe";
        let config = ExecConfig {
            cmd: Some(command.to_vec()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..ExecConfig::default()
        };
        let run = async {
            let exec = self.docker.create_exec(id, config).await?;
            // Attached: the output ends when the command does. It is read and dropped
            // (a check's words are the workload's, never the agent's log's).
            if let StartExecResults::Attached { mut output, .. } =
                self.docker.start_exec(&exec.id, None).await?
            {
                while let Some(chunk) = output.next().await {
                    chunk?;
                }
            }
            self.docker.inspect_exec(&exec.id).await
        };
        match tokio::time::timeout(timeout, run).await {
            Err(_) => Ok(Probe::NotReady(format!(
                "{} did not finish in {} ms",
                command[0],
                timeout.as_millis()
            ))),
            // 409: the container stopped since it was read.
            Ok(Err(e)) if crate::status(&e) == Some(409) => {
                Ok(Probe::NotReady("the container stopped".into()))
            }
            Ok(Err(e)) => Err(backend(op, rev)(e)),
            Ok(Ok(done)) => Ok(match done.exit_code {
                Some(0) => Probe::Ready,
                Some(code) => Probe::NotReady(format!("{} exited {code}", command[0])),
                None => Probe::NotReady(format!("{} did not report an exit", command[0])),
            }),
        }
    }
}

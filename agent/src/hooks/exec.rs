//! The `exec` runner: one process per call, in its own process group, with a minimal
//! environment. The request is JSON on stdin; the reply is JSON on stdout (empty means
//! `{}`); exit 0 is success, anything else failure. stderr is discarded so nothing a
//! hook prints can reach the agent's logs. When the call is dropped (timeout,
//! cancellation) the whole process group is killed.

use super::{CallFailure, HookKind, HookOwner, HookReply, HookRequest, HookRunner};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::process::Stdio;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `PATH` for hook processes (their environment is otherwise empty).
const HOOK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs `exec` owners.
#[derive(Default)]
pub struct ExecRunner;

/// Kills a process group when dropped, unless disarmed after the leader was reaped.
struct GroupKill(Option<Pid>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // The group may already be gone; nothing else to do either way.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

#[async_trait::async_trait]
impl HookRunner for ExecRunner {
    async fn call(
        &self,
        owner: &HookOwner,
        request: &HookRequest,
    ) -> Result<HookReply, CallFailure> {
        let HookKind::Exec { argv } = &owner.kind else {
            return Err(CallFailure::Spawn);
        };
        let input = serde_json::to_vec(request).map_err(|_| CallFailure::Spawn)?;
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", HOOK_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|_| CallFailure::Spawn)?;
        let mut group = GroupKill(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(Pid::from_raw),
        );
        let mut stdin = child.stdin.take().ok_or(CallFailure::Spawn)?;
        let mut stdout = child.stdout.take().ok_or(CallFailure::Spawn)?;
        let write = async move {
            // A hook that does not read its request is allowed to: ignore EPIPE.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        let mut out = Vec::new();
        let read = async {
            (&mut stdout)
                .take(super::MAX_REPLY_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .await
        };
        let ((), read) = tokio::join!(write, read);
        if out.len() > super::MAX_REPLY_BYTES {
            // Longer than a reply may be: refused, the rest unread. The hook would
            // block writing it (and the call wait for its exit until its timeout), so
            // its whole group is killed, and the leader reaped.
            drop(group);
            let _ = child.wait().await;
            return Err(CallFailure::Reply);
        }
        let status = child.wait().await.map_err(|_| CallFailure::Exit)?;
        // Reaped: its pid may be reused from here on, so never signal it again.
        group.0 = None;
        if !status.success() {
            return Err(CallFailure::Exit);
        }
        if read.is_err() {
            return Err(CallFailure::Reply);
        }
        HookReply::parse(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::Phase;
    use std::time::Duration;

    fn owner(script: &str) -> HookOwner {
        HookOwner {
            name: "t".into(),
            kind: HookKind::Exec {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            },
            timeout: Duration::from_secs(10),
            phases: vec![Phase::BeforeWorkloadStart],
        }
    }

    fn request() -> HookRequest {
        HookRequest::sample(Phase::BeforeWorkloadStart)
    }

    #[tokio::test]
    async fn the_reply_is_read_from_stdout_and_the_request_from_stdin() {
        let o = owner(
            r#"grep -q '"phase":"before_workload_start"' && echo '{"env":{"A":"opaque-1"}}'"#,
        );
        let reply = ExecRunner.call(&o, &request()).await.unwrap();
        assert_eq!(reply.env["A"], "opaque-1");
    }

    #[tokio::test]
    async fn empty_output_is_an_empty_reply_and_exit_codes_matter() {
        assert_eq!(
            ExecRunner.call(&owner("cat >/dev/null"), &request()).await,
            Ok(HookReply::default())
        );
        assert_eq!(
            ExecRunner
                .call(&owner("echo '{}'; exit 3"), &request())
                .await,
            Err(CallFailure::Exit)
        );
        assert_eq!(
            ExecRunner.call(&owner("echo not-json"), &request()).await,
            Err(CallFailure::Reply)
        );
        assert_eq!(
            ExecRunner
                .call(&owner(r#"echo '{"ok":false}'"#), &request())
                .await,
            Err(CallFailure::Exit)
        );
    }

    #[tokio::test]
    async fn dropping_a_call_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The hook forks a grandchild that would outlive a plain kill of the leader.
        let script = format!("sleep 3600 & echo $! > {}; wait", pidfile.display());
        let o = owner(&script);
        let req = request();
        let mut call = Box::pin(ExecRunner.call(&o, &req));
        // Poll until the grandchild has written its pid, then drop the call.
        let pid = loop {
            tokio::select! {
                r = &mut call => panic!("hook ended early: {r:?}"),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if let Ok(text) = std::fs::read_to_string(&pidfile) {
                if let Ok(pid) = text.trim().parse::<i32>() {
                    break pid;
                }
            }
        };
        drop(call);
        // The grandchild is gone (or a zombie awaiting its reaper) once SIGKILL lands;
        // without the group kill it would sleep on for an hour.
        for attempt in 0.. {
            assert!(attempt < 1500, "the hook's grandchild survived the drop");
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            if matches!(state, None | Some("Z") | Some("X")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes, in `dir`, a reply of exactly `len` bytes (a valid one: `{"env":{"A":
    /// "xx…"}}`) and a hook script that reads its request and answers with it.
    fn replying(dir: &std::path::Path, len: usize) -> HookOwner {
        let frame = r#"{"env":{"A":""}}"#.len();
        let reply = format!(r#"{{"env":{{"A":"{}"}}}}"#, "x".repeat(len - frame));
        assert_eq!(reply.len(), len);
        let (reply_file, script) = (dir.join("reply.json"), dir.join("hook.sh"));
        std::fs::write(&reply_file, reply).unwrap();
        let text = format!("cat >/dev/null\ncat '{}'\n", reply_file.display());
        std::fs::write(&script, text).unwrap();
        HookOwner {
            kind: HookKind::Exec {
                argv: vec!["/bin/sh".into(), script.display().to_string()],
            },
            ..owner("")
        }
    }

    #[tokio::test]
    async fn a_reply_of_exactly_the_limit_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let o = replying(dir.path(), 64 * 1024);
        let reply = ExecRunner.call(&o, &request()).await.unwrap();
        assert_eq!(
            reply.env["A"].len(),
            64 * 1024 - r#"{"env":{"A":""}}"#.len()
        );
    }

    #[tokio::test]
    async fn a_reply_one_byte_over_the_limit_is_an_invalid_reply() {
        let dir = tempfile::tempdir().unwrap();
        let o = replying(dir.path(), 64 * 1024 + 1);
        assert_eq!(
            ExecRunner.call(&o, &request()).await,
            Err(CallFailure::Reply)
        );
    }

    #[tokio::test]
    async fn a_reply_over_the_limit_fails_the_call_hook_invalid_reply_and_is_compensated() {
        use crate::testkit;
        use capstan_common::{ErrorCode, Op};
        let dir = tempfile::tempdir().unwrap();
        let mut o = replying(dir.path(), 64 * 1024 + 1);
        // Only `before_workload_start` gets the over-long reply; every call is noted.
        let calls = dir.path().join("calls");
        let script = format!(
            r#"req=$(cat); echo "$req" >> '{}'; case "$req" in *'"phase":"before_workload_start"'*) cat '{}';; esac"#,
            calls.display(),
            dir.path().join("reply.json").display()
        );
        o.kind = HookKind::Exec {
            argv: vec!["/bin/sh".into(), "-c".into(), script],
        };
        o.phases = Phase::ALL.to_vec();
        let hooks = super::super::Hooks::new(
            vec![o],
            std::sync::Arc::new(super::super::Runners::default()),
        );
        let rig = testkit::Rig::with(Default::default(), |e| e.with_hooks(hooks));
        let ns = Op::EnsureNamespace {
            namespace: "ns".into(),
        };
        rig.ok("ns", ns).await;
        rig.ok("p1", testkit::prepare_op("r1", testkit::spec()))
            .await;
        let r = rig
            .executor
            .execute(testkit::command("a1", testkit::activate_op("r1")))
            .await;
        assert_eq!(r.error.map(|e| e.code), Some(ErrorCode::HookFailed));
        let records = rig.executor.log().for_command("a1").unwrap();
        let failed: Vec<_> = records
            .iter()
            .filter_map(|r| match &r.event {
                crate::event::Event::HookFailed { phase, code, .. } => Some((*phase, *code)),
                _ => None,
            })
            .collect();
        assert_eq!(
            failed,
            [(Phase::BeforeWorkloadStart, ErrorCode::HookInvalidReply)]
        );
        // It said it succeeded, with more than a reply may hold: it may have granted,
        // so it is called to undo it.
        let calls = std::fs::read_to_string(&calls).unwrap();
        let last = calls.lines().last().unwrap();
        assert!(
            last.contains(r#""phase":"before_workload_stop""#)
                && last.contains(r#""compensating":true"#),
            "{calls}"
        );
    }

    #[tokio::test]
    async fn a_hook_writing_megabytes_is_cut_off_at_the_limit_and_killed() {
        let dir = tempfile::tempdir().unwrap();
        let (fifo, finished) = (dir.path().join("fifo"), dir.path().join("finished"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Every process of the hook holds the fifo open for writing: it reads EOF once
        // all of them are gone.
        let (gone_tx, gone) = std::sync::mpsc::channel();
        let reader = fifo.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::open(reader).unwrap();
            let _ = gone_tx.send(std::io::Read::read_to_end(&mut f, &mut Vec::new()));
        });
        // 8 MiB on stdout, a child that sleeps, and a mark if it ever got to the end.
        let script = format!(
            "exec 3>'{}'; sleep 3600 & head -c 8388608 /dev/zero; echo done > '{}'",
            fifo.display(),
            finished.display()
        );
        let o = owner(&script);
        let bound = Duration::from_secs(60);
        let call = tokio::time::timeout(bound, ExecRunner.call(&o, &request())).await;
        assert_eq!(
            call.expect("the call hung on the hook's output"),
            Err(CallFailure::Reply)
        );
        gone.recv_timeout(bound)
            .expect("the hook's processes were left running")
            .unwrap();
        assert!(
            !finished.exists(),
            "the hook wrote all its output: it was read to the end"
        );
    }
}

//! Hook conformance #11 on the docker driver: the placeholder an exec hook contributes
//! reaches the container's environment (and never the log), and survives the
//! agent's graceful stop and restart, which run no hooks.

use capstan_tests::docker::{docker_host, DockerAgent};
use std::os::unix::fs::PermissionsExt;

#[test]
fn the_placeholder_reaches_the_container_env_and_survives_an_agent_restart() {
    let a = DockerAgent::new("hookenv");
    let dir = a.agent.data_dir().to_path_buf();
    let hook = dir.join("iam-hook.sh");
    std::fs::write(
        &hook,
        "#!/bin/sh\nreq=$(cat)\ncase \"$req\" in *'\"phase\":\"before_workload_start\"'*) echo '{\"env\":{\"DB_TOKEN\":\"opaque-db.tok:42\"}}';; esac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("agent.toml"),
        format!(
            "driver = \"docker\"\n[docker]\nsocket = \"{}\"\npull_policy = \"never\"\nstop_timeout_secs = 10\n\
             [[hooks]]\nname = \"iam\"\nkind = \"exec\"\nargv = [{:?}]\nphases = [\"before_workload_start\", \"before_workload_stop\"]\n",
            docker_host(),
            hook.display().to_string()
        ),
    )
    .unwrap();

    a.apply_ok(
        "rollout.jsonl",
        &[
            a.ensure_ns("ns"),
            a.prepare("p1", "web", "r1"),
            a.activate("a1", "web", "r1"),
        ],
    );
    let before = a.container("web", "r1");
    assert!(before.running);
    assert!(
        before
            .env
            .contains(&"DB_TOKEN=opaque-db.tok:42".to_string()),
        "{:?}",
        before.env
    );
    assert!(
        before.env.contains(&"REV=r1".to_string()),
        "spec env kept: {:?}",
        before.env
    );

    // No value in the log.
    let log = std::process::Command::new(capstan_tests::binary("capstan-agent"))
        .arg("--config")
        .arg(dir.join("agent.toml"))
        .arg("--data-dir")
        .arg(&dir)
        .arg("--host")
        .arg(a.host())
        .args(["log", "--json"])
        .output()
        .unwrap();
    assert!(log.status.success());
    assert!(
        !String::from_utf8_lossy(&log.stdout).contains("opaque-db"),
        "a placeholder reached the log"
    );

    // Graceful stop (the sweep stops it), then startup resumes the same container.
    a.run(&[]).terminate();
    assert!(!a.container("web", "r1").running);
    let daemon = a.run(&[]);
    let after = a.container("web", "r1");
    assert!(after.running, "started again on startup");
    assert_eq!(after.id, before.id, "resumed, not recreated");
    assert!(
        after.env.contains(&"DB_TOKEN=opaque-db.tok:42".to_string()),
        "{:?}",
        after.env
    );
    daemon.terminate();
}

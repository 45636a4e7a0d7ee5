//! Bad input never reaches the engine: a bad image reference, env names with `=`,
//! values with NUL, bad mounts and ports are rejected with a stable code, and nothing
//! is created. A well-formed image that is not on the host (pull_policy never) fails
//! with `image_not_found`, also creating nothing.

use capstan_tests::docker::{DockerAgent, IMAGE};

#[test]
fn bad_specs_are_rejected_with_a_code_and_create_nothing() {
    let a = DockerAgent::new("bad");
    a.apply_ok("setup.jsonl", &[a.ensure_ns("ns")]);
    let prep = |id: &str, spec: &str| {
        a.op(
            id,
            "prepare_revision",
            "web",
            &format!(r#""revision":"r1","spec":{spec}"#),
        )
    };
    let cases = [
        (
            prep("b1", r#"{"driver":"docker","image":"Not An Image"}"#),
            "rejected",
            "invalid_spec",
        ),
        (
            prep("b2", r#"{"driver":"docker","image":"ok/app:-1"}"#),
            "rejected",
            "invalid_spec",
        ),
        (
            prep(
                "b3",
                &format!(r#"{{"driver":"docker","image":"{IMAGE}","env":{{"A=B":"x"}}}}"#),
            ),
            "rejected",
            "invalid_env",
        ),
        (
            prep(
                "b4",
                &format!(r#"{{"driver":"docker","image":"{IMAGE}","env":{{"A":"x\u0000y"}}}}"#),
            ),
            "rejected",
            "invalid_env",
        ),
        (
            prep(
                "b5",
                &format!(
                    r#"{{"driver":"docker","image":"{IMAGE}","mounts":[{{"source":"/tmp","target":"rel"}}]}}"#
                ),
            ),
            "rejected",
            "invalid_spec",
        ),
        (
            prep(
                "b6",
                &format!(
                    r#"{{"driver":"docker","image":"{IMAGE}","ports":[{{"container_port":80,"host_ip":"not-an-ip"}}]}}"#
                ),
            ),
            "rejected",
            "invalid_spec",
        ),
        (
            prep(
                "b7",
                &format!(r#"{{"driver":"docker","image":"{IMAGE}","working_dir":"/a/../b"}}"#),
            ),
            "rejected",
            "invalid_spec",
        ),
        (
            prep(
                "b8",
                r#"{"driver":"docker","image":"capstan-test/absent:1"}"#,
            ),
            "failed",
            "image_not_found",
        ),
    ];
    let lines: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
    let (status, results) = a.apply("bad.jsonl", &lines);
    assert!(!status.success());
    assert_eq!(results.len(), cases.len(), "{results:?}");
    for (r, (line, outcome, code)) in results.iter().zip(&cases) {
        assert_eq!(r["outcome"], *outcome, "{line} -> {r}");
        assert_eq!(r["error"]["code"], *code, "{line} -> {r}");
    }
    assert!(a.containers().is_empty(), "{:?}", a.containers());
    assert!(a.agent.intent()["workloads"]
        .as_object()
        .unwrap()
        .is_empty());
}

#[test]
fn spec_fields_reach_the_container_as_given() {
    let a = DockerAgent::new("fields");
    let spec = format!(
        r#"{{"driver":"docker","image":"{IMAGE}","command":["sleep","300"],"env":{{"GREETING":"hello world","EMPTY":""}},"working_dir":"/tmp","mounts":[{{"source":"/etc","target":"/host-etc","read_only":true}}],"ports":[{{"container_port":8080,"host_ip":"127.0.0.1"}}]}}"#
    );
    a.apply_ok(
        "setup.jsonl",
        &[
            a.ensure_ns("ns"),
            a.op(
                "p",
                "prepare_revision",
                "web",
                &format!(r#""revision":"r1","spec":{spec}"#),
            ),
        ],
    );
    let c = a.container("web", "r1");
    assert!(!c.running, "prepare creates without starting");
    let inspect: serde_json::Value =
        serde_json::from_str(&capstan_tests::docker::docker(&["inspect", &c.id])).unwrap();
    let i = &inspect[0];
    assert_eq!(i["Config"]["Cmd"], serde_json::json!(["sleep", "300"]));
    assert_eq!(i["Config"]["WorkingDir"], "/tmp");
    assert!(
        c.env.contains(&"GREETING=hello world".to_string()),
        "{:?}",
        c.env
    );
    assert!(c.env.contains(&"EMPTY=".to_string()), "{:?}", c.env);
    assert_eq!(i["HostConfig"]["RestartPolicy"]["Name"], "no");
    assert_eq!(i["HostConfig"]["Mounts"][0]["Target"], "/host-etc");
    assert_eq!(i["HostConfig"]["Mounts"][0]["ReadOnly"], true);
    assert_eq!(
        i["HostConfig"]["PortBindings"]["8080/tcp"][0]["HostIp"],
        "127.0.0.1"
    );
    assert_eq!(i["Config"]["Labels"]["io.capstan.managed"], "true");
    assert_eq!(i["Config"]["Labels"]["io.capstan.namespace"], a.ns.as_str());
    assert_eq!(i["HostConfig"]["NetworkMode"], format!("capstan-{}", a.ns));
}

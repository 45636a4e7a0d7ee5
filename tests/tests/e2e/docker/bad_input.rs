//! Bad input never reaches the engine: a bad image reference, env names with `=`,
//! values with NUL, bad mounts and ports are rejected with a stable code, and nothing
//! is created. A well-formed image that is not on the host (pull_policy never) fails
//! with `image_not_found`, also creating nothing.

use capstan_tests::command::Spec;
use capstan_tests::docker::{agent, Engine, IMAGE};
use serde_json::json;

capstan_tests::each_engine!(
    bad_specs_are_rejected_with_a_code_and_create_nothing,
    spec_fields_reach_the_container_as_given
);

fn bad_specs_are_rejected_with_a_code_and_create_nothing(engine: Engine) {
    let a = agent(engine, "bad").build();
    let c = a.commands(&a.host);
    a.apply_ok(&[c.ensure_namespace("ns")]);
    let image = || Spec::docker(IMAGE);
    let cases = [
        (Spec::docker("Not An Image"), "rejected", "invalid_spec"),
        (Spec::docker("ok/app:-1"), "rejected", "invalid_spec"),
        (image().env("A=B", "x"), "rejected", "invalid_env"),
        (image().env("A", "x\u{0}y"), "rejected", "invalid_env"),
        (
            image().with("mounts", json!([{"source": "/tmp", "target": "rel"}])),
            "rejected",
            "invalid_spec",
        ),
        (
            image().with(
                "ports",
                json!([{"container_port": 80, "host_ip": "not-an-ip"}]),
            ),
            "rejected",
            "invalid_spec",
        ),
        (
            image().with("working_dir", "/a/../b"),
            "rejected",
            "invalid_spec",
        ),
        (
            Spec::docker("capstan-test/absent:1"),
            "failed",
            "image_not_found",
        ),
    ];
    let lines: Vec<_> = (1..)
        .zip(&cases)
        .map(|(n, (spec, _, _))| c.prepare(&format!("b{n}"), "web", "r1", spec.clone()))
        .collect();
    let expected: Vec<_> = cases.iter().map(|(_, o, c)| (*o, *c)).collect();
    a.apply_expecting(&lines, &expected);
    assert!(a.containers().is_empty(), "{:?}", a.containers());
    assert!(a.intent()["workloads"].as_object().unwrap().is_empty());
}

fn spec_fields_reach_the_container_as_given(engine: Engine) {
    let a = agent(engine, "fields").build();
    let c = a.commands(&a.host);
    let spec = Spec::docker(IMAGE)
        .command(&["sleep", "300"])
        .env("GREETING", "hello world")
        .env("EMPTY", "")
        .with("working_dir", "/tmp")
        .with(
            "mounts",
            json!([{"source": "/etc", "target": "/host-etc", "read_only": true}]),
        )
        .with(
            "ports",
            json!([{"container_port": 8080, "host_ip": "127.0.0.1"}]),
        );
    a.apply_ok(&[c.ensure_namespace("ns"), c.prepare("p", "web", "r1", spec)]);
    let web = a.container("web", "r1");
    assert!(!web.running, "prepare creates without starting");
    let i = a.inspect(&web.id);
    assert_eq!(i["Config"]["Cmd"], json!(["sleep", "300"]));
    assert_eq!(i["Config"]["WorkingDir"], "/tmp");
    assert!(web.has_env("GREETING=hello world"), "{:?}", web.env);
    assert!(web.has_env("EMPTY="), "{:?}", web.env);
    assert_eq!(i["HostConfig"]["RestartPolicy"]["Name"], "no");
    // The mount points, as both engines show them (podman has no `HostConfig.Mounts`).
    assert_eq!(i["Mounts"][0]["Type"], "bind");
    assert_eq!(i["Mounts"][0]["Source"], "/etc");
    assert_eq!(i["Mounts"][0]["Destination"], "/host-etc");
    assert_eq!(i["Mounts"][0]["RW"], false);
    assert_eq!(
        i["HostConfig"]["PortBindings"]["8080/tcp"][0]["HostIp"],
        "127.0.0.1"
    );
    assert_eq!(i["Config"]["Labels"]["io.capstan.managed"], "true");
    assert_eq!(i["Config"]["Labels"]["io.capstan.namespace"], c.ns.as_str());
    // On the namespace's network under the workload's name (podman says `bridge` in
    // `HostConfig.NetworkMode` for any bridge network: the attachment is the truth).
    let networks = i["NetworkSettings"]["Networks"]
        .as_object()
        .expect("networks");
    assert_eq!(
        networks.keys().collect::<Vec<_>>(),
        [&format!("capstan-{}", c.ns)]
    );
    let aliases = &networks[&format!("capstan-{}", c.ns)]["Aliases"];
    assert!(
        aliases.as_array().into_iter().flatten().any(|a| a == "web"),
        "{aliases}"
    );
}

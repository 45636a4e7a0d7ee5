//! The Deployment we apply for a spec (env, replicas, readiness probe, strategy),
//! the template read back from the live object, the specs refused, the staged revision.

use super::*;

#[test]
fn the_deployment_carries_the_revision_env_and_replicas() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 3, 3, 600);
    assert_eq!(d["metadata"]["name"], "capstan-web");
    assert_eq!(d["metadata"]["namespace"], "team");
    assert_eq!(d["metadata"]["labels"][REVISION], "r1");
    assert_eq!(d["metadata"]["annotations"][REVISION], "r1");
    assert_eq!(d["metadata"]["annotations"][REPLICAS], "3");
    assert_eq!(d["spec"]["replicas"], 3);
    let pod = &d["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"][REVISION], "r1");
    assert_eq!(pod["metadata"]["annotations"][REVISION], "r1");
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["name"], CONTAINER);
    assert_eq!(c["args"], json!(["serve", "--port=8080"]));
    assert_eq!(
        c["env"],
        json!([{"name": "MODE", "value": "prod"}, {"name": "TOKEN_REF", "value": "opaque-abc"}])
    );
    assert_eq!(c["workingDir"], "/srv");
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 8080, "protocol": "TCP"}])
    );
    // The selector never names the revision: it is immutable once created.
    assert!(d["spec"]["selector"]["matchLabels"].get(REVISION).is_none());
}

/// The `main` container's readinessProbe of the Deployment for `spec`.
fn probe_of(spec: &Spec) -> Value {
    let t = Template::from_spec(spec, &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 1, 1, 600);
    d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"].clone()
}

#[test]
fn each_readiness_check_becomes_the_containers_readiness_probe() {
    assert_eq!(probe_of(&spec()), Value::Null, "no readiness, no probe");
    let mut s = spec();
    let exec = Check::Exec {
        command: vec!["test".into(), "-f".into(), "/ready".into()],
    };
    s.readiness = Some(readiness(exec, 1_000, 1_000, 1));
    assert_eq!(
        probe_of(&s),
        json!({"exec": {"command": ["test", "-f", "/ready"]},
            "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1})
    );
    let http = Check::Http {
        port: 8080,
        path: "/healthz?full=1".into(),
    };
    s.readiness = Some(readiness(http, 2_000, 500, 3));
    assert_eq!(
        probe_of(&s),
        json!({"httpGet": {"port": 8080, "path": "/healthz?full=1"},
            "periodSeconds": 2, "timeoutSeconds": 1, "successThreshold": 3})
    );
    s.readiness = Some(readiness(Check::Tcp { port: 5432 }, 1_500, 2_001, 2));
    assert_eq!(
        probe_of(&s),
        json!({"tcpSocket": {"port": 5432},
            "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 2})
    );
}

#[test]
fn probe_intervals_and_timeouts_round_up_to_whole_seconds_of_at_least_one() {
    let probe = |interval_ms, timeout_ms| {
        ReadinessProbe::of(&readiness(
            Check::Tcp { port: 1 },
            interval_ms,
            timeout_ms,
            1,
        ))
    };
    for (ms, seconds) in [(10, 1), (999, 1), (1_000, 1), (1_001, 2), (600_000, 600)] {
        assert_eq!(probe(ms, ms).period_seconds, seconds, "{ms} ms");
        assert_eq!(probe(ms, ms).timeout_seconds, seconds, "{ms} ms");
    }
    assert_eq!(probe(1, 1).timeout_seconds, 1);
}

#[test]
fn start_first_rolls_one_pod_at_a_time_keeping_the_old_ones_and_stop_first_recreates() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 5, 5, 600);
    assert_eq!(
        d["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    let mut s = spec();
    s.strategy = Strategy::StopFirst;
    let t = Template::from_spec(&s, &launch()).unwrap();
    let d = deployment(HOST, rev("r1"), &t, 5, 5, 600);
    assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
}

#[test]
fn the_probe_and_the_strategy_read_back_from_the_live_deployment() {
    for strategy in [Strategy::StartFirst, Strategy::StopFirst] {
        for check in [
            Check::Exec {
                command: vec!["true".into()],
            },
            Check::Http {
                port: 80,
                path: "/".into(),
            },
            Check::Tcp { port: 443 },
        ] {
            let mut s = spec();
            s.strategy = strategy;
            s.readiness = Some(readiness(check, 2_500, 300, 4));
            let t = Template::from_spec(&s, &launch()).unwrap();
            let mut applied = deployment(HOST, rev("r1"), &t, 0, 1, 600);
            // As the apiserver answers it: defaults filled in.
            let probe = &mut applied["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
            probe["failureThreshold"] = json!(3);
            if let Some(http) = probe.get_mut("httpGet") {
                http["scheme"] = json!("HTTP");
            }
            let read = Template::from_live(&live(applied, json!({}))).unwrap();
            assert_eq!(read, t, "{strategy:?}");
        }
    }
}

#[test]
fn a_template_reads_back_from_the_live_deployment() {
    let t = Template::from_spec(&spec(), &launch()).unwrap();
    let d = live(deployment(HOST, rev("r1"), &t, 0, 2, 600), json!({}));
    assert_eq!(Template::from_live(&d), Some(t));
    assert_eq!(runs_with(&d), 2);
    assert_eq!(revision_of(&d), Some("r1"));
}

#[test]
fn given_an_empty_env_value_the_apiserver_left_out_when_read_back_then_it_is_kept() {
    let mut s = spec();
    s.env.insert("EMPTY".into(), String::new());
    let t = Template::from_spec(&s, &launch()).unwrap();
    let mut applied = deployment(HOST, rev("r1"), &t, 1, 1, 600);
    // As the apiserver answers it: `value` omitted when empty.
    let env = &mut applied["spec"]["template"]["spec"]["containers"][0]["env"];
    for e in env.as_array_mut().unwrap() {
        if e["value"] == "" {
            e.as_object_mut().unwrap().remove("value");
        }
    }
    let read = Template::from_live(&live(applied, json!({}))).unwrap();
    assert_eq!(read.env["EMPTY"], "");
    assert_eq!(read, t);
}

#[test]
fn specs_the_driver_cannot_run_are_refused() {
    let mut no_image = spec();
    no_image.image = None;
    assert_eq!(
        Template::from_spec(&no_image, &launch()),
        Err("a kube workload needs an image".to_string())
    );
    let mut mounts = spec();
    mounts.mounts = vec![capstan_common::Mount {
        source: "/data".into(),
        target: "/data".into(),
        read_only: false,
    }];
    assert_eq!(
        Template::from_spec(&mounts, &launch()),
        Err("the kube driver does not mount host paths".to_string())
    );
    for replicas in [0, MAX_REPLICAS + 1] {
        let mut s = spec();
        capstan_common::Settings::write_into(&crate::KubeSpec { replicas }, &mut s);
        assert_eq!(
            Template::from_spec(&s, &launch()),
            Err(format!("kube.replicas must be 1 to {MAX_REPLICAS}")),
            "{replicas}"
        );
    }
}

#[test]
fn the_staged_revision_holds_the_spec_and_no_launch_env() {
    let c = staged(HOST, rev("r1"), &spec());
    assert_eq!(c["metadata"]["name"], "capstan-web-r1");
    assert_eq!(c["metadata"]["labels"][REVISION], "r1");
    let held: Spec = serde_json::from_str(c["data"]["spec.json"].as_str().unwrap()).unwrap();
    assert_eq!(held, spec());
    assert!(!c.to_string().contains("opaque-abc"));
}

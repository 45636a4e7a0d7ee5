//! Env values, args and the working directory reach the Deployment, its pods and the
//! staged ConfigMap byte for byte, for everything `docs/protocol.md` allows (anything
//! but NUL): the apiserver decodes an apply body as YAML, which refuses or folds some
//! of those characters when they are sent raw.

use super::driver::{driver, rev, spec};
use capstan_driver::{Driver, LaunchEnv};
use capstan_tests::kube::KubeCluster;
use capstan_tests::unique;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod};
use kube::api::ListParams;
use kube::Api;
use std::collections::BTreeMap;

/// What YAML refuses raw (DEL, C1 controls, U+FFFE/U+FFFF), what it folds into a space
/// (NEL, U+2028, U+2029), escapes, quotes and YAML syntax, and plain non-ASCII.
const VALUES: &[&str] = &[
    "\u{7f}",
    "\u{80}",
    "\u{85}",
    "\u{9b}",
    "\u{9f}",
    "\u{fffe}\u{ffff}",
    "\u{2028}\u{2029}",
    "\u{feff}after a BOM",
    "tab\there\r\nnext line\n",
    "\u{1}\u{1b}[0m\u{1f}",
    "é ü 中 😀 \u{10ffff}",
    "  leading and trailing  ",
    "a: b # not yaml\n- [x]",
    "'\"\\ \\u0041",
    "",
];

fn env_of(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn env_args_and_working_dir_arrive_byte_exact_in_the_deployment_its_pods_and_the_staged_spec() {
    let cluster = KubeCluster::start();
    let d = driver(&cluster, "capstan-agent", &[]);
    let ns = unique("kube-bytes");
    let r1 = rev(&ns, "r1");
    let mut web = spec("capstan-test/web:1");
    web.env = VALUES
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("V{i}"), v.to_string()))
        .collect();
    web.command = VALUES.iter().map(ToString::to_string).collect();
    web.working_dir = Some("/srv/\u{85}\u{2028}é\u{7f}".into());
    let launch: LaunchEnv = [("TOKEN_REF".to_string(), "opaque-\u{85}\u{9b}".to_string())].into();
    let mut expected_env = web.env.clone();
    expected_env.extend(launch.clone());

    cluster.block_on(async {
        d.ensure_namespace(&ns).await.unwrap();
        d.prepare(r1, &web).await.expect("prepare");
        d.activate(r1, &web, &launch, None).await.expect("activate");
    });
    let admin = cluster.client();
    let staged: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let staged = cluster.block_on(staged.get("capstan-web-r1")).unwrap();
    let json = &staged.data.unwrap()["spec.json"];
    let back: capstan_common::Spec = serde_json::from_str(json).unwrap();
    assert_eq!(back, web, "the staged spec");

    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let main = || {
        let live = cluster.block_on(deployments.get("capstan-web")).unwrap();
        live.spec.unwrap().template.spec.unwrap().containers[0].clone()
    };
    let check = |c: &Container, what: &str| {
        assert_eq!(env_of(c), expected_env, "{what}: env");
        assert_eq!(c.args.as_ref(), Some(&web.command), "{what}: args");
        assert_eq!(c.working_dir, web.working_dir, "{what}: working dir");
    };
    check(&main(), "the Deployment");

    // The controller-manager copies the template into the pods.
    let pods: Api<Pod> = Api::namespaced(admin, &ns);
    let listed = cluster.block_on(pods.list(&ListParams::default())).unwrap();
    assert!(!listed.items.is_empty(), "the rollout made a pod");
    for pod in &listed.items {
        check(&pod.spec.as_ref().unwrap().containers[0], "a pod");
    }

    // stop and resume apply the template read back from the live Deployment.
    cluster.block_on(async {
        d.stop(r1).await.expect("stop");
        d.resume(r1).await.expect("resume");
    });
    check(&main(), "the Deployment after stop and resume");
    cluster.stop();
}

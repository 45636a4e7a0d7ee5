//! A network create that outlived its agent: SIGKILLed mid-`ensure_namespace`, its
//! request still in dockerd, the next agent found no network and made one too.
//! dockerd (API 1.41, as the driver talks to it) lets two networks take one name, and
//! every later use of the name is then ambiguous (400) — seen in the crash loop under
//! load. Here the two are made directly, as the engine allows: `ensure_namespace`
//! makes them one again, and the namespace works. (Podman refuses a second network of
//! a name itself, so this is dockerd's alone.)

use capstan_docker::naming;
use capstan_tests::docker::{agent, serve, Engine};
use serde_json::json;
use std::process::Command;

#[test]
fn two_networks_of_ours_under_one_name_are_made_one_and_the_namespace_works() {
    let engine = Engine::Dockerd;
    let a = agent(engine, "dupnet").build();
    let c = a.commands(&a.host);
    let name = naming::network_name(&c.ns);
    let labels = naming::network_labels(&a.host, &c.ns);
    let body = json!({"Name": name, "Driver": "bridge", "Labels": labels}).to_string();
    let socket = engine.socket();
    let socket = socket.trim_start_matches("unix://");
    for _ in 0..2 {
        // The engine's API without `CheckDuplicate`, as a create by the driver sends it.
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--fail-with-body", "--unix-socket", socket])
            .args(["-H", "Content-Type: application/json", "-d", &body])
            .arg("http://localhost/v1.41/networks/create");
        let out =
            capstan_tests::process::output("curl networks/create", capstan_tests::READY, curl);
        assert!(out.status.success(), "{out:?}");
    }
    let named = || {
        let ids = engine.docker(&["network", "ls", "-q", "--filter", &format!("name=^{name}$")]);
        ids.lines().count()
    };
    assert_eq!(
        named(),
        2,
        "the engine took a second network of the same name"
    );

    a.apply_ok(&[
        c.ensure_namespace("e"),
        c.prepare("p", "web", "r1", serve("r1")),
        c.activate("a", "web", "r1"),
    ]);
    assert_eq!(named(), 1, "made one again");
    let web = a.container("web", "r1");
    assert!(web.running, "{web:?}");
}

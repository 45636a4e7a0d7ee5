//! `strategy: "stop-first"` on the real engines: two revisions that publish the same
//! host port cannot run at once, so start-first fails (the predecessor keeps the port
//! and runs on) and stop-first replaces it.

use capstan_tests::command::Spec;
use capstan_tests::docker::{agent, serve, Engine};
use capstan_tests::free_port;
use serde_json::json;

capstan_tests::each_engine!(revisions_sharing_a_host_port_replace_each_other_only_stop_first);

fn on_port(rev: &str, port: u16) -> Spec {
    let published = json!([{"container_port": 8080, "host_port": port, "host_ip": "127.0.0.1"}]);
    serve(rev).with("ports", published)
}

fn revisions_sharing_a_host_port_replace_each_other_only_stop_first(engine: Engine) {
    let a = agent(engine, "stopfirst").build();
    let c = a.commands(&a.host);
    let port = free_port();
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "web", "r1", on_port("r1", port)),
        c.activate("a1", "web", "r1"),
        c.prepare("p2", "web", "r2", on_port("r2", port)),
        c.prepare(
            "p3",
            "web",
            "r3",
            on_port("r3", port).with("strategy", "stop-first"),
        ),
    ]);
    let r1 = a.container("web", "r1");
    // Start-first: r2 cannot bind the port while r1 holds it.
    let applied = a.apply(&[c.activate("a2", "web", "r2")]);
    assert_eq!(applied.results[0]["outcome"], "failed", "{applied}");
    // The engine refuses the start: a driver failure, naming the op.
    assert_eq!(
        applied.results[0]["error"]["code"], "driver_failed",
        "{applied}"
    );
    assert_eq!(a.container("web", "r1"), r1, "r1 runs on, untouched");
    assert!(!a.container("web", "r2").running);
    // Stop-first: r1 gives the port up first.
    a.apply_ok(&[c.activate("a3", "web", "r3")]);
    assert!(a.container("web", "r3").running);
    assert!(!a.container("web", "r1").running);
    assert_eq!(
        a.intent()["workloads"][format!("{}/web", c.ns)]["active_revision"],
        "r3"
    );
}

//! Ownership is read back from labels: an agent never adopts, deletes or even sees
//! another host's network or containers on a shared engine.

use capstan_tests::docker::{docker, DockerAgent};

#[test]
fn another_hosts_network_is_neither_adopted_nor_deleted() {
    let x = DockerAgent::new("ownx");
    let y = DockerAgent::new("owny");
    x.apply_ok(
        "setup.jsonl",
        &[
            x.ensure_ns("ns"),
            x.prepare("p", "web", "r1"),
            x.activate("a", "web", "r1"),
        ],
    );
    let web = x.container("web", "r1");
    let theirs = |id: &str, op: &str| y.line(id, &format!(r#""op":"{op}","namespace":"{}""#, x.ns));
    let (status, results) = y.apply(
        "steal.jsonl",
        &[
            theirs("e", "ensure_namespace"),
            theirs("d", "delete_namespace"),
        ],
    );
    assert!(!status.success());
    for r in &results {
        assert_eq!(r["outcome"], "failed", "{r}");
        assert_eq!(r["error"]["code"], "driver_failed", "{r}");
    }
    assert!(y.containers().is_empty(), "y sees none of x's containers");
    assert_eq!(x.containers(), vec![web], "x's container untouched");
    let net = format!("capstan-{}", x.ns);
    let labels = docker(&["network", "inspect", "-f", "{{json .Labels}}", &net]);
    assert!(labels.contains(x.host()), "still x's network: {labels}");
}

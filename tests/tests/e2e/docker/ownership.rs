//! Ownership is read back from labels: an agent never adopts, deletes or even sees
//! another host's network or containers on a shared engine.

use capstan_tests::docker::{agent, serve, Engine};
use capstan_tests::process::Exit;

capstan_tests::each_engine!(another_hosts_network_is_neither_adopted_nor_deleted);

fn another_hosts_network_is_neither_adopted_nor_deleted(engine: Engine) {
    let x = agent(engine, "ownx").build();
    let y = agent(engine, "owny").build();
    let xc = x.commands(&x.host);
    x.apply_ok(&[
        xc.ensure_namespace("ns"),
        xc.prepare("p", "web", "r1", serve("r1")),
        xc.activate("a", "web", "r1"),
    ]);
    let web = x.container("web", "r1");
    // y, on the same engine, names x's namespace.
    let theirs = y.commands(&xc.ns);
    let applied = y.apply(&[theirs.ensure_namespace("e"), theirs.delete_namespace("d")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    assert_eq!(applied.results.len(), 2, "{applied}");
    let net = format!("capstan-{}", xc.ns);
    // Refused as someone else's object (`not_owned`), not as an engine failure.
    for (r, why) in applied.results.iter().zip([
        format!(
            "ensure_namespace {}: network {net} exists and is not this host's capstan network",
            xc.ns
        ),
        format!(
            "delete_namespace {}: network {net} is not this host's capstan network",
            xc.ns
        ),
    ]) {
        assert_eq!(r["outcome"], "failed", "{r}");
        assert_eq!(r["error"]["code"], "not_owned", "{r}");
        assert_eq!(r["error"]["message"], why, "{r}");
        assert_eq!(r["retryable"], false, "{r}");
    }
    assert!(y.containers().is_empty(), "y sees none of x's containers");
    assert_eq!(x.containers(), vec![web], "x's container untouched");
    let labels = x.docker(&["network", "inspect", "-f", "{{json .Labels}}", &net]);
    assert!(labels.contains(&x.host), "still x's network: {labels}");
}

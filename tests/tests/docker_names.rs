//! Container names: readable `capstan-<ns>-<workload>-<rev>` when it fits, hash-shortened
//! when too long, and never confused between two triples that spell the same
//! readable name (`a-b`+`c` vs `a`+`b-c`): containers are found by labels.

use capstan_tests::docker::DockerAgent;

#[test]
fn long_and_colliding_names_get_distinct_bounded_containers() {
    let a = DockerAgent::new("names");
    let long_wl = format!("w{}", "x".repeat(62));
    let long_rev = format!("r{}", "y".repeat(62));
    a.apply_ok(
        "setup.jsonl",
        &[
            a.ensure_ns("ns"),
            a.prepare("p1", "a-b", "c"),
            a.activate("a1", "a-b", "c"),
            a.prepare("p2", "a", "b-c"),
            a.activate("a2", "a", "b-c"),
            a.prepare("p3", &long_wl, &long_rev),
            a.activate("a3", &long_wl, &long_rev),
        ],
    );
    let first = a.container("a-b", "c");
    let second = a.container("a", "b-c");
    let long = a.container(&long_wl, &long_rev);
    assert_eq!(first.name, format!("capstan-{}-a-b-c", a.ns));
    assert_ne!(second.name, first.name);
    assert!(second.name.len() <= 63, "{}", second.name);
    assert!(long.name.len() <= 63, "{}", long.name);
    assert!(first.running && second.running && long.running);
    assert!(first.env.contains(&"REV=c".to_string()));
    assert!(second.env.contains(&"REV=b-c".to_string()));

    // Retiring one of the pair touches only its own container.
    a.apply_ok(
        "retire.jsonl",
        &[
            a.op("s2", "stop_workload", "a", ""),
            a.op("t2", "retire_revision", "a", r#""revision":"b-c""#),
        ],
    );
    let left = a.containers();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&first) && left.contains(&long), "{left:?}");
}

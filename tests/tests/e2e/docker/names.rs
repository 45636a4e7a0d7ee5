//! Container names: readable `capstan-<ns>-<workload>-<rev>` when it fits, hash-shortened
//! when too long, and never confused between two triples that spell the same
//! readable name (`a-b`+`c` vs `a`+`b-c`): containers are found by labels.

use capstan_tests::docker::{agent, serve, Engine};

capstan_tests::each_engine!(long_and_colliding_names_get_distinct_bounded_containers);

fn long_and_colliding_names_get_distinct_bounded_containers(engine: Engine) {
    let a = agent(engine, "names").build();
    let c = a.commands(&a.host);
    let long_wl = format!("w{}", "x".repeat(62));
    let long_rev = format!("r{}", "y".repeat(62));
    a.apply_ok(&[
        c.ensure_namespace("ns"),
        c.prepare("p1", "a-b", "c", serve("c")),
        c.activate("a1", "a-b", "c"),
        c.prepare("p2", "a", "b-c", serve("b-c")),
        c.activate("a2", "a", "b-c"),
        c.prepare("p3", &long_wl, &long_rev, serve(&long_rev)),
        c.activate("a3", &long_wl, &long_rev),
    ]);
    let first = a.container("a-b", "c");
    let second = a.container("a", "b-c");
    let long = a.container(&long_wl, &long_rev);
    assert_eq!(first.name, format!("capstan-{}-a-b-c", c.ns));
    assert_ne!(second.name, first.name);
    assert!(second.name.len() <= 63, "{}", second.name);
    assert!(long.name.len() <= 63, "{}", long.name);
    assert!(first.running && second.running && long.running);
    assert!(first.has_env("REV=c"));
    assert!(second.has_env("REV=b-c"));

    // Retiring one of the pair touches only its own container.
    a.apply_ok(&[c.stop("s2", "a"), c.retire("t2", "a", "b-c")]);
    let left = a.containers();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&first) && left.contains(&long), "{left:?}");
}

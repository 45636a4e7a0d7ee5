//! `retire_revision` removes exactly the named revision's container; the newer,
//! running revision is never touched. A namespace with our containers left in it is
//! not deleted.

use capstan_tests::docker::{docker, DockerAgent};

#[test]
fn retiring_the_old_revision_leaves_the_new_one_running() {
    let a = DockerAgent::new("ret");
    a.apply_ok(
        "setup.jsonl",
        &[
            a.ensure_ns("ns"),
            a.prepare("p1", "web", "r1"),
            a.activate("a1", "web", "r1"),
            a.prepare("p2", "web", "r2"),
            a.activate("a2", "web", "r2"),
        ],
    );
    let r2 = a.container("web", "r2");
    assert!(r2.running);
    assert!(!a.container("web", "r1").running);
    assert!(r2.env.contains(&"REV=r2".to_string()), "{:?}", r2.env);

    a.apply_ok(
        "retire.jsonl",
        &[
            a.op("t1", "retire_revision", "web", r#""revision":"r1""#),
            // A retry of the removal is harmless.
            a.op("t1b", "retire_revision", "web", r#""revision":"r1""#),
        ],
    );
    let left = a.containers();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        left[0], r2,
        "r2 untouched: same id, still running, same start"
    );

    // Not empty: refused with a code, nothing removed.
    let (status, results) = a.apply(
        "delete.jsonl",
        &[a.line(
            "d1",
            &format!(r#""op":"delete_namespace","namespace":"{}""#, a.ns),
        )],
    );
    assert!(!status.success());
    assert_eq!(
        results[0]["error"]["code"], "namespace_not_empty",
        "{results:?}"
    );
    assert_eq!(a.containers(), vec![r2]);
    let net = format!("capstan-{}", a.ns);
    assert_eq!(
        docker(&["network", "ls", "-q", "--filter", &format!("name=^{net}$")])
            .lines()
            .count(),
        1
    );

    // Empty: deleted, network gone.
    a.apply_ok(
        "empty.jsonl",
        &[
            a.op("s", "stop_workload", "web", ""),
            a.op("t2", "retire_revision", "web", r#""revision":"r2""#),
            a.line(
                "d2",
                &format!(r#""op":"delete_namespace","namespace":"{}""#, a.ns),
            ),
        ],
    );
    assert!(a.containers().is_empty());
    assert!(
        docker(&["network", "ls", "-q", "--filter", &format!("name=^{net}$")])
            .trim()
            .is_empty()
    );
}

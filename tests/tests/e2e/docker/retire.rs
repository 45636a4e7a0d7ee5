//! `retire_revision` removes exactly the named revision's container; the newer,
//! running revision is never touched. A namespace with our containers left in it is
//! not deleted.

use capstan_tests::docker::{agent, serve, Engine};
use capstan_tests::process::Exit;

capstan_tests::each_engine!(retiring_the_old_revision_leaves_the_new_one_running);

fn retiring_the_old_revision_leaves_the_new_one_running(engine: Engine) {
    let a = agent(engine, "ret").build();
    let c = a.commands(&a.host);
    let mut setup = c.rollout(&["web"], "r1", serve);
    setup.push(c.prepare("p2", "web", "r2", serve("r2")));
    setup.push(c.activate("a2", "web", "r2"));
    a.apply_ok(&setup);
    let r2 = a.container("web", "r2");
    assert!(r2.running);
    assert!(!a.container("web", "r1").running);
    assert!(r2.has_env("REV=r2"), "{:?}", r2.env);

    a.apply_ok(&[
        c.retire("t1", "web", "r1"),
        // A retry of the removal is harmless.
        c.retire("t1b", "web", "r1"),
    ]);
    let left = a.containers();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        left[0], r2,
        "r2 untouched: same id, still running, same start"
    );

    // Not empty: refused with a code, nothing removed.
    let applied = a.apply(&[c.delete_namespace("d1")]);
    assert_eq!(applied.exit, Exit::Code(1), "{applied}");
    assert_eq!(
        applied.results[0]["error"]["code"], "namespace_not_empty",
        "{applied}"
    );
    assert_eq!(a.containers(), vec![r2]);
    let net = format!("capstan-{}", c.ns);
    let networks = || a.docker(&["network", "ls", "-q", "--filter", &format!("name=^{net}$")]);
    assert_eq!(networks().lines().count(), 1);

    // Empty: deleted, network gone.
    a.apply_ok(&[
        c.stop("s", "web"),
        c.retire("t2", "web", "r2"),
        c.delete_namespace("d2"),
    ]);
    assert!(a.containers().is_empty());
    assert!(networks().trim().is_empty());
}

//! Exactly once across retention, with the real agent: a command whose records
//! `[log.retention]` pruned is answered from the log when it comes again (here by
//! `apply`, re-issued later), never carried out again; and its id with other content
//! is `id_conflict`.

use capstan_tests::agent::Agent;
use capstan_tests::command::{Cmd, Commands, Spec};
use capstan_tests::process::{send_signal, Exit};
use capstan_tests::unique;

/// `web` on r1 (activation `a.web.r1`), then on r2, then 400 namespaces (3 records
/// each): past the first snapshot (1,024 records), which a prune never passes.
pub(crate) fn history(c: &Commands) -> Vec<Cmd> {
    let mut lines = c.rollout(&["web"], "r1", |_| Spec::sim());
    lines.push(c.prepare("p.web.r2", "web", "r2", Spec::sim()));
    lines.push(c.activate("a.web.r2", "web", "r2"));
    lines.extend((0..400).map(|i| c.in_ns(&format!("n{i}")).ensure_namespace(&format!("n{i}"))));
    lines
}

/// `[log.retention]` pruning all it may every second (exports into the agent's dir).
pub(crate) fn prune_everything(a: &mut Agent) {
    let export = a.path("export");
    a.reconfigure(|b| {
        b.extra_toml(&format!(
            "[log.retention]\nmax_records = 10\nexport_dir = {:?}\ninterval_secs = 1\n",
            export.display().to_string()
        ))
    });
}

/// The first activation again, issued later (as a coordinator's re-post is).
pub(crate) fn reissued(c: &Commands, revision: &str) -> Cmd {
    c.activate("a.web.r1", "web", revision)
        .with("issued_at", "2026-12-20T10:00:00Z")
}

#[test]
fn a_pruned_command_applied_again_is_answered_from_the_log_and_runs_once() {
    let mut a = Agent::builder(&unique("pruned")).build();
    prune_everything(&mut a);
    let c = a.commands("ns");
    a.apply_ok(&history(&c));
    assert_eq!(
        a.log_of("a.web.r1").len(),
        3,
        "received, started, completed"
    );

    // The daemon prunes what retention asks for (up to the snapshot).
    let daemon = a.run();
    daemon.wait_for_text("log records exported and pruned");
    send_signal(daemon.id(), libc::SIGUSR2);
    daemon.wait_expecting(Exit::OK);
    assert!(a.log_of("a.web.r1").is_empty(), "its records are pruned");
    let records = a.log().len();

    let again = a.apply(&[reissued(&c, "r1")]);
    assert_eq!(again.exit, Exit::OK, "{again:?}");
    let answer = &again.results[0];
    assert_eq!(
        (&answer["outcome"], &answer["duplicate"]),
        (&"succeeded".into(), &true.into()),
        "{answer}"
    );
    let conflict = a.apply(&[reissued(&c, "r2")]);
    assert_eq!(
        conflict.results[0]["error"]["code"], "id_conflict",
        "{conflict:?}"
    );

    // Carried out once: r1 started once, r2 still active, nothing appended but the
    // conflict's rejection.
    let sim = a.sim_host();
    assert_eq!(sim["revisions"]["ns/web@r1"]["starts"], 1, "{sim}");
    let intent = a.intent();
    assert_eq!(
        intent["workloads"]["ns/web"]["active_revision"], "r2",
        "{intent}"
    );
    let kinds: Vec<_> = a.log()[records..]
        .iter()
        .map(|r| r["kind"].clone())
        .collect();
    assert_eq!(kinds, ["command_rejected"]);
    assert!(a.verify().0);
}

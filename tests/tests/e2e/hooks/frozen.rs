//! Owner config is read once at start: editing it while the agent runs changes
//! nothing until a restart.

use capstan_tests::agent::Agent;
use capstan_tests::command::Commands;
use capstan_tests::hooks::Hook;
use capstan_tests::process::Exit;
use std::io::Write as _;

#[test]
fn owner_config_cannot_change_while_the_agent_runs() {
    let phases = &["after_namespace_prepared", "before_namespace_delete"];
    let mut agent = Agent::builder("h1")
        .hook(Hook::plain("iam", phases))
        .build();
    let host = agent.host.clone();
    let mut apply = agent.start_apply(None);
    let mut stdin = apply.stdin();
    let stdout = apply.stdout_lines();
    let mut ask = |ns: &str| {
        writeln!(stdin, "{}", Commands::new(&host, ns).ensure_namespace(ns)).unwrap();
        stdin.flush().unwrap();
        let line = stdout
            .next_line(&format!("the result of ensure_namespace {ns}"))
            .expect("a result line before the end of stdout");
        let r: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(r["outcome"], "succeeded", "{line}");
    };
    ask("one");
    // Rewrite the config while the agent runs: a different owner list.
    agent.reconfigure(|b| b.without_hooks().hook(Hook::plain("intruder", phases)));
    ask("two");
    drop(stdin);
    apply.wait_expecting(Exit::OK);
    assert_eq!(
        agent.calls("iam").len(),
        2,
        "the running agent kept its owners"
    );
    assert!(agent.calls("intruder").is_empty());
    // A restart reads the new list.
    agent.apply_ok(&[agent.commands("three").ensure_namespace("three")]);
    assert_eq!(agent.calls("intruder").len(), 1);
    assert_eq!(agent.calls("iam").len(), 2);
}

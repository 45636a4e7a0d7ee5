//! Owner config is read once at start: editing it while the agent runs changes
//! nothing until a restart.

use capstan_tests::hooks::{command, HookAgent, Owner};
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;

#[test]
fn owner_config_cannot_change_while_the_agent_runs() {
    let original = [Owner::plain("iam", &["after_namespace_prepared"])];
    let replacement = [Owner::plain("intruder", &["after_namespace_prepared"])];
    let agent = HookAgent::new(&original);
    let mut child = agent
        .command()
        .args(["apply", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |id: &str, ns: &str| {
        writeln!(
            stdin,
            "{}",
            command(id, "ensure_namespace", &format!(r#""namespace":"{ns}""#))
        )
        .unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let r: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(r["outcome"], "succeeded", "{line}");
    };
    ask("c1", "one");
    // Rewrite the config while the agent runs: a different owner list.
    agent.configure(&replacement);
    ask("c2", "two");
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert_eq!(
        agent.calls("iam").len(),
        2,
        "the running agent kept its owners"
    );
    assert!(agent.calls("intruder").is_empty());
    // A restart reads the new list.
    let out = agent.apply(&[command("c3", "ensure_namespace", r#""namespace":"three""#)]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(agent.calls("intruder").len(), 1);
    assert_eq!(agent.calls("iam").len(), 2);
}

//! `capstan-agent log`, `log verify` and `intent` while `run` holds the log (sled lets
//! one process open it): the running agent answers them over its local socket
//! (`<data_dir>/agent.sock`), with the same output as read from the log files once it
//! has stopped, over more than one page of records.

use capstan_tests::agent::Agent;
use capstan_tests::command::Spec;
use capstan_tests::process::{send_signal, Exit};
use capstan_tests::unique;

/// Every read the CLI offers, each one's stdout.
fn reads(a: &Agent) -> Vec<(String, String)> {
    let reads: [&[&str]; 11] = [
        &["log"],
        &["log", "--json"],
        &["log", "--json", "--since", "1100"],
        &["log", "--namespace", "ns", "--workload", "web"],
        &["log", "--workload", "db"],
        &["log", "--json", "--command", "a.web.r1"],
        &["log", "verify"],
        &["intent"],
        &["intent", "--json"],
        // Time ranges (the time index), over more than one page from the socket.
        &["log", "--json", "--since-time", "2000-01-01T00:00:00Z"],
        &["log", "--json", "--until-time", "2000-01-01T00:00:00Z"],
    ];
    reads
        .iter()
        .map(|args| {
            let out = String::from_utf8(a.cli_ok(args)).expect("UTF-8");
            (args.join(" "), out)
        })
        .collect()
}

#[test]
fn log_and_intent_are_read_from_the_running_agent_as_from_the_files() {
    let a = Agent::builder(&unique("reads")).build();
    let c = a.commands("ns");
    let mut lines = c.rollout(&["web", "db"], "r1", |_| Spec::sim());
    // 400 more namespaces, 3 records each: the log is more than one page (1,000).
    lines.extend((0..400).map(|i| c.in_ns(&format!("n{i}")).ensure_namespace(&format!("n{i}"))));
    a.apply_ok(&lines);

    let daemon = a.run();
    assert!(
        a.data_dir().join("agent.sock").exists(),
        "the running agent's socket"
    );
    let running = reads(&a);
    let records = running[1].1.lines().count();
    assert!(records > 1_200, "{records} records");
    assert!(
        running[6].1.starts_with(&format!("ok {records} records")),
        "{}",
        running[6].1
    );
    assert_eq!(running[2].1.lines().count(), records - 1_100);
    assert!(
        running[8].1.contains("\"active_revision\":\"r1\""),
        "{}",
        running[8].1
    );
    assert_eq!(running[9].1, running[1].1, "every record is after 2000");
    assert_eq!(running[10].1, "", "no record is before 2000");

    // Stopped leaving the workloads running, it appends nothing: the files say the same.
    send_signal(daemon.id(), libc::SIGUSR2);
    daemon.wait_expecting(Exit::OK);
    assert!(
        !a.data_dir().join("agent.sock").exists(),
        "the socket went with the agent"
    );
    let stopped = reads(&a);
    for ((what, live), (_, files)) in running.iter().zip(&stopped) {
        assert_eq!(live, files, "capstan-agent {what}");
    }
}

#[test]
fn a_read_whose_reader_went_away_ends_quietly() {
    let a = Agent::builder(&unique("epipe")).build();
    let c = a.commands("ns");
    let mut lines = c.rollout(&["web"], "r1", |_| Spec::sim());
    lines.extend((0..50).map(|i| c.in_ns(&format!("n{i}")).ensure_namespace(&format!("n{i}"))));
    a.apply_ok(&lines);
    for args in [
        &["intent", "--json"][..],
        &["intent"],
        &["log"],
        &["log", "--json"],
        &["log", "verify"],
    ] {
        // The read end closed before the agent writes: every write is EPIPE
        // (`capstan-agent log | head`, after `head` exited).
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = a
            .command()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run capstan-agent");
        assert!(out.status.success(), "{args:?}: {}", out.status);
        assert_eq!(
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.contains(" INFO "))
                .collect::<Vec<_>>(),
            Vec::<&str>::new(),
            "{args:?}"
        );
    }
}

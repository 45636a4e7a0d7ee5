//! The real `capstan-sim-driver` process behind its socket: the driver contract
//! (`capstan_driver::testkit`) holds over the protocol; a driver killed mid-request
//! fails that request retryably and is reconnected; untrusted or unexpected drivers
//! are refused clearly.

use capstan_common::{DriverKind, ErrorCode, Spec};
use capstan_driver::sim::SimHost;
use capstan_driver::testkit::{EnvProbe, Kit};
use capstan_driver::{BackendState, Driver, LaunchEnv, RevisionRef};
use capstan_external::{ConnectError, ExternalConfig, ExternalDriver};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a test waits for something that should happen at once.
const READY: Duration = Duration::from_secs(30);

/// A `capstan-sim-driver` process, its stderr lines on a channel.
struct SimProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl SimProcess {
    fn start(socket: &Path, state: &Path, extra: &[&str]) -> SimProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_capstan-sim-driver"))
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start capstan-sim-driver");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("sim-driver: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        SimProcess { child, lines }
    }

    /// Blocks until a stderr line contains `text`.
    fn wait_for(&self, text: &str) {
        loop {
            match self.lines.recv_timeout(READY) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(e) => panic!("no line with {text:?}: {e}"),
            }
        }
    }

    /// SIGKILL by pid; asserts it was the kill that ended it.
    fn kill(mut self) {
        // `Child::kill` is SIGKILL to the child's pid.
        self.child.kill().unwrap();
        let exit = self.child.wait().unwrap();
        assert_eq!(exit.signal(), Some(9), "{exit:?}");
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("driver.sock"), dir.join("host"))
}

/// A `capstan-sim-driver` in `dir`, and the agent's side connected to it.
async fn connected(dir: &Path) -> (SimProcess, ExternalDriver) {
    let (socket, state) = paths(dir);
    let sim = SimProcess::start(&socket, &state, &[]);
    let driver = ExternalDriver::connect(ExternalConfig::at(&socket))
        .await
        .unwrap();
    (sim, driver)
}

fn spec() -> Spec {
    serde_json::from_str(r#"{"driver":"sim","command":["serve"]}"#).unwrap()
}

/// The env the sim behind the socket last started a revision with, read from its
/// host state (which it journals before it answers).
struct SimHostEnv(PathBuf);

#[async_trait::async_trait]
impl EnvProbe for SimHostEnv {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let host = SimHost::load(&self.0).map_err(|e| format!("load the sim host: {e}"))?;
        let r = host
            .revisions
            .values()
            .find(|r| {
                (
                    r.namespace.as_str(),
                    r.workload.as_str(),
                    r.revision.as_str(),
                ) == (rev.namespace, rev.workload, rev.revision)
            })
            .ok_or_else(|| format!("{rev} is not on the sim host"))?;
        match r.state {
            BackendState::Running => Ok(r.env.clone()),
            ref state => Err(format!("{rev} does not run: {state:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_contract_holds_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, driver) = connected(dir.path()).await;
    assert_eq!(driver.kind(), DriverKind::SIM);
    assert!(driver.capabilities().manages_lifecycle);
    let probe = SimHostEnv(paths(dir.path()).1);
    let mut spec = spec();
    spec.env.insert("MODE".into(), "spec".into());
    Kit::new(&driver, "kit", spec)
        .with_env_probe(&probe)
        .run()
        .await
        .unwrap();
    sim.kill();
}

/// Given a driver process of a kind no build of capstan knows, when the agent
/// connects, then it takes the kind the driver announces and the driver contract holds
/// for specs that name it and carry its own section; a kind outside the grammar is
/// refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_of_a_new_kind_runs_the_specs_that_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, state) = paths(dir.path());
    let acme = SimProcess::start(&socket, &state, &["--kind", "acme-vm"]);
    let config = ExternalConfig {
        kind: Some("acme-vm".parse().unwrap()),
        ..ExternalConfig::at(&socket)
    };
    let driver = ExternalDriver::connect(config).await.unwrap();
    assert_eq!(driver.kind().as_str(), "acme-vm");
    let spec: Spec = serde_json::from_str(
        r#"{"driver":"acme-vm","command":["serve"],"acme-vm":{"vcpus":2,"disk":{"gb":8}}}"#,
    )
    .unwrap();
    capstan_common::validate::spec(&spec).unwrap();
    assert_eq!(
        spec.section().unwrap().json(),
        r#"{"vcpus":2,"disk":{"gb":8}}"#
    );
    Kit::new(&driver, "kit", spec)
        .with_env_probe(&SimHostEnv(state))
        .run()
        .await
        .unwrap();
    acme.kill();

    let dir = tempfile::tempdir().unwrap();
    let (socket, state) = paths(dir.path());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_capstan-sim-driver"))
        .args(["--kind", "Acme VM", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("must be 1-32 characters"),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_with_a_readiness_check_is_refused_at_prepare_and_never_reaches_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, driver) = connected(dir.path()).await;
    let checked: Spec = serde_json::from_str(
        r#"{"driver":"sim","command":["serve"],"readiness":{"check":{"tcp":{"port":8080}}}}"#,
    )
    .unwrap();
    let rev = capstan_driver::RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };
    driver.ensure_namespace("ns").await.unwrap();
    let e = driver.prepare(rev, &checked).await.unwrap_err();
    assert_eq!(e.code(), capstan_common::ErrorCode::InvalidSpec, "{e}");
    assert!(e.to_string().contains("readiness"), "{e}");
    let observed = driver.observe().await.unwrap();
    assert!(observed.workloads.is_empty(), "{observed:?}");
    sim.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_mid_request_fails_it_retryably_and_is_reconnected() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, state) = paths(dir.path());
    let sim = SimProcess::start(&socket, &state, &["--hold", "activate"]);
    let driver = std::sync::Arc::new(
        ExternalDriver::connect(ExternalConfig::at(&socket))
            .await
            .unwrap(),
    );
    let rev = RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };
    driver.ensure_namespace("ns").await.unwrap();
    driver.prepare(rev, &spec()).await.unwrap();
    let env = LaunchEnv::new();
    let spec = spec();
    let activate = tokio::spawn({
        let (driver, spec) = (std::sync::Arc::clone(&driver), spec.clone());
        async move { driver.activate(rev, &spec, &LaunchEnv::new(), None).await }
    });
    tokio::task::block_in_place(|| sim.wait_for("holding activate"));
    // Multiplexed: another request on the same connection is answered meanwhile.
    let observed = driver.observe().await.unwrap();
    assert!(
        observed.revision("ns", "web", "r1").is_some(),
        "{observed:?}"
    );
    assert!(!activate.is_finished(), "activate answered while held");
    sim.kill();
    let err = activate.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::DriverUnavailable, "{}", err.report());
    assert!(err.code().is_retryable());
    assert!(err.report().contains("lost"), "{}", err.report());
    // Down: the next call fails fast, the same way.
    let down = driver.observe().await.unwrap_err();
    assert_eq!(
        down.code(),
        ErrorCode::DriverUnavailable,
        "{}",
        down.report()
    );

    let again = SimProcess::start(&socket, &state, &[]);
    tokio::task::block_in_place(|| again.wait_for("listening"));
    driver.activate(rev, &spec, &env, None).await.unwrap();
    assert_eq!(
        driver.state(rev).await.unwrap(),
        Some(BackendState::Running)
    );
    let host = SimHost::load(&state).unwrap();
    assert_eq!(host.revisions["ns/web@r1"].starts, 1, "{host:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_or_unexpected_driver_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, state) = paths(dir.path());
    let sim = SimProcess::start(&socket, &state, &[]);
    let config = ExternalConfig {
        allowed_uids: Some(vec![4_000_000]),
        ..ExternalConfig::at(&socket)
    };
    let err = ExternalDriver::connect(config).await.err().unwrap();
    assert!(matches!(err, ConnectError::Untrusted { .. }), "{err}");
    assert!(err.to_string().contains("does not trust"), "{err}");
    let config = ExternalConfig {
        kind: Some(DriverKind::DOCKER),
        ..ExternalConfig::at(&socket)
    };
    let err = ExternalDriver::connect(config).await.err().unwrap();
    assert!(
        matches!(
            err,
            ConnectError::WrongKind {
                want: DriverKind::DOCKER,
                have: DriverKind::SIM
            }
        ),
        "{err}"
    );
    // A socket nobody serves, with a short timeout: a clear connect error.
    let config = ExternalConfig {
        connect_timeout: Some(0.2),
        ..ExternalConfig::at(dir.path().join("nobody.sock"))
    };
    let err = ExternalDriver::connect(config).await.err().unwrap();
    assert!(err.to_string().contains("nobody.sock"), "{err}");
    sim.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_stream_on_the_connection_until_it_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, state) = paths(dir.path());
    let sim = SimProcess::start(&socket, &state, &["--reports-exits"]);
    let driver = std::sync::Arc::new(
        ExternalDriver::connect(ExternalConfig::at(&socket))
            .await
            .unwrap(),
    );
    assert!(driver.capabilities().reports_exits);
    let rev = RevisionRef {
        namespace: "ns",
        workload: "web",
        revision: "r1",
    };
    driver.ensure_namespace("ns").await.unwrap();
    driver.prepare(rev, &spec()).await.unwrap();
    driver
        .activate(rev, &spec(), &LaunchEnv::new(), None)
        .await
        .unwrap();
    let (tx, mut exits) = tokio::sync::mpsc::channel(8);
    let watch = tokio::spawn({
        let driver = std::sync::Arc::clone(&driver);
        async move { driver.watch_exits(tx).await }
    });
    tokio::task::block_in_place(|| sim.wait_for("exit feed open"));
    driver.stop(rev).await.unwrap();
    let exit = exits.recv().await.unwrap();
    assert_eq!(
        (exit.rev(), exit.exit_code),
        (rev, None),
        "the stop is reported as an exit"
    );
    sim.kill();
    let err = watch.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::DriverUnavailable, "{}", err.report());
}

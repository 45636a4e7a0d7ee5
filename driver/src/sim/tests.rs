//! The sim against the driver contract, and what it adds: declared capabilities, an
//! exit feed, and a backend that gives up.

use super::*;
use crate::testkit::{ContractError, EnvProbe, Kit};
use capstan_common::DriverKind;

pub(super) fn spec() -> Spec {
    Spec {
        driver: DriverKind::SIM,
        ..Default::default()
    }
}

/// How long a test waits for the sim's feed: a lost exit fails it instead of hanging.
const BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// `f`, or a failure naming `what` if it has not finished within [`BOUND`].
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {BOUND:?}"))
}

fn rev(revision: &str) -> RevisionRef<'_> {
    RevisionRef {
        namespace: "ns",
        workload: "web",
        revision,
    }
}

fn reporting() -> SimConfig {
    SimConfig {
        reports_exits: true,
        ..SimConfig::default()
    }
}

/// A sim with `r1` prepared and running.
async fn running(dir: &Path, config: SimConfig) -> SimDriver {
    let sim = SimDriver::open(dir, config).unwrap();
    sim.ensure_namespace("ns").await.unwrap();
    sim.prepare(rev("r1"), &spec()).await.unwrap();
    sim.activate(rev("r1"), &spec(), &LaunchEnv::new(), None)
        .await
        .unwrap();
    sim
}

/// The env the sim last started a revision with: what its workload sees.
struct SimEnv<'a>(&'a SimDriver);

#[async_trait::async_trait]
impl EnvProbe for SimEnv<'_> {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let host = self.0.host();
        let r = host
            .revisions
            .get(&SimHost::key(rev))
            .ok_or_else(|| format!("{rev} is not on the sim host"))?;
        match r.state.is_running() {
            true => Ok(r.env.clone()),
            false => Err(format!("{rev} does not run: {:?}", r.state)),
        }
    }
}

/// [`spec`] with an env, which the kit's launch env overrides on a shared name.
fn spec_with_env() -> Spec {
    Spec {
        env: BTreeMap::from([
            ("MODE".to_string(), "spec".to_string()),
            ("PORT".to_string(), "8080".to_string()),
        ]),
        ..spec()
    }
}

#[tokio::test]
async fn the_sim_keeps_the_driver_contract() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    let probe = SimEnv(&sim);
    Kit::new(&sim, "kit", spec_with_env())
        .with_env_probe(&probe)
        .run()
        .await
        .unwrap();
    assert_eq!(SimHost::load(dir.path()).unwrap(), SimHost::default());
}

/// The sim, breaking one rule of the contract: the kit must say which.
struct Misbehaving(SimDriver, Fault);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Activates without stopping the previous revision.
    KeepsPrevious,
    /// Starts (an explicit start, not an activation) without the launch env: only
    /// the env probe can tell.
    DropsLaunchEnvOnStart,
}

#[async_trait::async_trait]
impl Driver for Misbehaving {
    fn kind(&self) -> DriverKind {
        self.0.kind()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn ensure_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.0.ensure_namespace(namespace).await
    }
    async fn delete_namespace(&self, namespace: &str) -> Result<(), DriverError> {
        self.0.delete_namespace(namespace).await
    }
    async fn prepare(&self, rev: RevisionRef<'_>, spec: &Spec) -> Result<(), DriverError> {
        self.0.prepare(rev, spec).await
    }
    async fn activate(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
        previous: Option<&str>,
    ) -> Result<(), DriverError> {
        let previous = previous.filter(|_| self.1 != Fault::KeepsPrevious);
        self.0.activate(rev, spec, launch_env, previous).await
    }
    async fn start(
        &self,
        rev: RevisionRef<'_>,
        spec: &Spec,
        launch_env: &LaunchEnv,
    ) -> Result<(), DriverError> {
        let dropped = LaunchEnv::new();
        let env = match self.1 {
            Fault::DropsLaunchEnvOnStart => &dropped,
            Fault::KeepsPrevious => launch_env,
        };
        self.0.start(rev, spec, env).await
    }
    async fn resume(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.resume(rev).await
    }
    async fn stop(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.stop(rev).await
    }
    async fn retire(&self, rev: RevisionRef<'_>) -> Result<(), DriverError> {
        self.0.retire(rev).await
    }
    async fn observe(&self) -> Result<Observed, DriverError> {
        self.0.observe().await
    }
}

#[tokio::test]
async fn the_kit_names_the_rule_a_driver_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    let driver = Misbehaving(sim, Fault::KeepsPrevious);
    let err = Kit::new(&driver, "kit", spec()).run().await.unwrap_err();
    assert!(
        matches!(err, ContractError::Broken { rule, .. } if rule == "activate stops the previous revision"),
        "{err}"
    );
}

#[tokio::test]
async fn the_kit_sees_a_launch_env_that_does_not_reach_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    let driver = Misbehaving(sim, Fault::DropsLaunchEnvOnStart);
    let probe = SimEnv(&driver.0);
    let kit = Kit::new(&driver, "kit", spec_with_env()).with_env_probe(&probe);
    let err = kit.launch_env_reaches_the_workload().await.unwrap_err();
    assert!(
        matches!(&err, ContractError::Broken { rule, what }
            if *rule == "the launch environment reaches the workload"
                && what.contains("started with L2")),
        "{err}"
    );
    // Without a probe the calls still succeed: only the probe can tell.
    let dir = tempfile::tempdir().unwrap();
    let sim = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    let driver = Misbehaving(sim, Fault::DropsLaunchEnvOnStart);
    Kit::new(&driver, "kit", spec_with_env())
        .run()
        .await
        .unwrap();
}

#[test]
fn the_default_config_declares_the_sims_historical_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let config: SimConfig = serde_json::from_str("{}").unwrap();
    let caps = SimDriver::open(dir.path(), config).unwrap().capabilities();
    assert_eq!(
        caps,
        Capabilities {
            manages_lifecycle: true,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
            probes: true,
        }
    );
}

#[test]
fn any_capability_set_can_be_declared_from_config() {
    let dir = tempfile::tempdir().unwrap();
    let config: SimConfig = serde_json::from_str(
        r#"{"manages_lifecycle":false,"reports_exits":true,"restarts_exits":true,"reaps_orphans":true,"probes":false}"#,
    )
    .unwrap();
    let caps = SimDriver::open(dir.path(), config).unwrap().capabilities();
    assert_eq!(
        caps,
        Capabilities {
            manages_lifecycle: false,
            reports_exits: true,
            restarts_exits: true,
            reaps_orphans: true,
            probes: false,
        }
    );
    assert!(SimConfig::declaring(caps).reports_exits);
}

#[tokio::test]
async fn exits_and_stops_are_reported_to_the_feed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = running(dir.path(), reporting()).await;
    let (tx, mut rx) = mpsc::channel(8);
    let feed = sim.watch_exits(tx);
    tokio::pin!(feed);
    let exit = tokio::select! {
        ended = &mut feed => panic!("the feed ended: {ended:?}"),
        exit = async {
            bounded("the feed to watch", sim.watched()).await;
            sim.exit(rev("r1"), 3).unwrap();
            bounded("r1's exit", rx.recv()).await
        } => exit.unwrap(),
    };
    assert_eq!(
        exit,
        Exit {
            namespace: "ns".into(),
            workload: "web".into(),
            revision: "r1".into(),
            exit_code: Some(3),
        }
    );
    let r1 = sim.host().revisions["ns/web@r1"].clone();
    assert_eq!((r1.state, r1.exit_code), (BackendState::Stopped, Some(3)));
    sim.resume(rev("r1")).await.unwrap();
    sim.stop(rev("r1")).await.unwrap();
    sim.stop(rev("r1")).await.unwrap();
    let stopped = tokio::select! {
        ended = &mut feed => panic!("the feed ended: {ended:?}"),
        exit = bounded("r1's stop", rx.recv()) => exit.unwrap(),
    };
    assert_eq!(stopped.exit_code, None, "a stop has no status of its own");
    assert!(
        rx.try_recv().is_err(),
        "stopping a stopped revision is no exit"
    );
    drop(rx);
    bounded("the feed to end", feed).await.unwrap();
}

#[tokio::test]
async fn a_broken_feed_ends_with_an_error_and_a_new_feed_gets_the_later_exits() {
    let dir = tempfile::tempdir().unwrap();
    let sim = running(dir.path(), reporting()).await;
    let (tx, mut rx) = mpsc::channel(8);
    let feed = sim.watch_exits(tx.clone());
    tokio::pin!(feed);
    tokio::select! {
        ended = &mut feed => panic!("the feed ended: {ended:?}"),
        () = bounded("the feed to watch", sim.watched()) => {}
    }
    sim.break_exit_feeds();
    let err = bounded("the broken feed to end", feed).await.unwrap_err();
    assert_eq!(err.code(), capstan_common::ErrorCode::DriverFailed, "{err}");
    let again = sim.watch_exits(tx);
    tokio::pin!(again);
    let exit = tokio::select! {
        ended = &mut again => panic!("the new feed ended: {ended:?}"),
        exit = async {
            bounded("the new feed to watch", sim.watched()).await;
            sim.exit(rev("r1"), 3).unwrap();
            bounded("r1's exit", rx.recv()).await
        } => exit.unwrap(),
    };
    assert_eq!(exit.exit_code, Some(3));
}

#[tokio::test]
async fn a_sim_that_does_not_report_exits_has_no_feed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = running(dir.path(), SimConfig::default()).await;
    let (tx, mut rx) = mpsc::channel(8);
    sim.watch_exits(tx).await.unwrap();
    sim.exit(rev("r1"), 1).unwrap();
    assert_eq!(bounded("the closed feed", rx.recv()).await, None);
    assert_eq!(
        sim.host().revisions["ns/web@r1"].state,
        BackendState::Stopped
    );
}

#[tokio::test]
async fn a_scripted_failure_can_leave_the_backend_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = SimConfig {
        failures: vec![ScriptedFailure {
            op: "start".into(),
            revision: Some("r1".into()),
            times: Some(1),
            gives_up: Some("start-limit-hit".into()),
            ..ScriptedFailure::default()
        }],
        ..SimConfig::default()
    };
    let sim = running(dir.path(), config).await;
    sim.exit(rev("r1"), 1).unwrap();
    let err = sim.resume(rev("r1")).await.unwrap_err();
    assert!(matches!(err, DriverError::Scripted { .. }), "{err}");
    let failed = BackendState::Failed {
        reason: "start-limit-hit".into(),
    };
    assert_eq!(sim.state(rev("r1")).await.unwrap(), Some(failed.clone()));
    let reopened = SimDriver::open(dir.path(), SimConfig::default()).unwrap();
    assert_eq!(
        reopened.state(rev("r1")).await.unwrap(),
        Some(failed),
        "kept in the host file"
    );
    sim.start(rev("r1"), &spec(), &LaunchEnv::new())
        .await
        .unwrap();
    let r1 = sim.host().revisions["ns/web@r1"].clone();
    assert_eq!((r1.state, r1.starts), (BackendState::Running, 2));
}

#[tokio::test]
async fn give_up_marks_the_revision_failed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = running(dir.path(), SimConfig::default()).await;
    sim.give_up(rev("r1"), "crash-loop").unwrap();
    let observed = sim.observe().await.unwrap();
    assert_eq!(
        observed.revision("ns", "web", "r1"),
        Some(&BackendState::Failed {
            reason: "crash-loop".into()
        })
    );
    assert!(matches!(
        sim.give_up(rev("r9"), "x"),
        Err(DriverError::Missing { .. })
    ));
}

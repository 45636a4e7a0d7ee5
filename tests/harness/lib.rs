//! Harness for capstan's end-to-end tests (the `e2e` test binary, `tests/e2e/`).
//!
//! - [`agent::Agent`]: the one way a test gets an agent — its own temp dir, config
//!   (driver, [`hooks::Hook`] scripts, NATS, signing) written by
//!   [`agent::AgentBuilder`], the CLI (`apply`, `log`, `intent`) and `run` daemons.
//! - [`command`]: the JSON command lines (`Commands::ensure_namespace`, `prepare` with
//!   a [`command::Spec`], `activate`, …).
//! - [`process::Process`]: every long-running child (agent daemons, nats-server,
//!   coordinators). Its `stop()`/`kill()` assert how the child exited; dropping it
//!   SIGKILLs a child that still runs, without asserting.
//! - [`wait_until`]: the one readiness wait (a log line, a file, a record, a port).
//! - [`external::SimDriver`]: the standalone sim driver process (`capstan-sim-driver`)
//!   an agent with `driver = "external"` talks to over its socket.
//! - [`docker`], [`nats`]: the real dockerd and nats-server the tests drive.
//! - [`docs`]: the documentation as the docs tests read it (fenced blocks, inline
//!   code, tables, marked sections) and what the binaries say back (`--help`, the
//!   config keys their parsers take).
//! - [`systemd::SystemdHost`]: a real systemd per test, as PID 1 of its own PID and
//!   mount namespace, and [`systemd::envdump`], the workload that the systemd tests
//!   run in it (the `capstan-envdump` binary of this crate, [`envdump::main`]).
//! - [`fleet::Fleet`]: a fleet of real Debian hosts ([`fleet::FleetHost`]), each with
//!   systemd as PID 1 of its own PID, mount, net and UTS namespace, on an overlay of
//!   the cached rootfs of `.ci/rootfs.sh`, reachable over SSH on a veth of its own.
//! - [`kube::KubeCluster`]: a real Kubernetes control plane per test (etcd,
//!   kube-apiserver with RBAC, kube-controller-manager from `.ci/kube.sh`) and the
//!   node stand-in ([`kube::node`]) that marks pods Running/Ready.
//! - [`pid1`]: what both kinds of host share: one boot of systemd as PID 1 of new
//!   namespaces, the host's own cgroups, the sweep of what dead test binaries left.

pub mod agent;
pub mod command;
pub mod docker;
pub mod docs;
pub mod envdump;
pub mod external;
pub mod fleet;
pub mod hooks;
pub mod kube;
pub mod nats;
pub mod pid1;
pub mod process;
pub mod systemd;
pub mod vm;
pub mod watchdog;

use std::collections::HashSet;
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long any readiness wait may take before the test fails: a guard against
/// hanging for ever on a broken build, never a timing assertion.
pub const READY: Duration = Duration::from_secs(120);

/// What a [`wait_until`] condition returns: `true`/`Some(v)` once it holds.
pub trait Ready {
    type Output;
    fn ready(self) -> Option<Self::Output>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// Polls `condition` until it holds (`true`, or `Some(v)`: then returns `v`); panics
/// naming `what` once `timeout` has passed. `what` is formatted only then, so it can
/// show the state at that moment (see `process::Process`).
#[track_caller]
pub fn wait_until<R: Ready>(
    what: impl Display,
    timeout: Duration,
    mut condition: impl FnMut() -> R,
) -> R::Output {
    watchdog::watch();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = condition().ready() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The directory holding the workspace's built binaries (`target/<profile>`), seen
/// from a test binary (`target/<profile>/deps/<test>`) or a workspace binary
/// (`target/<profile>/<bin>`, e.g. `capstan-bench`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("the binary's dir");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("target dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The path of workspace binary `name`, which must have been built
/// (`cargo build --workspace --bins`; `scripts/test.sh` does it).
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (the README's test command does)",
        path.display()
    );
    path
}

/// Builds the .deb packages from this build's binaries into `out`
/// (`packaging/deb/build.sh --bin-dir <bin_dir()> --out OUT`); returns their paths,
/// capstan-agent's first.
pub fn build_packages(out: &std::path::Path) -> Vec<PathBuf> {
    build_packages_as(out, None)
}

/// [`build_packages`], with the packages' version set to `version` when given
/// (`build.sh --version`): the same binaries as another version, for upgrades.
pub fn build_packages_as(out: &std::path::Path, version: Option<&str>) -> Vec<PathBuf> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/deb/build.sh");
    let mut build = std::process::Command::new(&script);
    build.arg("--bin-dir").arg(bin_dir()).arg("--out").arg(out);
    if let Some(version) = version {
        build.arg("--version").arg(version);
    }
    let done = build.output().expect("run packaging/deb/build.sh");
    assert!(
        done.status.success(),
        "build.sh: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    String::from_utf8_lossy(&done.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// `name` made unique on this machine (`<name><pid>`: a DNS label when `name` is one),
/// for anything shared between tests and test runs: docker hosts, namespaces,
/// containers. Panics when two tests of this binary ask for the same name.
pub fn unique(name: &str) -> String {
    static TAKEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = taken
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string());
    assert!(fresh, "two tests use the unique name {name:?}");
    format!("{name}{}", std::process::id())
}

/// A loopback TCP port nothing listens on now (bound, then let go): for a workload to
/// listen on, or a probe to find closed. Another process may take it meanwhile; the
/// kernel hands out ephemeral ports in turn, so that is rare.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address").port()
}

/// Parses JSON lines, panicking on any line that is not JSON.
pub fn parse_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// A small deterministic PRNG (xorshift64*), seeded per test and printed so that a
/// failing run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn from_env_or_time(name: &str) -> Rng {
        let seed = std::env::var("CAPSTAN_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as u64
            });
        eprintln!("{name}: seed {seed} (set CAPSTAN_TEST_SEED={seed} to repeat)");
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What `.ci/<script>` prints on stdout, trimmed: the path of something it builds or
/// installs once and caches (`rootfs.sh`, `schemathesis.sh`), making it first on a
/// machine without it (its progress goes to the test's stderr).
pub fn ci_script(script: &str) -> PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.ci")
        .join(script);
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed", script.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

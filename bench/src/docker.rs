//! `docker`: 20 revisions (`--units`) prepared and activated through the agent's
//! executor with the real docker driver, against `docker run -d` of the same image,
//! command, network and labels the same number of times, on the same engine
//! (`$DOCKER_HOST`, as `.ci/services.sh` exports it), in the same run; `--rounds`
//! rounds, the median reported. A counting pass through [`EngineProxy`] then tells
//! the engine requests one activation costs and one `docker run -d` costs. Skipped
//! (with the reason) without an engine or the `docker` CLI.

use crate::apply::{command, succeeded};
use crate::engine_proxy::EngineProxy;
use crate::replay::median;
use crate::roundtrip::round;
use crate::Args;
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogOptions};
use capstan_common::{DriverKind, Op, Spec};
use capstan_docker::{DockerConfig, DockerDriver};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The image `.ci/services.sh` builds in its engines.
const IMAGE: &str = "capstan-test/busybox:1";
/// Runs until SIGTERM (then exits 0), like the e2e tests' `serve`.
const ARGV: [&str; 3] = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"];

pub async fn run(args: &Args) -> anyhow::Result<()> {
    let Some(socket) = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|s| s.starts_with("unix://"))
    else {
        println!("docker        skipped: DOCKER_HOST is not a unix:// engine socket (eval \"$(.ci/services.sh)\")");
        return Ok(());
    };
    if let Some(why) = crate::needs::tools(&["docker"]) {
        println!("docker        skipped: {why}");
        return Ok(());
    }
    let bench = Bench::new(&socket)?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        // Alternating who goes first, so neither always meets a warmer engine.
        let mut pair = [None, None];
        for side in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
            pair[side] = Some(match side {
                0 => bench.activations(&socket, r, args.units).await?,
                _ => bench.docker_runs(r, args.units).await?,
            });
        }
        let [Some(a), Some(b)] = pair else {
            unreachable!("both sides ran")
        };
        ours.push(a.as_secs_f64() * 1e3);
        theirs.push(b.as_secs_f64() * 1e3);
    }
    let calls = bench.count(&socket).await?;
    let (ms, baseline) = (median(&mut ours), median(&mut theirs));
    println!(
        "{}",
        json!({
            "bench": "docker",
            "revisions": args.units,
            "rounds": args.rounds,
            "ms": round(ms),
            "each_round_ms": ours.iter().map(|x| round(*x)).collect::<Vec<_>>(),
            "engine_requests_per_activation": calls.ours,
            "baseline": {
                "what": format!("{} x docker run -d, same image, command, network, labels", args.units),
                "ms": round(baseline),
                "each_round_ms": theirs.iter().map(|x| round(*x)).collect::<Vec<_>>(),
                "engine_requests_per_run": calls.theirs,
            },
            "ratio": round(ms / baseline),
            "target": "ratio <= 1.2",
        })
    );
    Ok(())
}

/// What one activation and one `docker run -d` asked of the engine, request by request.
struct Calls {
    ours: BTreeMap<String, usize>,
    theirs: BTreeMap<String, usize>,
}

/// One run of the measurement: its host name (unique, so its containers and
/// networks are its own; every namespace starts with it), its logs' directory.
struct Bench {
    host: String,
    dir: tempfile::TempDir,
    socket: String,
}

impl Bench {
    fn new(socket: &str) -> anyhow::Result<Bench> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        Ok(Bench {
            host: format!("bench{}t{}", std::process::id(), nanos.subsec_nanos()),
            dir: tempfile::tempdir()?,
            socket: socket.to_string(),
        })
    }

    /// An executor on a fresh log and the docker driver at `socket`, its namespace
    /// `ns` ensured (not timed).
    async fn executor(&self, socket: &str, ns: &str) -> anyhow::Result<Executor> {
        let config = DockerConfig {
            socket: socket.to_string(),
            ..Default::default()
        };
        let driver = Arc::new(DockerDriver::connect(&self.host, config).await?);
        let log = self.dir.path().join(format!("log-{ns}-{}", socket.len()));
        let log = Arc::new(Log::open(&log, LogOptions::default())?);
        let executor = Executor::new(self.host.clone(), log, driver);
        let op = Op::EnsureNamespace {
            namespace: ns.into(),
        };
        succeeded(&executor, self.command(format!("{ns}.ns"), op)).await?;
        Ok(executor)
    }

    fn command(&self, id: String, op: Op) -> capstan_common::Command {
        let mut c = command(id, op);
        c.host = self.host.clone();
        c
    }

    /// `n` workloads of a namespace of round `round` prepared and activated, one after another.
    async fn activations(&self, socket: &str, round: usize, n: usize) -> anyhow::Result<Duration> {
        let ns = format!("{}r{round}", self.host);
        let executor = self.executor(socket, &ns).await?;
        let t = Instant::now();
        self.activate(&executor, &ns, 0..n).await?;
        let took = t.elapsed();
        self.clean()?;
        Ok(took)
    }

    async fn activate(
        &self,
        executor: &Executor,
        ns: &str,
        workloads: std::ops::Range<usize>,
    ) -> anyhow::Result<()> {
        for w in workloads {
            let (workload, revision) = (format!("w{w}"), "r1".to_string());
            let spec = Spec {
                driver: DriverKind::DOCKER,
                image: Some(IMAGE.into()),
                command: ARGV.iter().map(|s| s.to_string()).collect(),
                ..crate::apply::spec()
            };
            let prepare = Op::PrepareRevision {
                namespace: ns.into(),
                workload: workload.clone(),
                revision: revision.clone(),
                spec,
            };
            succeeded(executor, self.command(format!("{ns}.{w}.p"), prepare)).await?;
            let activate = Op::ActivateRevision {
                namespace: ns.into(),
                workload,
                revision,
            };
            succeeded(executor, self.command(format!("{ns}.{w}.a"), activate)).await?;
        }
        Ok(())
    }

    /// `n` × `docker run -d` on the engine at `socket`, into the capstan network of a
    /// namespace of round `round` (made by an executor beforehand, not timed).
    async fn docker_runs(&self, round: usize, n: usize) -> anyhow::Result<Duration> {
        let ns = format!("{}d{round}", self.host);
        self.executor(&self.socket, &ns).await?;
        let t = Instant::now();
        for w in 0..n {
            self.docker_run(&self.socket, &ns, w)?;
        }
        let took = t.elapsed();
        self.clean()?;
        Ok(took)
    }

    fn docker_run(&self, socket: &str, ns: &str, w: usize) -> anyhow::Result<()> {
        let wl = format!("w{w}");
        let out = Command::new("docker")
            .args(["-H", socket, "run", "-d", "--restart", "no"])
            .args(["--name", &format!("{ns}-{wl}-base")])
            .args([
                "--network",
                &format!("capstan-{ns}"),
                "--network-alias",
                &wl,
            ])
            .args(["--label", &format!("io.capstan.bench={}", self.host)])
            .args(["--label", &format!("io.capstan.workload={wl}")])
            .arg(IMAGE)
            .args(ARGV)
            .output()?;
        anyhow::ensure!(out.status.success(), "docker run: {out:?}");
        Ok(())
    }

    /// Removes every container and network this run made (by label, either side).
    fn clean(&self) -> anyhow::Result<()> {
        for label in ["io.capstan.host", "io.capstan.bench"] {
            let filter = format!("label={label}={}", self.host);
            let ids = self.cli(&["ps", "-aq", "--filter", &filter])?;
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                self.cli(&[&["rm", "-f"][..], &ids].concat())?;
            }
        }
        let filter = format!("label=io.capstan.host={}", self.host);
        let nets = self.cli(&["network", "ls", "-q", "--filter", &filter])?;
        let nets: Vec<&str> = nets.split_whitespace().collect();
        if !nets.is_empty() {
            self.cli(&[&["network", "rm"][..], &nets].concat())?;
        }
        Ok(())
    }

    fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("docker")
            .args(["-H", &self.socket])
            .args(args)
            .output()?;
        anyhow::ensure!(out.status.success(), "docker {args:?}: {out:?}");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One activation and one `docker run -d` through the counting proxy.
    async fn count(&self, socket: &str) -> anyhow::Result<Calls> {
        let upstream = socket.strip_prefix("unix://").expect("a unix socket");
        let proxy = EngineProxy::start(&self.dir.path().join("count.sock"), upstream.as_ref())?;
        let ns = &format!("{}c", self.host);
        let executor = self.executor(&proxy.url(), ns).await?;
        proxy.take();
        self.activate(&executor, ns, 0..1).await?;
        let ours = tally(proxy.take());
        let url = proxy.url();
        tokio::task::block_in_place(|| self.docker_run(&url, ns, 1))?;
        let theirs = tally(proxy.take());
        self.clean()?;
        Ok(Calls { ours, theirs })
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Err(e) = self.clean() {
            eprintln!("docker bench: cleaning up: {e:#}");
        }
    }
}

/// Requests by kind (ids replaced by `{id}`), with a `total`.
fn tally(lines: Vec<String>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    out.insert("total".to_string(), lines.len());
    for line in lines {
        let kind: Vec<&str> = line
            .split('/')
            .map(|part| {
                if part.len() >= 12 && part.bytes().all(|b| b.is_ascii_hexdigit()) {
                    "{id}"
                } else {
                    part
                }
            })
            .collect();
        *out.entry(kind.join("/")).or_default() += 1;
    }
    out
}

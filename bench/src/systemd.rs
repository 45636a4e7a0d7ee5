//! `systemd`: an env change and restart of N units on one host, through the systemd
//! driver vs a script doing the same with `systemctl`, on one freshly booted real
//! systemd ([`SystemdHost`]) holding both sets of units.
//!
//! Per round, each side gives every one of its units a new launch env `T=opaque-…`:
//!
//! - **capstan, concurrent**: N workloads, prepared and activated once (setup, not
//!   timed), then activated all at once through [`SystemdDriver::activate`] (it writes
//!   the env drop-in, shares reloads between concurrent activations, restarts); timed
//!   until every activation returned, with the reloads it took.
//! - **capstan, one after another**: the same, each activation awaited before the next
//!   (what sharing reloads and concurrency buy).
//! - **systemctl script** (the baseline): N plain units of the bench's own (the same
//!   `ExecStart=` workload, none of capstan's unit settings), and per unit, one after
//!   another: write its drop-in, `systemctl daemon-reload`, `systemctl restart`,
//!   `systemctl is-active`. `systemctl` runs inside the host's namespaces through
//!   `nsenter` (as the test harness does): a fork+exec per call, which a local script
//!   pays for `systemctl` anyway.
//!
//! After every round (not timed) each unit must be active and its process must have
//! seen the new value (the `capstan-envdump` dump file). The median of the rounds is
//! reported.

use crate::Args;
use anyhow::Context as _;
use capstan_common::{DriverKind, Spec};
use capstan_driver::{Driver, LaunchEnv, RevisionRef};
use capstan_systemd::{naming, SystemdConfig, SystemdDriver};
use capstan_tests::systemd::SystemdHost;
use capstan_tests::{wait_until, READY};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NAMESPACE: &str = "bench";
const REVISION: &str = "r1";
const SYSTEMD: &str = "/usr/lib/systemd/systemd";

/// Why the measurement cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if !Path::new(SYSTEMD).exists() {
        return Some(format!("{SYSTEMD} is not installed"));
    }
    crate::needs::root_and_tools(
        "it boots a systemd in its own PID and mount namespace",
        &["unshare", "nsenter", "setpriv", "systemctl", "journalctl"],
    )
}

/// One round's figures.
struct Round {
    concurrent: Duration,
    concurrent_reloads: u64,
    sequential: Duration,
    sequential_reloads: u64,
    script: Duration,
}

pub fn run(args: &Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    if let Some(why) = unavailable() {
        println!("systemd       skipped: {why}");
        return Ok(());
    }
    let n = args.units;
    // The units run a copy of this binary, as `capstan-envdump` (see main.rs).
    let host = SystemdHost::boot_with(&std::env::current_exe()?);
    let capstan = Capstan::set_up(&host, runtime, n)?;
    let script = Script::set_up(&host, n)?;

    let mut rounds = Vec::new();
    for round in 1..=args.rounds {
        let value = format!("opaque-c{round}");
        let (concurrent, concurrent_reloads) = capstan.round(runtime, &value, true)?;
        capstan.verify(&host, &value)?;
        let value = format!("opaque-s{round}");
        let (sequential, sequential_reloads) = capstan.round(runtime, &value, false)?;
        capstan.verify(&host, &value)?;
        let value = format!("opaque-b{round}");
        let script_time = script.round(&host, &value)?;
        script.verify(&host, &value)?;
        println!(
            "systemd       round {round}: capstan {:>7.1} ms ({concurrent_reloads} reloads)   \
             capstan one by one {:>7.1} ms ({sequential_reloads} reloads)   systemctl script {:>7.1} ms",
            ms(concurrent),
            ms(sequential),
            ms(script_time)
        );
        rounds.push(Round {
            concurrent,
            concurrent_reloads,
            sequential,
            sequential_reloads,
            script: script_time,
        });
    }
    let concurrent = median(rounds.iter().map(|r| r.concurrent));
    let sequential = median(rounds.iter().map(|r| r.sequential));
    let script_time = median(rounds.iter().map(|r| r.script));
    let reloads = |f: fn(&Round) -> u64| -> String {
        let all: Vec<String> = rounds.iter().map(|r| f(r).to_string()).collect();
        all.join("/")
    };
    println!(
        "systemd       env change + restart of {n} units, median of {}: capstan {:>7.1} ms \
         ({} reloads/round)   systemctl script {:>7.1} ms   ratio {:.1}x faster",
        rounds.len(),
        ms(concurrent),
        reloads(|r| r.concurrent_reloads),
        ms(script_time),
        ratio(script_time, concurrent)
    );
    println!(
        "systemd       capstan one unit after another: {:>7.1} ms ({} reloads/round)   \
         vs script {:.1}x faster; all at once is {:.1}x faster than one by one",
        ms(sequential),
        reloads(|r| r.sequential_reloads),
        ratio(script_time, sequential),
        ratio(sequential, concurrent)
    );
    println!(
        "systemd       (the script runs each systemctl through nsenter: a fork+exec per \
         call, which a local script pays for `systemctl` anyway)"
    );
    costs(&host, runtime, &capstan, &script)?;
    drop(capstan);
    drop(host);
    Ok(())
}

/// What one step of either side costs on this host, each the median of a few tries
/// (not part of the rounds): where the rounds' time goes.
fn costs(
    host: &SystemdHost,
    runtime: &tokio::runtime::Runtime,
    capstan: &Capstan,
    script: &Script,
) -> anyhow::Result<()> {
    const TRIES: usize = 5;
    let time = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<Duration> {
        let mut all = Vec::new();
        for _ in 0..TRIES {
            let t = Instant::now();
            f()?;
            all.push(t.elapsed());
        }
        Ok(median(all.into_iter()))
    };
    let bus = capstan.driver.bus();
    let reload = time(&mut || {
        runtime.block_on(bus.reload_covering(bus.files_changed()))?;
        Ok(())
    })?;
    let scratch = host.unit_dir().join(".capstan-bench-scratch");
    let mut i = 0;
    let write = time(&mut || {
        i += 1;
        use capstan_systemd::files;
        files::write_if_changed(&scratch, &format!("{i}\n"), files::UNIT)?;
        Ok(())
    })?;
    std::fs::remove_file(&scratch)?;
    let (workload, _) = &capstan.workloads[0];
    let status = time(&mut || {
        runtime
            .block_on(capstan.driver.state(rev(workload)))
            .map_err(|e| anyhow::anyhow!("state: {}", e.report()))?;
        Ok(())
    })?;
    let restart_ours = time(&mut || {
        runtime.block_on(bus.restart(&capstan.units[0]))?;
        Ok(())
    })?;
    let restart_plain = time(&mut || {
        runtime.block_on(bus.restart(&script.units[0]))?;
        Ok(())
    })?;
    let all_at_once = |units: &[String]| -> anyhow::Result<()> {
        runtime.block_on(async {
            let tasks: Vec<_> = units
                .iter()
                .map(|unit| {
                    let (driver, unit) = (Arc::clone(&capstan.driver), unit.clone());
                    tokio::spawn(async move { driver.bus().restart(&unit).await })
                })
                .collect();
            for task in tasks {
                task.await??;
            }
            anyhow::Ok(())
        })
    };
    let restart_all_ours = time(&mut || all_at_once(&capstan.units))?;
    let restart_all_plain = time(&mut || all_at_once(&script.units))?;
    let nsenter = time(&mut || {
        systemctl(host, &["is-active", &script.units[0]])?;
        Ok(())
    })?;
    println!(
        "systemd       one step (median of {TRIES}): Reload {:.1} ms   drop-in write+fsync {:.1} ms   \
         unit state over D-Bus {:.1} ms   RestartUnit of a capstan unit {:.1} ms, of a plain unit \
         {:.1} ms   systemctl is-active through nsenter {:.1} ms",
        ms(reload),
        ms(write),
        ms(status),
        ms(restart_ours),
        ms(restart_plain),
        ms(nsenter)
    );
    println!(
        "systemd       {n} RestartUnit at once (no reload, median of {TRIES}): capstan units \
         {:.1} ms   plain units {:.1} ms",
        ms(restart_all_ours),
        ms(restart_all_plain),
        n = capstan.units.len()
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(slow: Duration, fast: Duration) -> f64 {
    slow.as_secs_f64() / fast.as_secs_f64()
}

fn median(times: impl Iterator<Item = Duration>) -> Duration {
    let mut all: Vec<Duration> = times.collect();
    all.sort();
    all[all.len() / 2]
}

/// Waits until each dump file shows `T=value`, then checks every unit is active.
fn verify(
    host: &SystemdHost,
    dumps: &[PathBuf],
    units: &[String],
    value: &str,
) -> anyhow::Result<()> {
    for path in dumps {
        wait_until(
            format_args!("{} to show T={value}", path.display()),
            READY,
            || {
                let text = std::fs::read_to_string(path).ok()?;
                let seen: serde_json::Value = serde_json::from_str(&text).ok()?;
                (seen["env"]["T"] == value).then_some(())
            },
        );
    }
    let mut command = vec!["is-active"];
    command.extend(units.iter().map(String::as_str));
    let out = host.systemctl(&command);
    let states = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success() && states.lines().all(|s| s == "active"),
        "not every unit is active: {states}\n{}",
        host.log()
    );
    Ok(())
}

/// The driver's side: N workloads of one namespace.
struct Capstan {
    driver: Arc<SystemdDriver>,
    workloads: Vec<(String, Spec)>,
    dumps: Vec<PathBuf>,
    units: Vec<String>,
}

fn rev(workload: &str) -> RevisionRef<'_> {
    RevisionRef {
        namespace: NAMESPACE,
        workload,
        revision: REVISION,
    }
}

fn launch_env(value: &str) -> LaunchEnv {
    LaunchEnv::from([("T".to_string(), value.to_string())])
}

impl Capstan {
    /// Prepares and activates the workloads (`T=opaque-setup`), and checks they run.
    fn set_up(
        host: &SystemdHost,
        runtime: &tokio::runtime::Runtime,
        n: usize,
    ) -> anyhow::Result<Capstan> {
        let config = SystemdConfig {
            bus: Some(host.bus_address()),
            unit_dir: host.unit_dir(),
            state_dir: host.state_dir(),
            // Every round restarts every unit twice: no start rate limit.
            start_limit_interval_secs: 0,
            ..SystemdConfig::default()
        };
        let driver = runtime
            .block_on(SystemdDriver::connect("bench", config))
            .map_err(|e| anyhow::anyhow!("connect to the host's systemd: {}", e.report()))?;
        let mut capstan = Capstan {
            driver: Arc::new(driver),
            workloads: Vec::new(),
            dumps: Vec::new(),
            units: Vec::new(),
        };
        for i in 0..n {
            let workload = format!("w{i:03}");
            let dump = host
                .state_dir()
                .join(NAMESPACE)
                .join(format!("{workload}.json"));
            let spec = Spec {
                driver: DriverKind::SYSTEMD,
                command: vec![
                    host.envdump().to_string_lossy().into_owned(),
                    dump.to_string_lossy().into_owned(),
                ],
                ..Default::default()
            };
            capstan.units.push(naming::unit_name(rev(&workload)));
            // The namespace's state directory resolves inside the host only.
            capstan.dumps.push(host.inside(&dump));
            capstan.workloads.push((workload, spec));
        }
        runtime
            .block_on(async {
                capstan.driver.ensure_namespace(NAMESPACE).await?;
                for (workload, spec) in &capstan.workloads {
                    capstan.driver.prepare(rev(workload), spec).await?;
                }
                Ok::<_, capstan_driver::DriverError>(())
            })
            .map_err(|e| anyhow::anyhow!("set up: {}", e.report()))?;
        capstan.round(runtime, "opaque-setup", true)?;
        capstan.verify(host, "opaque-setup")?;
        Ok(capstan)
    }

    /// Activates every workload with `T=value`, all at once or one after another;
    /// returns the time until all returned and the reloads they took.
    fn round(
        &self,
        runtime: &tokio::runtime::Runtime,
        value: &str,
        concurrent: bool,
    ) -> anyhow::Result<(Duration, u64)> {
        let reloads = self.driver.bus().reloads();
        let env = launch_env(value);
        let started = Instant::now();
        runtime.block_on(async {
            if concurrent {
                let tasks: Vec<_> = self
                    .workloads
                    .iter()
                    .map(|(workload, spec)| {
                        let (driver, env) = (Arc::clone(&self.driver), env.clone());
                        let (workload, spec) = (workload.clone(), spec.clone());
                        tokio::spawn(async move {
                            driver
                                .activate(rev(&workload), &spec, &env, None)
                                .await
                                .map_err(|e| anyhow::anyhow!("activate: {}", e.report()))
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await??;
                }
            } else {
                for (workload, spec) in &self.workloads {
                    self.driver
                        .activate(rev(workload), spec, &env, None)
                        .await
                        .map_err(|e| anyhow::anyhow!("activate: {}", e.report()))?;
                }
            }
            anyhow::Ok(())
        })?;
        Ok((started.elapsed(), self.driver.bus().reloads() - reloads))
    }

    fn verify(&self, host: &SystemdHost, value: &str) -> anyhow::Result<()> {
        verify(host, &self.dumps, &self.units, value).context("capstan's units")
    }
}

/// The baseline's side: N plain units and a script's steps.
struct Script {
    units: Vec<String>,
    dumps: Vec<PathBuf>,
}

impl Script {
    /// Writes the units (`T=opaque-setup`), reloads once, starts them and checks they
    /// run.
    fn set_up(host: &SystemdHost, n: usize) -> anyhow::Result<Script> {
        let dir = host.state_dir().join("script");
        std::fs::create_dir_all(&dir)?;
        let mut script = Script {
            units: Vec::new(),
            dumps: Vec::new(),
        };
        for i in 0..n {
            let unit = format!("bench-script-{i:03}.service");
            let dump = dir.join(format!("{i:03}.json"));
            let text = format!(
                "[Unit]\nDescription=capstan-bench systemctl script unit {i}\n\
                 StartLimitIntervalSec=0\n\n[Service]\nType=exec\nExecStart={} {}\n",
                host.envdump().display(),
                dump.display()
            );
            std::fs::write(host.unit_dir().join(&unit), text)?;
            script.write_env(host, &unit, "opaque-setup")?;
            script.units.push(unit);
            script.dumps.push(dump);
        }
        systemctl(host, &["daemon-reload"])?;
        let mut start = vec!["start"];
        start.extend(script.units.iter().map(String::as_str));
        systemctl(host, &start)?;
        script.verify(host, "opaque-setup")?;
        Ok(script)
    }

    /// The drop-in, written as a script would (`cat > …`: no fsync).
    fn write_env(&self, host: &SystemdHost, unit: &str, value: &str) -> anyhow::Result<()> {
        let dir = host.unit_dir().join(format!("{unit}.d"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("env.conf"),
            format!("[Service]\nEnvironment=T={value}\n"),
        )?;
        Ok(())
    }

    /// Per unit, one after another: drop-in, daemon-reload, restart, is-active.
    fn round(&self, host: &SystemdHost, value: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for unit in &self.units {
            self.write_env(host, unit, value)?;
            systemctl(host, &["daemon-reload"])?;
            systemctl(host, &["restart", unit])?;
            let state = systemctl(host, &["is-active", unit])?;
            anyhow::ensure!(state.trim() == "active", "{unit} is {state}");
        }
        Ok(started.elapsed())
    }

    fn verify(&self, host: &SystemdHost, value: &str) -> anyhow::Result<()> {
        verify(host, &self.dumps, &self.units, value).context("the script's units")
    }
}

/// `systemctl ARGS` in the host (through `nsenter`), which must succeed; its stdout.
fn systemctl(host: &SystemdHost, args: &[&str]) -> anyhow::Result<String> {
    let out = host.systemctl(args);
    anyhow::ensure!(
        out.status.success(),
        "systemctl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

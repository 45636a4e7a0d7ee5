//! `capstan-agent run` (the daemon) and `capstan-agent sim-fleet` (many simulated
//! hosts in one process).

use crate::context::{explain, policy, setup, Context};
use crate::signal::{stop_signal, Stop};
use capstan_agent::config::ShutdownMode;
use capstan_agent::metrics;
use capstan_agent::sim_fleet::{self, FleetOptions};
use capstan_common::service;
use std::process::ExitCode;

pub(crate) async fn run(ctx: &Context, leave_running: bool) -> anyhow::Result<ExitCode> {
    // Config errors first, before anything is touched.
    let policy = policy(ctx)?;
    // Then the metrics address: one in use stops the start before anything is opened.
    let metrics = match ctx.config.resolved().metrics_listen {
        Some(addr) => Some(metrics::serve::bind(addr).await?),
        None => None,
    };
    // First, so that a SIGTERM during startup is handled after it, not fatal.
    let mut stopped = std::pin::pin!(stop_signal()?);
    service::status(
        "starting: opening the log, finishing what it shows begun, reconciling the host",
    );
    let daemon = setup(ctx).start(policy, metrics).await.map_err(explain)?;
    let log_seq = daemon.executor().log().last_seq();
    tracing::info!(host = %ctx.host, log_seq, "capstan-agent ready");
    // Ready for systemd only now: the log is open, intent rebuilt, the host reconciled.
    service::ready(&format!("ready: host {}, log seq {log_seq}", ctx.host));
    let mut watchdog = service::Watchdog::from_env();
    let stop = loop {
        tokio::select! {
            stop = &mut stopped => break stop,
            _ = watchdog.tick() => watchdog.alive(),
        }
    };
    service::stopping(&format!("{}: stopping", stop.name()));
    // SIGUSR2: stop leaving the workloads running, whatever `shutdown` says (an
    // upgrade: the new agent adopts them).
    let leave_running = leave_running || matches!(stop, Stop::Usr2);
    let report = daemon
        .stop(leave_running.then_some(ShutdownMode::LeaveRunning))
        .await?;
    tracing::info!("capstan-agent stopped");
    Ok(ExitCode::from(report.exit_code()))
}

pub(crate) async fn sim_fleet(ctx: &Context, options: FleetOptions) -> anyhow::Result<ExitCode> {
    // Config errors first, before anything is touched.
    let policy = policy(ctx)?;
    let stopped = stop_signal()?;
    let code = sim_fleet::run(&ctx.config, policy, &options, stopped).await?;
    Ok(ExitCode::from(code))
}

//! `capstan-agent`: the node agent's command line.

use anyhow::{bail, Context as _};
use capstan_agent::config::{self, AgentConfig, ShutdownMode};
use capstan_agent::daemon::{self, DaemonError, HostSetup};
use capstan_agent::executor::Executor;
use capstan_agent::local;
use capstan_agent::log::{Log, LogError, LogOptions};
use capstan_agent::metrics;
use capstan_agent::sim_fleet::{self, FleetOptions};
use capstan_common::wire::LogRequest;
use capstan_common::{service, Outcome};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

mod log_cli;
mod log_export_cli;

/// `--version`: the release and the drivers compiled into this build (cargo features;
/// `drivers::compiled`, and `external` when this build reaches external drivers), then
/// a second line, the storage layouts of the log this build reads (`log layouts: 1 2`,
/// what `packaging/deb/build.sh` writes into the package as `X-Capstan-Log-Layouts`);
/// a build with the fault-injection seams (feature `testing`, test builds only) says
/// so on a third line.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let mut drivers: Vec<&str> = capstan_agent::drivers::compiled()
        .into_iter()
        .map(|k| k.as_str())
        .collect();
    if capstan_agent::drivers::EXTERNAL {
        drivers.push("external");
    }
    let layouts: Vec<String> = capstan_agent::log::LAYOUTS
        .iter()
        .map(u32::to_string)
        .collect();
    let version = format!(
        "{} (drivers: {})\nlog layouts: {}",
        env!("CARGO_PKG_VERSION"),
        drivers.join(", "),
        layouts.join(" ")
    );
    if cfg!(feature = "testing") {
        version + "\n" + TESTING_LINE
    } else {
        version
    }
});

/// `--version`'s third line in a build with the fault-injection seams.
const TESTING_LINE: &str = "testing seams: on (a test build, not for production)";

#[derive(Parser)]
#[command(
    name = "capstan-agent",
    version = VERSION.as_str(),
    about = "capstan node agent: an event-sourced lifecycle agent for one host"
)]
struct Cli {
    /// Agent config (TOML). Default: /etc/capstan/agent.toml when it exists.
    #[arg(long, global = true, env = "CAPSTAN_CONFIG")]
    config: Option<PathBuf>,
    /// Where the log and driver state live (overrides the config).
    #[arg(long, global = true, env = "CAPSTAN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// This host's name (overrides the config; default: the machine's hostname).
    #[arg(long, global = true, env = "CAPSTAN_HOST")]
    host: Option<String>,
    /// Diagnostic log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Carry out commands from FILE (JSON lines; `-` = stdin), one result line each.
    /// Exit 0 when every command succeeded, 1 when any failed or was rejected,
    /// 3 when the log is degraded and nothing was done, 143 (SIGTERM) or 130 (SIGINT)
    /// when stopped: the command in flight has its hooks cut short (and compensated),
    /// its result is printed, and no further input line is carried out.
    Apply {
        /// Run this driver instead of the config's (sim, docker, …).
        #[arg(long)]
        driver: Option<capstan_common::DriverKind>,
        file: PathBuf,
    },
    /// Run the agent: finish unfinished commands, reconcile the host to intent, and
    /// serve until SIGTERM.
    Run {
        /// On stop, leave workloads running (for an agent upgrade).
        #[arg(long)]
        leave_running: bool,
    },
    /// Run a simulated fleet in this process: N hosts named `<prefix>-0001`…, each
    /// an agent as `run` builds it (its own log and sim host under
    /// `<data-dir>/<host>/`, executor, NATS connection, command consumer, outbox,
    /// RPC, heartbeat), sharing the config's [nats] and [signing] sections; serve
    /// until SIGTERM/SIGINT, then stop every host. The config's `driver` must be
    /// `sim` and `host` is not used.
    SimFleet {
        /// How many hosts.
        #[arg(long)]
        hosts: usize,
        /// Host names are `<prefix>-0001`, `<prefix>-0002`, …
        #[arg(long, default_value = "sim")]
        prefix: String,
        /// Each host's log cache (sled's page cache), in MiB.
        #[arg(long, default_value_t = sim_fleet::DEFAULT_LOG_CACHE_MIB)]
        log_cache_mib: u64,
    },
    /// Show the audit log.
    Log(LogArgs),
    /// Show the running intent rebuilt from the log.
    Intent {
        #[arg(long)]
        json: bool,
    },
    /// Print this host's public key (64 hex digits), for `capstan register`; the key
    /// (`host_key_file`, default `<data-dir>/host.key`) is made first if there is none.
    HostKey,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct LogArgs {
    #[command(subcommand)]
    action: Option<LogAction>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Only records after this seq.
    #[arg(long, default_value_t = 0)]
    since: u64,
    #[arg(long)]
    namespace: Option<String>,
    #[arg(long)]
    workload: Option<String>,
    /// Only records of this command id.
    #[arg(long)]
    command: Option<String>,
    /// Only records appended at or after this time (RFC 3339, e.g.
    /// `2026-12-01T02:00:00Z`); `--since` is a seq.
    #[arg(long, value_name = "TIME")]
    since_time: Option<chrono::DateTime<chrono::Utc>>,
    /// Only records appended before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    until_time: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Subcommand)]
enum LogAction {
    /// Check the whole hash chain: `ok <N> records` (`from anchor seq …` after a
    /// prune), or the first bad seq. With `--export`, check export files instead.
    Verify {
        /// Export files (`log export`, retention's) to check against the log.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        export: Vec<PathBuf>,
    },
    /// Print the storage layout of the log (`2`; `1` for a log not yet converted; a
    /// newer build's as found; `none` without a log): from the running agent, or read
    /// from the files without converting or writing anything.
    Layout,
    /// Write records as export lines (JSON with `hash` and `stored`).
    Export {
        /// Only records after this seq, or at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<log_export_cli::Bound>,
        /// Only records up to this seq, or at or before this RFC 3339 time.
        #[arg(long)]
        until: Option<log_export_cli::Bound>,
        /// Write to this file (fsync'd) instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

struct Context {
    config: AgentConfig,
    data_dir: PathBuf,
    host: String,
    /// `host_key_file`, or `<data_dir>/host.key`.
    host_key: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match real_main(cli) {
        Ok(code) => code,
        // The reader went away (`capstan-agent log | head`): nothing is wrong.
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capstan-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Whether `e` is a write to a closed stdout: a bare I/O error, as the output's
/// `writeln!(…)?` passes it up (the local socket's errors come wrapped, with the
/// socket's path, and are reported).
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sled=warn"));
    // Colours only on a terminal: under systemd, stderr goes to the journal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = AgentConfig::load(cli.config.as_deref())?;
    if let Cmd::Apply {
        driver: Some(d), ..
    } = &cli.command
    {
        config.driver = config::DriverSetting::Builtin(*d);
    }
    let data_dir = cli
        .data_dir
        .or_else(|| config.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from(config::DEFAULT_DATA_DIR));
    let host = match cli
        .host
        .or_else(|| config.host.clone())
        .or_else(config::system_hostname)
    {
        // A simulated fleet names its hosts itself.
        _ if matches!(cli.command, Cmd::SimFleet { .. }) => String::new(),
        Some(h) if capstan_common::validate::is_dns_label(&h) => h,
        Some(h) => bail!("host name {h:?} must be a DNS label (1-63 of [a-z0-9-])"),
        None => bail!("cannot tell this host's name: pass --host or set `host` in the config"),
    };
    let host_key = config
        .host_key_file
        .clone()
        .unwrap_or_else(|| data_dir.join(capstan_agent::host_key::FILE));
    let ctx = Context {
        config,
        data_dir,
        host,
        host_key,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Cmd::Apply { driver: _, file } => runtime.block_on(apply(&ctx, &file)),
        Cmd::Run { leave_running } => runtime.block_on(run(&ctx, leave_running)),
        Cmd::SimFleet {
            hosts,
            prefix,
            log_cache_mib,
        } => runtime.block_on(sim_fleet(
            &ctx,
            FleetOptions {
                hosts,
                prefix,
                data_dir: ctx.data_dir.clone(),
                log: LogOptions {
                    cache_bytes: Some(log_cache_mib.saturating_mul(1 << 20)),
                    ..LogOptions::default()
                },
            },
        )),
        Cmd::Log(args) => show_log(&ctx, &args),
        Cmd::Intent { json } => show_intent(&ctx, json),
        Cmd::HostKey => {
            let key = capstan_agent::host_key::load_or_create(&ctx.host_key)?;
            println!("{}", key.public_hex());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn open_log(ctx: &Context) -> anyhow::Result<Arc<Log>> {
    let dir = ctx.data_dir.join("log");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log = Log::open(&dir, LogOptions::default()).map_err(|e| explain(e.into()))?;
    Ok(Arc::new(log))
}

/// `e`, with a hint when the log is held by another process.
fn explain(e: DaemonError) -> anyhow::Error {
    match e {
        DaemonError::Log(e @ LogError::Open { .. }) => anyhow::Error::new(e).context(
            "is another capstan-agent using this data dir? (the log is exclusive to one process)",
        ),
        other => other.into(),
    }
}

fn setup(ctx: &Context) -> HostSetup<'_> {
    HostSetup {
        config: &ctx.config,
        host: &ctx.host,
        data_dir: &ctx.data_dir,
        host_key: &ctx.host_key,
        log: LogOptions::default(),
    }
}

/// Opens the log and the driver.
async fn open(ctx: &Context) -> anyhow::Result<Executor> {
    setup(ctx).open().await.map_err(explain)
}

/// [`open`] then [`startup`].
async fn start(ctx: &Context) -> anyhow::Result<Executor> {
    let executor = open(ctx).await?;
    daemon::startup(&executor).await?;
    Ok(executor)
}

async fn apply(ctx: &Context, file: &Path) -> anyhow::Result<ExitCode> {
    // First, so that a signal during startup is handled after it, not fatal.
    let stopped = stop_signal()?;
    let executor = start(ctx).await?;
    let input: Box<dyn BufRead + Send> = if file == Path::new("-") {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?,
        ))
    };
    let mut lines = read_lines(input);
    let degraded = executor.log().degraded().cloned();
    let mut out = std::io::stdout().lock();
    let mut all_ok = true;
    tokio::pin!(stopped);
    let mut signal = None;
    loop {
        let line = tokio::select! {
            line = lines.recv() => line,
            s = &mut stopped => {
                signal = Some(s);
                break;
            }
        };
        let Some(line) = line else { break };
        let text = line.context("cannot read input")?;
        if text.trim().is_empty() {
            continue;
        }
        // A degraded log answers every line `rejected`/`log_degraded` and writes nothing.
        let submit = executor.submit(&text);
        tokio::pin!(submit);
        let result = tokio::select! {
            r = &mut submit => r,
            s = &mut stopped => {
                // Cut the command's hooks short; it compensates under the fresh
                // cleanup budget and completes `cancelled`.
                signal = Some(s);
                executor.shutdown_token().cancel();
                submit.await
            }
        };
        all_ok &= result.outcome == Outcome::Succeeded;
        serde_json::to_writer(&mut out, &result)?;
        out.write_all(b"\n")?;
        out.flush()?;
        if signal.is_some() {
            break;
        }
    }
    executor.log().flush()?;
    Ok(if let Some(signal) = signal {
        tracing::info!(
            "stopped by {}; the rest of the input was not read",
            signal.name()
        );
        ExitCode::from(signal.exit_code())
    } else if degraded.is_some() {
        ExitCode::from(3)
    } else if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Reads `input` line by line on its own thread (a blocking read must not hold up a
/// signal), so that `apply` can stop between lines.
fn read_lines(
    input: Box<dyn BufRead + Send>,
) -> tokio::sync::mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        for line in input.split(b'\n') {
            let line = line.map(|l| String::from_utf8_lossy(&l).into_owned());
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn run(ctx: &Context, leave_running: bool) -> anyhow::Result<ExitCode> {
    // Config errors first, before anything is touched.
    let policy = policy(ctx)?;
    // Then the metrics address: one in use stops the start before anything is opened.
    let metrics = match ctx.config.metrics.listen()? {
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

/// Whose signatures commands need, when the config has a [nats] section.
fn policy(ctx: &Context) -> anyhow::Result<Option<capstan_common::signing::Policy>> {
    Ok(match &ctx.config.nats {
        Some(_) => Some(ctx.config.signing.policy()?),
        None => None,
    })
}

async fn sim_fleet(ctx: &Context, options: FleetOptions) -> anyhow::Result<ExitCode> {
    // Config errors first, before anything is touched.
    let policy = policy(ctx)?;
    let stopped = stop_signal()?;
    let code = sim_fleet::run(&ctx.config, policy, &options, stopped).await?;
    Ok(ExitCode::from(code))
}

/// The signal that stopped the agent.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Term,
    Int,
    /// `run`: stop leaving the workloads running (the package's upgrade sends it).
    Usr2,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Int => "SIGINT",
            Stop::Usr2 => "SIGUSR2",
        }
    }

    /// `apply`'s exit code after a stop: 128 + the signal's number, as a shell reports
    /// a process the signal ended (143, 130), but reached by a clean exit.
    fn exit_code(self) -> u8 {
        match self {
            Stop::Term => 143,
            Stop::Int => 130,
            Stop::Usr2 => 140,
        }
    }
}

/// Installs the SIGTERM/SIGINT/SIGUSR2 handlers now (so a signal sent as soon as the
/// agent says it is ready is never lost to the default action) and returns the wait.
/// The first signal decides: a SIGTERM that follows a SIGUSR2 (`systemctl stop` after
/// the package's upgrade asked for a leave-running stop) changes nothing.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = Stop>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    Ok(async move {
        let stop = tokio::select! {
            biased;
            _ = usr2.recv() => Stop::Usr2,
            _ = term.recv() => Stop::Term,
            _ = int.recv() => Stop::Int,
        };
        tracing::info!("{}: stopping", stop.name());
        stop
    })
}

/// `capstan-agent log`: from the running agent over its local socket when one runs
/// (it holds the log), else from the log files.
fn show_log(ctx: &Context, args: &LogArgs) -> anyhow::Result<ExitCode> {
    let running = local::running(&ctx.data_dir);
    let source = || -> anyhow::Result<log_export_cli::Source> {
        Ok(match &running {
            Some(path) => log_export_cli::Source::Agent(path.clone()),
            None => log_export_cli::Source::Files(open_log(ctx)?),
        })
    };
    match &args.action {
        Some(LogAction::Export {
            since,
            until,
            output,
        }) => return log_export_cli::run(&source()?, *since, *until, output.as_deref()),
        Some(LogAction::Verify { export }) if !export.is_empty() => {
            return log_export_cli::verify(&source()?, export)
        }
        Some(LogAction::Layout) => return log_cli::layout(&ctx.data_dir, running.as_deref()),
        _ => {}
    }
    if let Some(LogAction::Verify { .. }) = args.action {
        let verdict = match &running {
            Some(path) => {
                let answer = local::ask(path, "verify", serde_json::Value::Null)?;
                match (answer["verified"].as_u64(), answer["bad"].as_object()) {
                    (Some(n), _) => Ok((n, answer["anchor"].clone())),
                    (None, Some(bad)) => Err((bad["seq"].clone(), bad["defect"].clone())),
                    _ => anyhow::bail!("the running agent could not verify: {answer}"),
                }
            }
            None => match open_log(ctx).and_then(|log| {
                let anchor = log.anchor()?.map(|a| a.summary()).unwrap_or_default();
                Ok(log.verify().map(|n| (n, anchor)))
            })? {
                Ok(n) => Ok(n),
                Err(LogError::Corrupt(c)) => Err((c.seq.into(), c.defect.to_string().into())),
                Err(e) => return Err(e.into()),
            },
        };
        return Ok(match verdict {
            Ok((n, anchor)) => {
                writeln!(
                    std::io::stdout(),
                    "ok {n} records{}",
                    log_export_cli::anchor_words(&anchor)
                )?;
                ExitCode::SUCCESS
            }
            Err((seq, defect)) => {
                writeln!(
                    std::io::stdout(),
                    "bad record {seq}: {}",
                    defect.as_str().unwrap_or_default()
                )?;
                ExitCode::from(1)
            }
        });
    }
    let (records, bad) = match &running {
        Some(path) => {
            let filter = serde_json::json!({
                "command": args.command,
                "namespace": args.namespace,
                "workload": args.workload,
                "since_time": args.since_time,
                "until_time": args.until_time,
            });
            (local::log_records(path, args.since, filter)?, 0)
        }
        None => {
            let request = LogRequest {
                since: args.since,
                limit: None,
                command: args.command.clone(),
                namespace: args.namespace.clone(),
                workload: args.workload.clone(),
                since_time: args.since_time,
                until_time: args.until_time,
            };
            log_cli::read_log(&ctx.data_dir.join("log"), &request)?
        }
    };
    let mut out = std::io::stdout().lock();
    if !args.json {
        writeln!(
            out,
            "{:>6}  {:<24}  {:<18}  {:<24}  {:<32}  DETAIL",
            "SEQ", "AT", "KIND", "COMMAND", "TARGET"
        )?;
    }
    for json in &records {
        if args.json {
            serde_json::to_writer(&mut out, json)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{}", log_cli::row(json))?;
        }
    }
    Ok(if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `capstan-agent intent`: from the running agent when one runs, else rebuilt from
/// the log files.
fn show_intent(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let intent = match local::running(&ctx.data_dir) {
        Some(path) => local::ask(&path, "intent", serde_json::Value::Null)?,
        None => open_log(ctx)?.intent().to_json(),
    };
    if intent.get("error").is_some() || !intent["applied_seq"].is_u64() {
        anyhow::bail!("the running agent's answer is not an intent: {intent}");
    }
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{intent}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let keys = |v: &serde_json::Value| {
        v.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    writeln!(out, "applied_seq {}", intent["applied_seq"])?;
    for ns in keys(&intent["namespaces"]) {
        writeln!(out, "namespace {ns}")?;
    }
    for (key, w) in intent["workloads"].as_object().into_iter().flatten() {
        let text = |k: &str| w[k].as_str().map(str::to_string);
        writeln!(
            out,
            "workload {key:<32} intent={:<8} active={}{}",
            text("intent").unwrap_or_default(),
            text("active_revision").as_deref().unwrap_or("-"),
            text("failed")
                .map(|c| format!(" failed={c}"))
                .unwrap_or_default()
        )?;
    }
    let in_flight = keys(&intent["in_flight"]);
    if !in_flight.is_empty() {
        writeln!(out, "in flight: {}", in_flight.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}

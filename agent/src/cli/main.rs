//! `capstan-agent`: the node agent's command line. This file holds the arguments and
//! the dispatch; each verb lives in its own module (`apply`, `run` and `sim-fleet`,
//! `log`, `intent`), with what they share in [`context`] and [`signal`].

use anyhow::bail;
use capstan_agent::config::{self, AgentConfig};
use capstan_agent::log::LogOptions;
use capstan_agent::sim_fleet::{self, FleetOptions};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use context::Context;
use std::path::PathBuf;
use std::process::ExitCode;

mod apply;
mod context;
mod intent;
mod log;
mod log_export;
mod log_files;
mod run;
mod signal;

/// `--version`: the release and the drivers compiled into this build (cargo features;
/// `drivers::compiled`, and `external` when this build reaches external drivers), then
/// a second line, the storage layouts of the log this build reads (`log layouts: 1 2`,
/// what `packaging/deb/build.sh` writes into the package as `X-Capstan-Log-Layouts`);
/// a build with the fault-injection seams (feature `testing`, test builds only) says
/// so on a third line.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let mut drivers: Vec<String> = capstan_agent::drivers::compiled()
        .into_iter()
        .map(|k| k.to_string())
        .collect();
    if capstan_agent::drivers::EXTERNAL {
        drivers.push("external".into());
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
    /// Where the log and driver state live. Overrides the config's `data_dir` (and says
    /// so); default: the config's, else /var/lib/capstan.
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
        /// The commands, one JSON object a line, or `-` for stdin.
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
        /// Per-host accounts: each host connects with its own nkey, `DIR/<host>.nk`
        /// (the `credentials/` dir `capstan-coordinator nats-config` writes), as
        /// `host_accounts = true`; the config then names no NATS credentials.
        #[arg(long, value_name = "DIR")]
        nats_credentials: Option<std::path::PathBuf>,
    },
    /// Show the audit log.
    Log(LogArgs),
    /// Show the running intent rebuilt from the log.
    Intent {
        /// One JSON object (`docs/protocol.md`, *Intent*).
        #[arg(long)]
        json: bool,
    },
    /// Print this host's public key (64 hex digits), for `capstan register`; the key
    /// (`host_key_file`, default `<data-dir>/host.key`) is made first if there is none.
    HostKey,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct LogArgs {
    #[command(subcommand)]
    action: Option<LogAction>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Only records after this seq.
    #[arg(long, default_value_t = 0)]
    since: u64,
    /// Only records of this namespace (with `--workload`: of that workload).
    #[arg(long)]
    namespace: Option<String>,
    /// Only records of this workload (with `--namespace`).
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
pub(crate) enum LogAction {
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
        since: Option<log_export::Bound>,
        /// Only records up to this seq, or at or before this RFC 3339 time.
        #[arg(long)]
        until: Option<log_export::Bound>,
        /// Write to this file (fsync'd) instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    // Where `--data-dir` came from (the command line or `CAPSTAN_DATA_DIR`), to say
    // so when it overrides the config's `data_dir`.
    let data_dir_from = match matches.value_source("data_dir") {
        Some(ValueSource::CommandLine) => Some("--data-dir"),
        Some(ValueSource::EnvVariable) => Some("CAPSTAN_DATA_DIR"),
        _ => None,
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_tracing(cli.log_format);
    match real_main(cli, data_dir_from) {
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
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sled=warn"));
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("async_nats")) {
        filter = filter.add_directive(
            capstan_common::nats::QUIET_CLIENT
                .parse()
                .expect("a valid directive"),
        );
    }
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

fn real_main(cli: Cli, data_dir_from: Option<&str>) -> anyhow::Result<ExitCode> {
    let mut config = AgentConfig::load(cli.config.as_deref())?;
    if let Cmd::Apply {
        driver: Some(d), ..
    } = &cli.command
    {
        config.driver = config::DriverSetting::Builtin(*d);
    }
    // `--data-dir` (or `CAPSTAN_DATA_DIR`) wins over the config's `data_dir`, said
    // when they differ; then the config's; then the default.
    if let (Some(given), Some(configured)) = (&cli.data_dir, &config.data_dir) {
        if given != configured {
            tracing::warn!(
                "data dir {} (from {}) overrides `data_dir = {:?}` in {}",
                given.display(),
                data_dir_from.unwrap_or("--data-dir"),
                configured.display(),
                cli.config
                    .as_deref()
                    .unwrap_or(std::path::Path::new(config::DEFAULT_PATH))
                    .display()
            );
        }
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
        Cmd::Apply { driver: _, file } => runtime.block_on(apply::apply(&ctx, &file)),
        Cmd::Run { leave_running } => runtime.block_on(run::run(&ctx, leave_running)),
        Cmd::SimFleet {
            hosts,
            prefix,
            log_cache_mib,
            nats_credentials,
        } => runtime.block_on(run::sim_fleet(
            &ctx,
            FleetOptions {
                hosts,
                prefix,
                data_dir: ctx.data_dir.clone(),
                log: LogOptions {
                    cache_bytes: Some(log_cache_mib.saturating_mul(1 << 20)),
                    ..LogOptions::default()
                },
                nats_credentials,
            },
        )),
        Cmd::Log(args) => log::show_log(&ctx, &args),
        Cmd::Intent { json } => intent::show_intent(&ctx, json),
        Cmd::HostKey => {
            let key = capstan_agent::host_key::load_or_create(&ctx.host_key)?;
            println!("{}", key.public_hex());
            Ok(ExitCode::SUCCESS)
        }
    }
}

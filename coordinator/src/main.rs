//! `capstan-coordinator`: `run --config FILE` serves the API; `keygen` makes a signing
//! key; `token` makes an API token and its tokens-file line.

use anyhow::Context as _;
use capstan_common::nats::Retention;
use capstan_common::service;
use capstan_common::signing::Signer;
use capstan_coordinator::api::{self, AppState};
use capstan_coordinator::auth::{self, Role, Tokens};
use capstan_coordinator::config::CoordinatorConfig;
use capstan_coordinator::fleet::liveness::Pacing;
use capstan_coordinator::fleet::{Fleet, Trust};
use capstan_coordinator::guard::Limits;
use clap::{Parser, Subcommand};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "capstan-coordinator", version, about = "capstan coordinator")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the HTTP API.
    Run {
        /// The coordinator's config (TOML; every key: docs/nats.md, *Coordinator*).
        #[arg(long, env = "CAPSTAN_COORDINATOR_CONFIG")]
        config: PathBuf,
    },
    /// Write a new ed25519 signing key (hex seed, mode 0600) to OUT and print its
    /// public key for the agents' `[signing] public_keys`.
    Keygen {
        /// Where to write the key (refused if the file exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write the nats-server config that gives each host an account of its own
    /// (`OUT/nats-server.conf`), with an nkey per host and one for the coordinators in
    /// `OUT/credentials/` (made where missing, kept where present: run it again with
    /// more hosts to add them). Prints each host's credentials file.
    NatsConfig {
        /// A host name; repeat for more.
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// A file of hosts, one a line (`#` comments; `user@host[:port]` gives `host`).
        #[arg(long)]
        hosts_file: Option<PathBuf>,
        /// Where to write the config and the credentials.
        #[arg(long)]
        out: PathBuf,
        /// How many hosts share a storage shard (1-1000): a new host goes to the
        /// lowest shard with room; hosts already placed stay (`OUT/shards`).
        #[arg(long, default_value_t = capstan_coordinator::natsconf::DEFAULT_HOSTS_PER_SHARD)]
        hosts_per_shard: u32,
        /// Each storage shard's quota: its hosts' event records and results together.
        #[arg(long, default_value = "16G")]
        shard_quota: String,
        /// Replaced by --shard-quota (hosts share storage shards).
        #[arg(long, hide = true)]
        host_quota: Option<String>,
        /// The coordinators' account's quota: the command stream and the buckets.
        #[arg(long, default_value = "8G")]
        fleet_quota: String,
    },
    /// Make an API token. Prints the tokens-file line (`ROLE SHA256 [NAME]`), then the
    /// token itself; with `--append-to FILE`, appends the line to FILE (created mode
    /// 0600) and prints only the token. The token is not kept anywhere else.
    Token {
        /// `submit` (POST commands, and read) or `read` (GET only).
        #[arg(long, value_parser = ["submit", "read"])]
        role: String,
        /// A one-word name for the line (shown in the coordinator's log).
        #[arg(long)]
        name: Option<String>,
        /// Append the line to this tokens file (made mode 0600 if missing; an existing
        /// file keeps its mode) and print only the token.
        #[arg(long, value_name = "FILE")]
        append_to: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("async_nats")) {
        filter = filter.add_directive(
            capstan_common::nats::QUIET_CLIENT
                .parse()
                .expect("a valid directive"),
        );
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Keygen { out } => keygen(&out),
        Cmd::NatsConfig {
            hosts,
            hosts_file,
            out,
            hosts_per_shard,
            shard_quota,
            host_quota,
            fleet_quota,
        } => match host_quota {
            Some(_) => Err(anyhow::anyhow!(
                "--host-quota is gone: hosts share storage shards now; give --shard-quota \
                 (each shard's, default 16G) and --hosts-per-shard (default {}) instead \
                 (docs/nats.md, \"Storage shards\")",
                capstan_coordinator::natsconf::DEFAULT_HOSTS_PER_SHARD
            )),
            None => nats_config(
                hosts,
                hosts_file,
                &out,
                hosts_per_shard,
                &shard_quota,
                &fleet_quota,
            ),
        },
        Cmd::Token {
            role,
            name,
            append_to,
        } => token(&role, name.as_deref(), append_to.as_deref()),
        Cmd::Run { config } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run(config))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capstan-coordinator: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn nats_config(
    mut hosts: Vec<String>,
    hosts_file: Option<PathBuf>,
    out: &std::path::Path,
    hosts_per_shard: u32,
    shard_quota: &str,
    fleet_quota: &str,
) -> anyhow::Result<()> {
    use capstan_coordinator::natsconf;
    if let Some(file) = hosts_file {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        hosts.extend(natsconf::hosts_of(&text));
    }
    let accounts = natsconf::generate(
        out,
        &natsconf::Request {
            hosts: &hosts,
            hosts_per_shard,
            shard_quota,
            fleet_quota,
        },
    )?;
    let creds = natsconf::credentials_dir(out);
    println!("{}", out.join("nats-server.conf").display());
    println!(
        "coordinator {}  # [nats] nkey_seed_file, host_accounts = true",
        creds.join("coordinator.nk").display()
    );
    println!(
        "coordinator-hosts {}  # [nats] hosts_nkey_seed_file",
        creds.join("coordinator-hosts.nk").display()
    );
    for host in &accounts.hosts {
        let name = &host.name;
        println!("{name} {}", creds.join(format!("{name}.nk")).display());
    }
    Ok(())
}

fn keygen(out: &PathBuf) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let signer = Signer::generate()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create {} (it must not exist)", out.display()))?;
    writeln!(file, "{}", signer.secret_hex())?;
    println!("{}", signer.public_hex());
    Ok(())
}

fn token(
    role: &str,
    name: Option<&str>,
    append_to: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let role = Role::parse(role).context("the role is `submit` or `read`")?;
    if let Some(name) = name {
        anyhow::ensure!(
            !name.is_empty() && !name.contains(char::is_whitespace) && !name.starts_with('#'),
            "the name is one word"
        );
    }
    let (token, line) = auth::generate(role, name)?;
    match append_to {
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            writeln!(file, "{line}")?;
            println!("{token}");
        }
        None => {
            println!("{line}");
            println!("{token}");
        }
    }
    Ok(())
}

async fn run(path: PathBuf) -> anyhow::Result<()> {
    let config = CoordinatorConfig::load(&path)?;
    let tokens = match &config.tokens_file {
        Some(file) => {
            let tokens = Tokens::load(file)?;
            tracing::info!(tokens = tokens.len(), file = %file.display(), "API tokens loaded");
            Some(tokens)
        }
        None => {
            tracing::warn!(
                listen = %config.listen,
                "no `tokens_file`: the API is open to every local user and process (development only)"
            );
            None
        }
    };
    let key = std::fs::read_to_string(&config.signing_key_file)
        .with_context(|| format!("cannot read {}", config.signing_key_file.display()))?;
    let signer = Signer::from_hex(&key)
        .with_context(|| format!("bad signing key in {}", config.signing_key_file.display()))?;
    let client = config.nats.connect("capstan-coordinator", None).await?;
    let reach = match config.nats.reach() {
        Some(nats) => Some(nats.connect("capstan-coordinator hosts", None).await?),
        None => None,
    };
    let fleet = Fleet::new(
        client,
        reach,
        signer,
        Pacing {
            stale_after: Duration::from_secs(config.stale_after_secs),
            keep_for: Duration::from_secs(config.hosts_max_age_secs),
            max_beats_per_sec: config.max_beats_per_sec,
        },
        Retention {
            replicas: config.nats.replicas,
            ..Retention::default()
        },
        Trust {
            host_accounts: config.nats.host_accounts,
            allow_unregistered: config.allow_unregistered_hosts,
        },
    );
    let state = Arc::new(AppState {
        fleet,
        metrics: Default::default(),
        tokens,
        limits: Limits::new(config.max_waits, config.max_stream_reads),
    });
    // Hosts on per-host accounts ask the coordinators for their commands.
    let sync = tokio::spawn({
        let state = Arc::clone(&state);
        async move { state.fleet.serve_sync().await }
    });
    // Every coordinator hears every host's beats.
    let beats = tokio::spawn({
        let state = Arc::clone(&state);
        async move { state.fleet.serve_beats().await }
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    use tokio::signal::unix::{signal, SignalKind};
    // Before saying ready, so that a SIGTERM sent at once is not lost.
    let mut term = signal(SignalKind::terminate())?;
    let addr = listener.local_addr()?;
    tracing::info!(listen = %addr, "capstan-coordinator ready");
    service::ready(&format!("ready: listening on {addr}"));
    // The HTTP server is the main loop; the pings show the runtime under it turns.
    let watchdog = tokio::spawn(async {
        let mut watchdog = service::Watchdog::from_env();
        loop {
            watchdog.tick().await;
            watchdog.alive();
        }
    });
    let served = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
            service::stopping("stopping: finishing the requests in flight");
        })
        .await;
    watchdog.abort();
    sync.abort();
    beats.abort();
    served?;
    Ok(())
}

//! `capstan-sim-driver`: the sim driver as a standalone driver process, serving the
//! external driver protocol on a Unix socket (`docs/driver-protocol.md`). Its host
//! lives in `--state-dir` (readable with `capstan_driver::sim::SimHost::load`), so it
//! survives the process. For tests, `--hold OP` makes every `OP` request wait (after
//! logging "holding OP") until `--release FILE` exists, or for ever; "exit feed open"
//! says a `watch_exits` stream misses no exit from then on.

use anyhow::Context as _;
use capstan_driver::decorate::{Around, Call, Operation, Wrapped};
use capstan_driver::sim::{SimConfig, SimDriver};
use capstan_driver::{Capabilities, Driver, Exit};
use clap::Parser;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Parser)]
#[command(name = "capstan-sim-driver", version, about)]
struct Cli {
    /// The socket to listen on (replaced if it exists; mode 0600).
    #[arg(long)]
    socket: PathBuf,
    /// Where the simulated host is kept.
    #[arg(long)]
    state_dir: PathBuf,
    /// Declare `manages_lifecycle` (the agent stops workloads on a graceful stop).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    manages_lifecycle: bool,
    /// Declare and provide `reports_exits`.
    #[arg(long)]
    reports_exits: bool,
    /// Declare `restarts_exits`.
    #[arg(long)]
    restarts_exits: bool,
    /// Declare `reaps_orphans`.
    #[arg(long)]
    reaps_orphans: bool,
    /// Declare and provide `probes`: readiness checks, answered ready (the sim
    /// carries out no real check).
    #[arg(long)]
    probes: bool,
    /// Hold every request for this operation (`activate`, `stop`, …) before doing it.
    #[arg(long)]
    hold: Option<String>,
    /// With `--hold`: carry on once this file exists (checked every 20 ms).
    #[arg(long, requires = "hold")]
    release: Option<PathBuf>,
    /// The kind to announce (and run specs of): a driver of a new kind, simulated.
    #[arg(long, default_value_t = capstan_common::DriverKind::SIM)]
    kind: capstan_common::DriverKind,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let cli = Cli::parse();
    let config = SimConfig::declaring(Capabilities {
        manages_lifecycle: cli.manages_lifecycle,
        reports_exits: cli.reports_exits,
        restarts_exits: cli.restarts_exits,
        reaps_orphans: cli.reaps_orphans,
        probes: cli.probes,
    });
    let sim = SimDriver::open(&cli.state_dir, config)
        .with_context(|| format!("cannot open the sim host in {}", cli.state_dir.display()))?
        .answering_to(cli.kind);
    let sim = Arc::new(sim);
    let driver: Arc<dyn Driver> = Arc::new(Wrapped::new(
        Arc::clone(&sim) as Arc<dyn Driver>,
        Holding {
            sim,
            hold: cli.hold,
            release: cli.release,
        },
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match std::fs::remove_file(&cli.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).context("cannot remove the old socket");
            }
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&cli.socket)
            .with_context(|| format!("cannot listen on {}", cli.socket.display()))?;
        std::fs::set_permissions(&cli.socket, std::fs::Permissions::from_mode(0o600))?;
        tracing::info!(socket = %cli.socket.display(), "capstan-sim-driver listening");
        capstan_external::serve(listener, driver)
            .await
            .context("accepting connections failed")
    })
}

/// Holds one operation of the sim driver (`--hold`) until `--release`'s file exists,
/// and announces when the exit feed is open.
struct Holding {
    sim: Arc<SimDriver>,
    hold: Option<String>,
    release: Option<PathBuf>,
}

impl Holding {
    async fn gate(&self, op: &str) {
        if self.hold.as_deref() != Some(op) {
            return;
        }
        tracing::info!("holding {op}");
        loop {
            if self.release.as_ref().is_some_and(|f| f.exists()) {
                tracing::info!("released {op}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Around for Holding {
    fn around<'a, T: Send + 'a>(&'a self, op: Operation, call: Call<'a, T>) -> Call<'a, T> {
        Box::pin(async move {
            self.gate(op.as_str()).await;
            call.await
        })
    }

    /// Logs "exit feed open" once the sim's feed is registered: from then on no exit
    /// is missed (what tests wait for before causing one).
    fn watch_exits<'a>(&'a self, inner: &'a dyn Driver, exits: mpsc::Sender<Exit>) -> Call<'a, ()> {
        Box::pin(async move {
            let announce = async {
                self.sim.watched().await;
                tracing::info!("exit feed open");
                std::future::pending::<()>().await
            };
            tokio::select! {
                ended = inner.watch_exits(exits) => ended,
                () = announce => unreachable!("pending never completes"),
            }
        })
    }
}

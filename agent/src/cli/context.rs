//! What the verbs share: the [`Context`] built from the command line and the config,
//! and opening the log, the driver and the host with it.

use anyhow::Context as _;
use capstan_agent::config::AgentConfig;
use capstan_agent::daemon::{self, DaemonError, HostSetup};
use capstan_agent::executor::Executor;
use capstan_agent::log::{Log, LogError, LogOptions};
use capstan_common::files;
use std::path::PathBuf;
use std::sync::Arc;

/// What every verb works with: the config and what the command line and config say
/// of this host.
pub(crate) struct Context {
    pub(crate) config: AgentConfig,
    pub(crate) data_dir: PathBuf,
    pub(crate) host: String,
    /// `host_key_file`, or `<data_dir>/host.key`.
    pub(crate) host_key: PathBuf,
}

pub(crate) fn open_log(ctx: &Context) -> anyhow::Result<Arc<Log>> {
    let dir = ctx.data_dir.join("log");
    // As `run` makes them: a new data dir `0700`, the log's directory `0700`.
    files::create_dir_all(&ctx.data_dir, files::PRIVATE_DIR)
        .with_context(|| format!("cannot create {}", ctx.data_dir.display()))?;
    let log = Log::open(&dir, LogOptions::default()).map_err(|e| explain(e.into()))?;
    Ok(Arc::new(log))
}

/// `e`, with a hint when the log is held by another process.
pub(crate) fn explain(e: DaemonError) -> anyhow::Error {
    match e {
        DaemonError::Log(e @ LogError::Open { .. }) => anyhow::Error::new(e).context(
            "is another capstan-agent using this data dir? (the log is exclusive to one process)",
        ),
        other => other.into(),
    }
}

pub(crate) fn setup(ctx: &Context) -> HostSetup<'_> {
    HostSetup {
        config: &ctx.config,
        host: &ctx.host,
        data_dir: &ctx.data_dir,
        host_key: &ctx.host_key,
        log: LogOptions::default(),
    }
}

/// Opens the log and the driver.
pub(crate) async fn open(ctx: &Context) -> anyhow::Result<Executor> {
    setup(ctx).open().await.map_err(explain)
}

/// [`open`] then [`startup`].
pub(crate) async fn start(ctx: &Context) -> anyhow::Result<Executor> {
    let executor = open(ctx).await?;
    daemon::startup(&executor).await?;
    Ok(executor)
}

/// Whose signatures commands need, when the config has a [nats] section.
pub(crate) fn policy(ctx: &Context) -> anyhow::Result<Option<capstan_common::signing::Policy>> {
    Ok(match &ctx.config.nats {
        Some(_) => Some(ctx.config.signing.policy()?),
        None => None,
    })
}

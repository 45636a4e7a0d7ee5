//! `capstan install`: the agent's package onto hosts over SSH, each until alive (the
//! work is `capstan_coordinator::install`).

use crate::output::duration;
use anyhow::Context as _;
use capstan_coordinator::client::Client;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["ssh", "hosts_file"])))]
#[command(group(clap::ArgGroup::new("trust").required(true).multiple(true).args(["known_hosts", "accept_new"])))]
#[command(group(clap::ArgGroup::new("what").required(true).args(["config", "config_dir"])))]
pub(crate) struct InstallArgs {
    /// One host: `user@host[:port]` (port 22 by default).
    #[arg(long)]
    ssh: Option<String>,
    /// Many hosts: a file with one `user@host[:port]` a line (`#` comments).
    #[arg(long)]
    hosts_file: Option<PathBuf>,
    /// The SSH private key (OpenSSH ed25519, no passphrase).
    #[arg(long)]
    identity: PathBuf,
    /// The known_hosts file host keys are checked against (OpenSSH format).
    #[arg(long)]
    known_hosts: Option<PathBuf>,
    /// Trust a host that known_hosts does not name yet, and record its key there
    /// (default file: ~/.ssh/known_hosts). A changed key is refused all the same.
    #[arg(long)]
    accept_new: bool,
    /// The agent.toml every host gets (without `host`, each host is named as its
    /// target is written).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A directory with `<host>.toml` for each host (`host` as written in the target).
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// Replace a different installed version of the package (the agent stops
    /// leaving its workloads running, and starts again).
    #[arg(long)]
    upgrade: bool,
    /// The output directory of `capstan-coordinator nats-config`: each host's nkey
    /// seed (`credentials/<name>.nk`, the host's name: the config's `host`, else the
    /// target's host) is written to /etc/capstan/nats.nk, which the
    /// config's `[nats] nkey_seed_file` must name (with `host_accounts = true`).
    #[arg(long, value_name = "DIR")]
    nats_credentials: Option<PathBuf>,
    /// Replace an installed version with an older one, when the package reads the
    /// storage layout of the host's log (its X-Capstan-Log-Layouts).
    #[arg(long)]
    allow_downgrade: bool,
    /// How many hosts at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// How long a host may take to be alive once its agent is started.
    #[arg(long, default_value = "60s")]
    timeout: String,
    /// How long connecting to a host (TCP and the SSH handshake) may take.
    #[arg(long, default_value = "10s")]
    connect_timeout: String,
    /// The capstan-agent .deb.
    package: PathBuf,
}

/// `capstan install`: one summary line per host on stdout (`<host> installed`,
/// `upgraded`, `downgraded`, `reconfigured`, `unchanged`, or `failed: <reason>`); exit 1 if any
/// host failed.
pub(crate) async fn install(
    client: &Client,
    json: bool,
    args: InstallArgs,
) -> anyhow::Result<ExitCode> {
    use capstan_coordinator::install::{self, ssh, target};
    let targets = match (&args.ssh, &args.hosts_file) {
        (Some(one), _) => vec![one.parse::<target::Target>()?],
        (None, Some(file)) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the hosts file {}", file.display()))?;
            target::parse_hosts_file(&text)
                .with_context(|| format!("in the hosts file {}", file.display()))?
        }
        (None, None) => anyhow::bail!("pass --ssh user@host or --hosts-file FILE"),
    };
    let known_hosts = match args.known_hosts {
        Some(path) => path,
        None => std::env::home_dir()
            .context("no home directory for ~/.ssh/known_hosts: pass --known-hosts FILE")?
            .join(".ssh/known_hosts"),
    };
    let mut jobs = Vec::new();
    for target in targets {
        let path = match (&args.config, &args.config_dir) {
            (Some(file), _) => file.clone(),
            (None, Some(dir)) => dir.join(format!("{}.toml", target.host)),
            (None, None) => anyhow::bail!("pass --config FILE or --config-dir DIR"),
        };
        let config = std::fs::read(&path).with_context(|| {
            format!(
                "cannot read the config for {} ({})",
                target.host,
                path.display()
            )
        })?;
        // A config that is not TOML, or a name that is not a host's (`install::name`),
        // is a usage error, found before any host is touched.
        let label = format!("{} ({})", target.host, path.display());
        let job = install::Job::new(target, config).with_context(|| label)?;
        jobs.push(job);
    }
    install::check_names(&jobs)?;
    let package_bytes = std::fs::read(&args.package)
        .with_context(|| format!("cannot read the package {}", args.package.display()))?;
    let spec = install::Install {
        identity: ssh::load_identity(&args.identity)?,
        identity_path: args.identity,
        host_keys: ssh::HostKeys {
            known_hosts,
            accept_new: args.accept_new,
        },
        package: args.package,
        package_bytes: std::sync::Arc::new(package_bytes),
        upgrade: args.upgrade,
        nats_credentials: args.nats_credentials,
        allow_downgrade: args.allow_downgrade,
        connect_timeout: duration("connect-timeout", &args.connect_timeout)?,
        timeout: duration("timeout", &args.timeout)?,
    };
    let results = install::install_all(&spec, client, jobs, args.concurrency).await;
    let mut failed = false;
    for (host, result) in results {
        match result {
            Ok(outcome) if json => {
                println!("{}", json!({"host": host, "outcome": outcome.to_string()}))
            }
            Ok(outcome) => println!("{host} {outcome}"),
            Err(e) => {
                failed = true;
                let reason = format!("{:#}", anyhow::Error::new(e));
                if json {
                    println!(
                        "{}",
                        json!({"host": host, "outcome": "failed", "error": reason})
                    );
                } else {
                    println!("{host} failed: {reason}");
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

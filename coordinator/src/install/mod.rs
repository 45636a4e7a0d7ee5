//! `capstan install`: the capstan-agent package and its config onto hosts over SSH,
//! the agent enabled and started, until the coordinator's registry says the host is
//! `alive` (docs/install.md, "capstan install").
//!
//! Per host: connect and verify its host key ([`ssh`]), read what is there (the
//! installed version, the config's digest and mode, the unit's state), upload the
//! package (streamed into a `/tmp` file, its sha256 checked there), decide the steps
//! ([`plan`], pure), carry them out, and wait for `alive`. Many hosts run at once,
//! `concurrency` at a time; each one's result is its own.

pub mod plan;
pub mod ssh;
pub mod target;
pub mod version;

use crate::client::{Client, ClientError};
use futures::StreamExt as _;
use plan::{LogLayout, Observed, Outcome, Package, Plan, Start, Wanted};
use sha2::{Digest as _, Sha256};
use ssh::{HostKeys, Session, SshError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::Target;

/// The agent package's control field naming the log layouts its build reads
/// (`packaging/deb/build.sh` writes it from `capstan-agent --version`).
pub const LAYOUTS_FIELD: &str = "X-Capstan-Log-Layouts";
/// Where the config goes on a host.
pub const CONFIG_PATH: &str = "/etc/capstan/agent.toml";
/// Where the host's NATS nkey seed goes (`--nats-credentials`); the config's
/// `[nats] nkey_seed_file` must name it.
pub const NKEY_PATH: &str = "/etc/capstan/nats.nk";
const UNIT: &str = "capstan-agent";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(
        "{user}@{host} is not root (uid {uid}): dpkg and systemctl need root; connect as root"
    )]
    NotRoot {
        user: String,
        host: String,
        uid: String,
    },
    #[error("`{step}` failed on {host} (exit {status}): {stderr}")]
    Remote {
        host: String,
        step: &'static str,
        status: u32,
        stderr: String,
    },
    #[error("the upload to {host} arrived corrupted (sha256 {got}, sent {sent})")]
    Corrupted {
        host: String,
        got: String,
        sent: String,
    },
    #[error("{path} is not a capstan-agent package (dpkg-deb says Package: {package:?})")]
    NotTheAgent { path: PathBuf, package: String },
    #[error("{host} answered the state probe with something unreadable: {output:?}")]
    Probe { host: String, output: String },
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("the config is not TOML")]
    Config(#[source] toml::de::Error),
    #[error(
        "{name} was not alive in the coordinator's registry within {timeout:?} (last seen: {last})"
    )]
    NotAlive {
        name: String,
        timeout: Duration,
        last: String,
    },
    #[error("no randomness for the upload's file name")]
    Random(#[source] getrandom::Error),
    #[error("asking the coordinator for its hosts")]
    Coordinator(#[source] ClientError),
    #[error("cannot read the NATS credentials of {name} ({})", path.display())]
    Credentials {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("with --nats-credentials the config of {name} must say `nkey_seed_file = \"{NKEY_PATH}\"` and `host_accounts = true` in [nats]")]
    CredentialsUnused { name: String },
    #[error("registering the host key of {name} with the coordinator")]
    Register {
        name: String,
        #[source]
        source: ClientError,
    },
}

/// What every host gets.
pub struct Install {
    pub identity: Arc<russh::keys::PrivateKey>,
    pub identity_path: PathBuf,
    pub host_keys: HostKeys,
    pub package: PathBuf,
    pub package_bytes: Arc<Vec<u8>>,
    pub upgrade: bool,
    /// `capstan-coordinator nats-config`'s output directory: each host's nkey seed
    /// (`credentials/<name>.nk`) goes to [`NKEY_PATH`].
    pub nats_credentials: Option<PathBuf>,
    pub allow_downgrade: bool,
    pub connect_timeout: Duration,
    /// How long to wait for `alive` once the agent is started.
    pub timeout: Duration,
}

/// One host and the config it gets.
pub struct Job {
    pub target: Target,
    pub config: Vec<u8>,
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    capstan_common::signing::to_hex(&Sha256::digest(bytes))
}

/// The shell script that reports a host's state as `key=value` lines.
const PROBE: &str = "echo \"uid=$(id -u)\"; \
echo \"hostname=$(hostname)\"; \
echo \"installed=$(dpkg-query -W -f='${db:Status-Abbrev}|${Version}' capstan-agent 2>/dev/null)\"; \
echo \"config=$(sha256sum /etc/capstan/agent.toml 2>/dev/null | cut -d' ' -f1)|$(stat -c %a:%U:%G /etc/capstan/agent.toml 2>/dev/null)\"; \
echo \"enabled=$(systemctl is-enabled capstan-agent 2>/dev/null)\"; \
echo \"active=$(systemctl is-active capstan-agent 2>/dev/null)\"; \
echo \"layout=$(capstan-agent log layout 2>/dev/null)\"";

/// A host's state as [`PROBE`] printed it.
#[derive(Debug, PartialEq, Eq)]
pub struct Probe {
    pub uid: String,
    pub hostname: String,
    pub installed: Option<String>,
    /// `<sha256>|<mode>:<owner>:<group>`, empty parts when the file is missing.
    pub config: String,
    pub enabled: bool,
    pub active: bool,
    /// The log's storage layout (`capstan-agent log layout`: `2`, `none`), empty when
    /// it did not answer (an agent before the command, or none installed).
    pub layout: String,
}

impl Probe {
    /// Parses [`PROBE`]'s output; `None` when a line is missing.
    pub fn parse(text: &str) -> Option<Probe> {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
        };
        let installed = field("installed")?;
        Some(Probe {
            uid: field("uid")?.to_string(),
            hostname: field("hostname")?.to_string(),
            // `ii ` is installed and configured; anything else (half-installed,
            // removed with its conffiles) is installed again.
            installed: installed
                .split_once('|')
                .filter(|(status, _)| status.trim() == "ii")
                .map(|(_, v)| v.to_string()),
            config: field("config")?.to_string(),
            enabled: field("enabled")? == "enabled",
            active: field("active")? == "active",
            // Missing: a probe's line cut short reads as no answer, as does an error.
            layout: field("layout").unwrap_or_default().to_string(),
        })
    }

    /// What the planner needs, given the wanted config's digest.
    pub fn observed(&self, config_sha: &str) -> Observed {
        Observed {
            installed: self.installed.clone(),
            config_same: self.config == format!("{config_sha}|640:root:root"),
            enabled: self.enabled,
            active: self.active,
            log_layout: match self.layout.as_str() {
                "" => LogLayout::Unknown,
                "none" => LogLayout::None,
                layout => LogLayout::In(layout.to_string()),
            },
        }
    }
}

/// The name the agent registers under: the config's `host`, else the host's hostname
/// (the agent's own default).
pub fn registry_name(config: &[u8], hostname: &str) -> Result<String, InstallError> {
    let text = String::from_utf8_lossy(config);
    let value: toml::Table = toml::from_str(&text).map_err(InstallError::Config)?;
    Ok(value
        .get("host")
        .and_then(toml::Value::as_str)
        .unwrap_or(hostname)
        .to_string())
}

/// Progress lines on stderr, prefixed by the host.
fn progress(host: &str, line: &str) {
    eprintln!("{host}: {line}");
}

/// Installs on every job, `concurrency` at a time; each host's outcome, in the jobs'
/// order.
pub async fn install_all(
    install: &Install,
    client: &Client,
    jobs: Vec<Job>,
    concurrency: usize,
) -> Vec<(String, Result<Outcome, InstallError>)> {
    let mut results: Vec<(usize, String, Result<Outcome, InstallError>)> =
        futures::stream::iter(jobs.into_iter().enumerate())
            .map(|(i, job)| async move {
                let label = job.target.host.clone();
                let result = install_one(install, client, &job).await;
                if let Err(e) = &result {
                    progress(&label, &format!("failed: {e}"));
                }
                (i, label, result)
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    results.sort_by_key(|(i, _, _)| *i);
    results.into_iter().map(|(_, l, r)| (l, r)).collect()
}

async fn install_one(
    install: &Install,
    client: &Client,
    job: &Job,
) -> Result<Outcome, InstallError> {
    let t = &job.target;
    progress(&t.host, &format!("connecting to {t}"));
    let session = Session::connect(
        &t.user,
        &t.host,
        t.port,
        install.identity.clone(),
        &install.identity_path,
        install.host_keys.clone(),
        install.connect_timeout,
    )
    .await?;
    let on = OnHost {
        install,
        job,
        session: &session,
        host: &t.host,
    };
    let result = on.install(client).await;
    session.close().await;
    result
}

/// One host's run over its session.
struct OnHost<'a> {
    install: &'a Install,
    job: &'a Job,
    session: &'a Session,
    /// The host as the target names it: the prefix of its progress lines.
    host: &'a str,
}

impl OnHost<'_> {
    fn progress(&self, line: &str) {
        progress(self.host, line);
    }

    /// Runs `command` (named `step` in errors), which must exit 0; its stdout.
    async fn run_ok(
        &self,
        step: &'static str,
        command: &str,
        stdin: &[u8],
    ) -> Result<String, InstallError> {
        let out = self.session.run(command, stdin).await?;
        if out.status != 0 {
            return Err(InstallError::Remote {
                host: self.host.to_string(),
                step,
                status: out.status,
                stderr: out.stderr(),
            });
        }
        Ok(out.stdout())
    }

    /// Probe, upload, plan, carry out, wait for `alive`.
    async fn install(&self, client: &Client) -> Result<Outcome, InstallError> {
        let text = self.run_ok("probe", PROBE, b"").await?;
        let probe = Probe::parse(&text).ok_or_else(|| InstallError::Probe {
            host: self.host.to_string(),
            output: text.clone(),
        })?;
        if probe.uid != "0" {
            return Err(InstallError::NotRoot {
                user: self.job.target.user.clone(),
                host: self.host.to_string(),
                uid: probe.uid,
            });
        }
        let name = registry_name(&self.job.config, &probe.hostname)?;
        let credentials = self.credentials(&name).await?;
        let remote = self.upload().await?;
        let result = self.apply(&probe, &remote).await;
        // Best effort: a leftover in /tmp is harmless, and the result is what matters.
        let _ = self.session.run(&format!("rm -f {remote}"), b"").await;
        let mut outcome = result?;
        if credentials && outcome == Outcome::Unchanged {
            // New credentials and nothing else: the running agent must reconnect.
            self.progress("restarting capstan-agent (its NATS credentials changed)");
            self.run_ok(
                "systemctl restart",
                &format!("systemctl restart {UNIT}"),
                b"",
            )
            .await?;
            outcome = Outcome::Reconfigured;
        }
        self.register(client, &name).await?;
        self.progress(&format!(
            "{outcome}; waiting for {name} to be alive in the registry"
        ));
        wait_alive(client, &name, self.install.timeout).await?;
        self.progress(&format!("{name} is alive"));
        Ok(outcome)
    }

    /// With `--nats-credentials`, puts the host's nkey seed at [`NKEY_PATH`] (0600
    /// root) unless it is there already; true when it wrote it.
    async fn credentials(&self, name: &str) -> Result<bool, InstallError> {
        let Some(dir) = &self.install.nats_credentials else {
            return Ok(false);
        };
        let config: toml::Table = toml::from_str(&String::from_utf8_lossy(&self.job.config))
            .map_err(InstallError::Config)?;
        let nats = config.get("nats").and_then(toml::Value::as_table);
        let names_it = nats.is_some_and(|n| {
            n.get("nkey_seed_file").and_then(toml::Value::as_str) == Some(NKEY_PATH)
                && n.get("host_accounts").and_then(toml::Value::as_bool) == Some(true)
        });
        if !names_it {
            return Err(InstallError::CredentialsUnused {
                name: name.to_string(),
            });
        }
        let path = crate::natsconf::credentials_dir(dir).join(format!("{name}.nk"));
        let seed = std::fs::read(&path).map_err(|source| InstallError::Credentials {
            name: name.to_string(),
            path: path.clone(),
            source,
        })?;
        let there = self
            .session
            .run(&format!("sha256sum {NKEY_PATH} 2>/dev/null"), b"")
            .await?
            .stdout();
        if there.split_whitespace().next() == Some(sha256_hex(&seed).as_str()) {
            self.progress(&format!("{NKEY_PATH} is as wanted"));
            return Ok(false);
        }
        self.progress(&format!("writing {NKEY_PATH}"));
        let tmp = "/etc/capstan/.nats.nk.capstan-install";
        let script = format!(
            "install -d -m 0755 /etc/capstan && rm -f {tmp} && (umask 077; set -C; cat > {tmp}) \
             && chown root:root {tmp} && chmod 0600 {tmp} && mv -f {tmp} {NKEY_PATH}"
        );
        self.run_ok("write the NATS credentials", &script, &seed)
            .await?;
        Ok(true)
    }

    /// Registers the host's key with the coordinator: `capstan-agent host-key` on
    /// the host prints it (making it first if the agent has not yet).
    async fn register(&self, client: &Client, name: &str) -> Result<(), InstallError> {
        let key = self
            .run_ok(
                "capstan-agent host-key",
                &format!("capstan-agent --config {CONFIG_PATH} host-key"),
                b"",
            )
            .await?;
        let key = key.trim();
        client
            .put(
                &format!("/v1/hosts/{name}/keys"),
                &serde_json::json!({ "public_key": key }),
            )
            .await
            .map_err(|source| InstallError::Register {
                name: name.to_string(),
                source,
            })?;
        self.progress(&format!("registered {name}'s host key {key}"));
        Ok(())
    }

    /// Streams the package into a new file in `/tmp` and checks its sha256 there;
    /// returns the file's path.
    async fn upload(&self) -> Result<String, InstallError> {
        let bytes = &self.install.package_bytes;
        let sent = sha256_hex(bytes);
        let mut nonce = [0u8; 8];
        // The name only has to differ from another run's; the file is made with
        // noclobber in root's private umask, so a guessed name cannot be raced.
        getrandom::getrandom(&mut nonce).map_err(InstallError::Random)?;
        let remote = format!(
            "/tmp/capstan-install-{}-{}.deb",
            &sent[..16],
            &sha256_hex(&nonce)[..8]
        );
        self.progress(&format!(
            "uploading {} ({} bytes)",
            self.install.package.display(),
            bytes.len()
        ));
        let write = format!("umask 077; set -C; cat > {remote}");
        self.run_ok("upload", &write, bytes).await?;
        let got = self
            .run_ok("sha256sum", &format!("sha256sum {remote}"), b"")
            .await?;
        let got = got.split_whitespace().next().unwrap_or_default();
        if got != sent {
            return Err(InstallError::Corrupted {
                host: self.host.to_string(),
                got: got.to_string(),
                sent,
            });
        }
        Ok(remote)
    }

    /// Reads the uploaded package's name, version and the log layouts it reads, plans,
    /// and carries it out.
    async fn apply(&self, probe: &Probe, remote: &str) -> Result<Outcome, InstallError> {
        let fields = self
            .run_ok(
                "dpkg-deb -f",
                &format!("dpkg-deb -f {remote} Package Version {LAYOUTS_FIELD}"),
                b"",
            )
            .await?;
        let field = |key: &str| {
            fields
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        if field("Package") != "capstan-agent" {
            return Err(InstallError::NotTheAgent {
                path: self.install.package.clone(),
                package: field("Package"),
            });
        }
        let layouts = field(LAYOUTS_FIELD);
        let wanted = Wanted {
            version: field("Version"),
            layouts: (!layouts.is_empty())
                .then(|| layouts.split_whitespace().map(str::to_string).collect()),
            upgrade: self.install.upgrade,
            allow_downgrade: self.install.allow_downgrade,
        };
        let config_sha = sha256_hex(&self.job.config);
        let plan = plan::plan(&probe.observed(&config_sha), &wanted)?;
        self.carry_out(&plan, remote, &wanted.version).await?;
        Ok(plan.outcome())
    }

    async fn carry_out(
        &self,
        plan: &Plan,
        remote: &str,
        version: &str,
    ) -> Result<(), InstallError> {
        let dpkg = format!(
            "DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold -i {remote}"
        );
        match &plan.package {
            Package::Keep => self.progress(&format!("capstan-agent {version} is installed")),
            Package::Install => {
                self.progress(&format!("installing capstan-agent {version}"));
                self.run_ok("dpkg -i", &dpkg, b"").await?;
            }
            Package::Upgrade { from } | Package::Downgrade { from } => {
                let how = match plan.package {
                    Package::Downgrade { .. } => "downgrading",
                    _ => "upgrading",
                };
                self.progress(&format!(
                    "{how} capstan-agent {from} to {version} (leave-running)"
                ));
                self.run_ok("dpkg -i", &dpkg, b"").await?;
            }
        }
        if plan.write_config {
            self.progress(&format!("writing {CONFIG_PATH}"));
            let tmp = "/etc/capstan/.agent.toml.capstan-install";
            let script = format!(
                "install -d -m 0755 /etc/capstan && rm -f {tmp} && (umask 077; set -C; cat > {tmp}) \
                 && chown root:root {tmp} && chmod 0640 {tmp} && mv -f {tmp} {CONFIG_PATH}"
            );
            self.run_ok("write the config", &script, &self.job.config)
                .await?;
        } else {
            self.progress(&format!("{CONFIG_PATH} is as wanted"));
        }
        if plan.enable {
            self.progress("enabling capstan-agent");
            self.run_ok("systemctl enable", &format!("systemctl enable {UNIT}"), b"")
                .await?;
        }
        match plan.start {
            Start::Nothing => self.progress("capstan-agent runs"),
            Start::Start => {
                self.progress("starting capstan-agent");
                self.run_ok("systemctl start", &format!("systemctl start {UNIT}"), b"")
                    .await?;
            }
            Start::Restart => {
                self.progress("restarting capstan-agent (its config changed)");
                self.run_ok(
                    "systemctl restart",
                    &format!("systemctl restart {UNIT}"),
                    b"",
                )
                .await?;
            }
        }
        Ok(())
    }
}

/// Polls `GET /v1/hosts` until `name` is `alive`, within `timeout`.
pub async fn wait_alive(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<(), InstallError> {
    let deadline = Instant::now() + timeout;
    let mut last = "not registered".to_string();
    loop {
        match client.get("/v1/hosts").await {
            Ok(hosts) => {
                let entry = hosts["hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|h| h["host"] == name);
                if let Some(entry) = entry {
                    if entry["status"] == "alive" {
                        return Ok(());
                    }
                    last = entry["status"].as_str().unwrap_or("?").to_string();
                }
            }
            // The coordinator may answer 503 while its NATS connection comes up: keep
            // asking; anything else (a refused token) will not get better.
            Err(ClientError::Api {
                status: 503,
                message,
                ..
            }) => last = message,
            Err(e) => return Err(InstallError::Coordinator(e)),
        }
        if Instant::now() >= deadline {
            return Err(InstallError::NotAlive {
                name: name.to_string(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reads_an_installed_running_host() {
        let text = "uid=0\nhostname=web-1\ninstalled=ii |0.1.0\nconfig=abc|640:root:root\nenabled=enabled\nactive=active\nlayout=2\n";
        let probe = Probe::parse(text).unwrap();
        assert_eq!(probe.installed.as_deref(), Some("0.1.0"));
        assert_eq!(probe.hostname, "web-1");
        assert_eq!(
            probe.observed("abc"),
            Observed {
                installed: Some("0.1.0".into()),
                config_same: true,
                enabled: true,
                active: true,
                log_layout: LogLayout::In("2".into()),
            }
        );
        assert!(!probe.observed("abd").config_same);
    }

    #[test]
    fn the_probe_reads_a_bare_host_and_a_half_installed_package() {
        let text =
            "uid=1000\nhostname=db\ninstalled=\nconfig=|\nenabled=\nactive=inactive\nlayout=none\n";
        let probe = Probe::parse(text).unwrap();
        assert_eq!(probe.uid, "1000");
        assert_eq!(probe.installed, None);
        assert_eq!(probe.observed("abc").log_layout, LogLayout::None);
        assert!(!probe.enabled && !probe.active);
        assert!(!probe.observed("abc").config_same);
        let removed =
            Probe::parse("uid=0\nhostname=x\ninstalled=rc |0.1.0\nconfig=|\nenabled=\nactive=\n")
                .unwrap();
        assert_eq!(removed.installed, None, "removed, its conffiles kept");
        assert_eq!(
            removed.observed("abc").log_layout,
            LogLayout::Unknown,
            "no `capstan-agent log layout` answered"
        );
        let wrong_mode = Probe::parse(
            "uid=0\nhostname=x\ninstalled=\nconfig=abc|644:root:root\nenabled=\nactive=\n",
        )
        .unwrap();
        assert!(!wrong_mode.observed("abc").config_same);
        assert_eq!(Probe::parse("uid=0\nhostname=x\n"), None);
    }

    #[test]
    fn the_registry_name_is_the_configs_host_else_the_hostname() {
        assert_eq!(
            registry_name(b"host = \"web-1\"\ndriver = \"sim\"\n", "h").unwrap(),
            "web-1"
        );
        assert_eq!(registry_name(b"driver = \"sim\"\n", "h").unwrap(), "h");
        assert!(matches!(
            registry_name(b"host = ", "h"),
            Err(InstallError::Config(_))
        ));
    }

    #[test]
    fn sha256_hex_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

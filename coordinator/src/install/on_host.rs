//! One host's install over its SSH session: connect, probe, upload, plan, carry the
//! plan out, register the host's key and wait for `alive`.

use super::name;
use super::plan::{self, Outcome, Package, Plan, Start, Wanted};
use super::probe::{Probe, PROBE};
use super::ssh::Session;
use super::{
    progress, sha256_hex, wait_alive, Install, InstallError, Job, CONFIG_PATH, LAYOUTS_FIELD,
    NKEY_PATH, UNIT,
};
use crate::client::Client;

pub(super) async fn install_one(
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
        // The name is the operator's; the host's own only has to agree with it.
        name::agrees(&self.job.name, &probe.hostname)?;
        let name = self.job.name.name.as_str();
        let credentials = self.credentials(name).await?;
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
        self.register(client, name).await?;
        self.progress(&format!(
            "{outcome}; waiting for {name} to be alive (its beat heard)"
        ));
        wait_alive(client, name, self.install.timeout).await?;
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

//! An agent's configuration: [`AgentBuilder`] (from [`Agent::builder`]) and the
//! `agent.toml` it writes, at build and on [`Agent::reconfigure`].

use super::Agent;
use crate::hooks::Hook;
use std::cell::Cell;
use std::path::{Path, PathBuf};

/// The agent's driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    Sim,
    /// A test engine ([`crate::docker::Engine`]), `pull_policy = "never"`.
    Docker {
        engine: crate::docker::Engine,
        reap_orphans: bool,
    },
    /// A test's [`crate::systemd::SystemdHost`]: its bus, unit dir and state dir.
    Systemd(Systemd),
    /// A driver process behind this socket (`driver = "external"`), e.g. a
    /// [`crate::external::SimDriver`].
    External {
        socket: PathBuf,
    },
    /// The kube driver on a test's [`crate::kube::KubeCluster`], through this
    /// kubeconfig (e.g. [`crate::kube::KubeCluster::agent_kubeconfig`]).
    Kube {
        kubeconfig: PathBuf,
    },
    /// The VM driver on a test's [`crate::vm::VmHost`]: its images, state and run dirs
    /// and stop timeout.
    Vm(capstan_vm::VmConfig),
}

/// The `[systemd]` section of an agent on a [`crate::systemd::SystemdHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Systemd {
    pub bus: String,
    pub unit_dir: PathBuf,
    pub state_dir: PathBuf,
    pub manage_lifecycle: bool,
    /// `start_limit_burst` and `restart_sec_ms`; `None`: the driver's defaults.
    pub tuning: Option<(u32, u32)>,
}

/// An agent's configuration; [`AgentBuilder::build`] writes it.
#[derive(Debug, Clone)]
pub struct AgentBuilder {
    host: String,
    pub(super) driver: Driver,
    hooks: Vec<Hook>,
    /// The NATS server's URL.
    pub(super) nats: Option<String>,
    /// More `[nats]` lines: credentials, `replicas`.
    nats_auth: String,
    /// The coordinator's public key.
    signing: Option<String>,
    /// `[metrics] listen`; `None`: `enabled = false`. By default port 0 (a free port,
    /// logged: [`metrics_address`](super::metrics_address)), so that parallel agents never collide.
    metrics: Option<String>,
    /// More config sections, appended last (`[log.retention]`, …).
    extra: String,
    /// A coordinator (its URL and a `submit` token) to register the host's key with
    /// when the agent is built.
    register: Option<(String, String)>,
    /// `reconcile_interval_secs`; `None`: the config's default.
    reconcile_every: Option<u64>,
}

impl AgentBuilder {
    /// The host this agent is for.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Appends `text` (whole TOML tables) to `agent.toml`.
    pub fn extra_toml(mut self, text: &str) -> AgentBuilder {
        self.extra.push_str(text);
        self.extra.push('\n');
        self
    }

    /// The docker driver on test engine `engine`.
    pub fn docker(mut self, engine: crate::docker::Engine) -> AgentBuilder {
        self.driver = Driver::Docker {
            engine,
            reap_orphans: false,
        };
        self
    }

    /// An external driver listening on `socket` (`[external] socket`).
    pub fn external(mut self, socket: &Path) -> AgentBuilder {
        self.driver = Driver::External {
            socket: socket.to_path_buf(),
        };
        self
    }

    /// The kube driver through `kubeconfig` (rollouts waited on for at most 60 s).
    pub fn kube(mut self, kubeconfig: &Path) -> AgentBuilder {
        self.driver = Driver::Kube {
            kubeconfig: kubeconfig.to_path_buf(),
        };
        self
    }

    /// The VM driver on `vms` (its images, state and run dirs: QEMUs the test leaves
    /// are killed with it).
    pub fn vm(mut self, vms: &crate::vm::VmHost) -> AgentBuilder {
        let mut config = vms.config.clone();
        config.run_dir = Some(vms.run_dir());
        self.driver = Driver::Vm(config);
        self
    }

    /// `reconcile_interval_secs`: how often the running agent looks at its host.
    pub fn reconcile_every(mut self, secs: u64) -> AgentBuilder {
        self.reconcile_every = Some(secs);
        self
    }

    /// `reap_orphans` for the docker or the VM driver.
    pub fn reap_orphans(mut self, reap: bool) -> AgentBuilder {
        if let Driver::Vm(vm) = &mut self.driver {
            vm.reap_orphans = reap;
            return self;
        }
        let Driver::Docker { engine, .. } = self.driver else {
            panic!("reap_orphans is a docker or vm setting");
        };
        self.driver = Driver::Docker {
            engine,
            reap_orphans: reap,
        };
        self
    }

    /// The systemd driver on `host` (`manage_lifecycle = false`, the driver's
    /// default). Call it again after a reboot of `host` (its bus moves).
    pub fn systemd(mut self, host: &crate::systemd::SystemdHost) -> AgentBuilder {
        let (manage_lifecycle, tuning) = match &self.driver {
            Driver::Systemd(s) => (s.manage_lifecycle, s.tuning),
            _ => (false, None),
        };
        self.driver = Driver::Systemd(Systemd {
            bus: host.bus_address(),
            unit_dir: host.unit_dir(),
            state_dir: host.state_dir(),
            manage_lifecycle,
            tuning,
        });
        self
    }

    /// `manage_lifecycle` for the systemd driver.
    pub fn systemd_lifecycle(mut self, manage: bool) -> AgentBuilder {
        self.systemd_settings().manage_lifecycle = manage;
        self
    }

    /// `start_limit_burst` and `restart_sec_ms` for the systemd driver.
    pub fn systemd_tuning(mut self, start_limit_burst: u32, restart_sec_ms: u32) -> AgentBuilder {
        self.systemd_settings().tuning = Some((start_limit_burst, restart_sec_ms));
        self
    }

    fn systemd_settings(&mut self) -> &mut Systemd {
        match &mut self.driver {
            Driver::Systemd(s) => s,
            _ => panic!("systemd(host) first"),
        }
    }

    /// Adds an exec hook owner (called in the order added).
    pub fn hook(mut self, hook: Hook) -> AgentBuilder {
        self.hooks.push(hook);
        self
    }

    /// No hook owners.
    pub fn without_hooks(mut self) -> AgentBuilder {
        self.hooks.clear();
        self
    }

    /// A `[nats]` section: `run` takes commands from the server at `url`.
    pub fn nats(mut self, url: &str) -> AgentBuilder {
        self.nats = Some(url.to_string());
        self
    }

    /// NATS credentials (after [`AgentBuilder::nats`]).
    pub fn nats_user(self, user: &str, password: &str) -> AgentBuilder {
        self.nats_extra(&format!("user = {user:?}\npassword = {password:?}"))
    }

    /// More `[nats]` lines (after [`AgentBuilder::nats`]): `replicas = 3`, …
    pub fn nats_extra(mut self, lines: &str) -> AgentBuilder {
        assert!(self.nats.is_some(), "nats() first");
        self.nats_auth.push_str(lines);
        self.nats_auth.push('\n');
        self
    }

    /// A `[signing]` section trusting `public_key` (commands up to 10 min old).
    pub fn signing(mut self, public_key: &str) -> AgentBuilder {
        self.signing = Some(public_key.to_string());
        self
    }

    /// Registers the host's key (made when the agent is built, as its first start
    /// would) with the coordinator at `url`, with the `submit` token `token`: what a
    /// coordinator checks everything the host publishes against.
    pub fn registered_with(mut self, url: &str, token: &str) -> AgentBuilder {
        self.register = Some((url.to_string(), token.to_string()));
        self
    }

    /// `[metrics] listen = addr`, or with `None`, `enabled = false`.
    pub fn metrics(mut self, listen: Option<&str>) -> AgentBuilder {
        self.metrics = listen.map(Into::into);
        self
    }

    /// Creates the agent's temp dir and writes its config and hook scripts.
    pub fn build(self) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        self.build_with(dir)
    }

    /// [`AgentBuilder::build`] with the agent's dir made under `parent` (e.g. a
    /// [`crate::systemd::SystemdHost::dir`], so that its paths are valid inside).
    pub fn build_in(self, parent: &Path) -> Agent {
        let dir = tempfile::tempdir_in(parent).expect("temp dir");
        self.build_with(dir)
    }

    fn build_with(self, dir: tempfile::TempDir) -> Agent {
        let agent = Agent {
            dir,
            host: self.host.clone(),
            config: self.clone(),
            runs: Cell::new(0),
            inputs: Cell::new(0),
        };
        agent.write_config();
        if let Some((url, token)) = &self.register {
            agent.register(url, token);
        }
        agent
    }

    fn toml(&self, dir: &Path) -> String {
        let mut toml = String::new();
        let mut add = |text: &str| toml.push_str(text);
        if let Some(secs) = self.reconcile_every {
            add(&format!("reconcile_interval_secs = {secs}\n"));
        }
        match &self.driver {
            Driver::Sim => add("driver = \"sim\"\n"),
            Driver::Docker {
                engine,
                reap_orphans,
            } => add(&format!(
                "driver = \"docker\"\n[docker]\nsocket = {:?}\npull_policy = \"never\"\n\
                 reap_orphans = {reap_orphans}\nstop_timeout_secs = 10\n",
                engine.socket()
            )),
            Driver::External { socket } => add(&format!(
                "driver = \"external\"\n[external]\nsocket = {:?}\n",
                socket.display().to_string()
            )),
            Driver::Kube { kubeconfig } => add(&format!(
                "driver = \"kube\"\n[kube]\nkubeconfig = {:?}\nrollout_timeout_secs = 60\n",
                kubeconfig.display().to_string()
            )),
            Driver::Vm(vm) => add(&format!(
                "driver = \"vm\"\n[vm]\nimages_dir = {:?}\nstate_dir = {:?}\nrun_dir = {:?}\n\
                 stop_timeout_secs = {}\nreap_orphans = {}\n",
                vm.images_dir.display().to_string(),
                vm.state_dir
                    .as_deref()
                    .expect("a VmHost's state dir")
                    .display()
                    .to_string(),
                vm.run_dir
                    .as_deref()
                    .expect("a VmHost's run dir")
                    .display()
                    .to_string(),
                vm.stop_timeout_secs,
                vm.reap_orphans
            )),
            Driver::Systemd(s) => {
                add(&format!(
                    "driver = \"systemd\"\n[systemd]\nbus = {:?}\nunit_dir = {:?}\n\
                     state_dir = {:?}\nmanage_lifecycle = {}\n",
                    s.bus,
                    s.unit_dir.display().to_string(),
                    s.state_dir.display().to_string(),
                    s.manage_lifecycle
                ));
                if let Some((burst, restart_ms)) = s.tuning {
                    add(&format!(
                        "start_limit_burst = {burst}\nrestart_sec_ms = {restart_ms}\n"
                    ));
                }
            }
        }
        for hook in &self.hooks {
            add(&hook.install(dir));
        }
        if let Some(url) = &self.nats {
            add(&format!("[nats]\nurl = {url:?}\n{}", self.nats_auth));
        }
        if let Some(key) = &self.signing {
            add(&format!(
                "[signing]\npublic_keys = [{key:?}]\nmax_age_secs = 600\n"
            ));
        }
        match &self.metrics {
            Some(listen) => add(&format!("[metrics]\nlisten = {listen:?}\n")),
            None => add("[metrics]\nenabled = false\n"),
        }
        add(&self.extra);
        toml
    }
}

impl Agent {
    /// An agent for `host` on the sim driver; add the rest, then `build()`.
    pub fn builder(host: &str) -> AgentBuilder {
        crate::watchdog::watch();
        AgentBuilder {
            host: host.to_string(),
            driver: Driver::Sim,
            hooks: Vec::new(),
            nats: None,
            nats_auth: String::new(),
            signing: None,
            metrics: Some("127.0.0.1:0".into()),
            extra: String::new(),
            register: None,
            reconcile_every: None,
        }
    }

    /// Changes the config (for the next process started): `change` gets the current
    /// one.
    pub fn reconfigure(&mut self, change: impl FnOnce(AgentBuilder) -> AgentBuilder) {
        self.config = change(self.config.clone());
        assert_eq!(self.config.host, self.host, "the host stays");
        self.write_config();
    }

    fn write_config(&self) {
        std::fs::write(self.config_file(), self.config.toml(self.dir.path()))
            .expect("write agent.toml");
    }
}

//! What the processes authenticate with: the nats-server accounts and nkeys of
//! `capstan-coordinator nats-config` ([`Accounts`]), a signing key pair ([`Keys`]).

use std::path::PathBuf;
use std::process::Command;

/// A nats-server config with an account per host (`capstan-coordinator
/// nats-config`), its nkeys in its own temp dir.
pub struct Accounts {
    dir: tempfile::TempDir,
    shard_quota: String,
    fleet_quota: String,
    hosts_per_shard: Option<u32>,
}

impl Accounts {
    /// For `hosts`, in storage shards of the default size (so a test's few hosts
    /// share one), each shard with a quota of `shard_quota` (`64M`, …), and the fleet
    /// account at its smallest (`2G`): what a test writes fits, and a smaller quota is
    /// found full sooner. (The test servers' own store is bounded by a set limit, not
    /// the disk: [`capstan_testsupport::store_limited_config`].)
    pub fn generate(hosts: &[&str], shard_quota: &str) -> Accounts {
        Accounts::generate_with(hosts, shard_quota, "2G")
    }

    /// [`Accounts::generate`] with the fleet account's quota `fleet_quota`: on a
    /// cluster with `replicas = 3` the fleet's streams reserve three times their
    /// `max_bytes` (the command stream alone 3 GiB).
    pub fn generate_with(hosts: &[&str], shard_quota: &str, fleet_quota: &str) -> Accounts {
        Accounts::generate_sharded(hosts, shard_quota, fleet_quota, None)
    }

    /// [`Accounts::generate_with`], `hosts_per_shard` hosts to a shard (`None`: the
    /// default).
    pub fn generate_sharded(
        hosts: &[&str],
        shard_quota: &str,
        fleet_quota: &str,
        hosts_per_shard: Option<u32>,
    ) -> Accounts {
        let accounts = Accounts {
            dir: tempfile::tempdir().expect("accounts dir"),
            shard_quota: shard_quota.to_string(),
            fleet_quota: fleet_quota.to_string(),
            hosts_per_shard,
        };
        accounts.regenerate(hosts);
        accounts
    }

    /// `nats-config` again into the same dir, for `hosts` (the keys of those already
    /// there kept), as an operator adds hosts; the server then reloads it.
    pub fn regenerate(&self, hosts: &[&str]) {
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.arg("nats-config").arg("--out").arg(self.dir.path());
        c.args(["--shard-quota", &self.shard_quota]);
        c.args(["--fleet-quota", &self.fleet_quota]);
        if let Some(n) = self.hosts_per_shard {
            c.args(["--hosts-per-shard", &n.to_string()]);
        }
        for h in hosts {
            c.args(["--host", h]);
        }
        let out = crate::process::output("capstan-coordinator nats-config", crate::READY, c);
        assert!(
            out.status.success(),
            "nats-config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Each shard's quota from the next [`Accounts::regenerate`] on (an operator
    /// raising it: `docs/nats.md`, *Storage shards*).
    pub fn set_shard_quota(&mut self, quota: &str) {
        self.shard_quota = quota.to_string();
    }

    /// The shards file (`<host> <shard>` lines), for a test to move a host as an
    /// operator would.
    pub fn shards_file(&self) -> PathBuf {
        self.dir.path().join("shards")
    }

    /// The server config.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("nats-server.conf")
    }

    /// The nkey seed file of `user` (a host, `coordinator` or `coordinator-hosts`).
    pub fn seed_file(&self, user: &str) -> PathBuf {
        self.credentials_dir().join(format!("{user}.nk"))
    }

    /// Where every user's seed file is (`<user>.nk`): `sim-fleet --nats-credentials`.
    pub fn credentials_dir(&self) -> PathBuf {
        self.dir.path().join("credentials")
    }

    /// The nkey seed of `user`.
    pub fn seed(&self, user: &str) -> String {
        std::fs::read_to_string(self.seed_file(user))
            .expect("seed")
            .trim()
            .to_string()
    }

    /// The `[nats]` lines of `user`'s config (agent or coordinator: a coordinator's
    /// with its second seed, `coordinator-hosts`).
    pub fn nats_lines(&self, user: &str) -> String {
        let mut lines = format!(
            "nkey_seed_file = {:?}\nhost_accounts = true",
            self.seed_file(user).display().to_string()
        );
        if user == "coordinator" {
            lines.push_str(&format!(
                "\nhosts_nkey_seed_file = {:?}",
                self.seed_file("coordinator-hosts").display().to_string()
            ));
        }
        lines
    }
}

/// A signing key pair in a temp dir.
pub struct Keys {
    dir: tempfile::TempDir,
    pub public: String,
}

impl Keys {
    pub fn generate() -> Keys {
        let dir = tempfile::tempdir().expect("key dir");
        let mut c = Command::new(crate::binary("capstan-coordinator"));
        c.arg("keygen")
            .arg("--out")
            .arg(dir.path().join("signing.key"));
        let out = crate::process::output("capstan-coordinator keygen", crate::READY, c);
        assert!(out.status.success(), "keygen failed");
        Keys {
            public: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            dir,
        }
    }

    pub fn secret_file(&self) -> PathBuf {
        self.dir.path().join("signing.key")
    }

    pub fn secret_hex(&self) -> String {
        std::fs::read_to_string(self.secret_file())
            .expect("key")
            .trim()
            .to_string()
    }
}

//! What a host holds, as the probe script reports it: [`Probe`], and what the planner
//! needs of it ([`Observed`]).

use super::plan::{LogLayout, Observed};

/// The shell script that reports a host's state as `key=value` lines.
pub(super) const PROBE: &str = "echo \"uid=$(id -u)\"; \
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
}

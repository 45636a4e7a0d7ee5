//! The sim's settings (`[sim]` in the agent config): the capabilities it declares and
//! the failures it is scripted to inject.

use crate::Capabilities;
use serde::{Deserialize, Serialize};

/// Sim driver settings (`[sim]` in the agent config). The capability keys are what
/// the sim declares ([`Capabilities`]); the defaults are the sim's historical set:
/// the agent manages lifecycle, no exits are reported, nothing is restarted or reaped.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Declare that the agent manages workload lifecycle (like docker). Default true.
    #[serde(default = "yes")]
    pub manages_lifecycle: bool,
    /// Report exits through [`Driver::watch_exits`](crate::Driver::watch_exits). Default false.
    #[serde(default)]
    pub reports_exits: bool,
    /// Declare that the agent restarts what exits (docker); false: the backend would
    /// restart its own (systemd, kube). Default false.
    #[serde(default)]
    pub restarts_exits: bool,
    /// Declare that startup drift is removed, not only reported. Default false.
    #[serde(default)]
    pub reaps_orphans: bool,
    /// Declare that readiness checks are carried out (answered from the scripted
    /// `probe` failures). Default true.
    #[serde(default = "yes")]
    pub probes: bool,
    /// Failures to inject, checked in order.
    #[serde(default)]
    pub failures: Vec<ScriptedFailure>,
}

fn yes() -> bool {
    true
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::declaring(Capabilities {
            manages_lifecycle: true,
            reports_exits: false,
            restarts_exits: false,
            reaps_orphans: false,
            probes: true,
        })
    }
}

impl SimConfig {
    /// A sim that declares `capabilities` (to stand in for another driver), with no
    /// scripted failures.
    pub fn declaring(capabilities: Capabilities) -> SimConfig {
        let Capabilities {
            manages_lifecycle,
            reports_exits,
            restarts_exits,
            reaps_orphans,
            probes,
        } = capabilities;
        SimConfig {
            manages_lifecycle,
            reports_exits,
            restarts_exits,
            reaps_orphans,
            probes,
            failures: Vec::new(),
        }
    }
}

/// Fail operation `op` (`ensure_namespace`, `activate`, `start`, …; `probe`: not ready)
/// on matching objects, `times` times (for ever when absent).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFailure {
    pub op: String,
    pub namespace: Option<String>,
    pub workload: Option<String>,
    pub revision: Option<String>,
    pub times: Option<u32>,
    /// When it fires on an existing revision, the backend also gives up on that
    /// revision: it is left `failed` with this reason (e.g. `start-limit-hit`) until a
    /// command starts it again.
    pub gives_up: Option<String>,
}

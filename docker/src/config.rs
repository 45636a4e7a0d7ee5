//! The docker driver's settings (`[docker]` in the agent config).

use serde::Deserialize;

/// The standard docker socket.
pub const DEFAULT_SOCKET: &str = "unix:///var/run/docker.sock";

/// Docker driver settings (`[docker]` in the agent config).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The engine's socket, `unix:///path`.
    #[serde(default = "default_socket")]
    pub socket: String,
    #[serde(default)]
    pub pull_policy: PullPolicy,
    /// Remove containers labelled as this host's that intent does not know (drift).
    /// Off by default: drift is only reported.
    #[serde(default)]
    pub reap_orphans: bool,
    /// Seconds a container gets between SIGTERM and SIGKILL when stopped.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
}

fn default_socket() -> String {
    DEFAULT_SOCKET.into()
}

fn default_stop_timeout() -> u32 {
    10
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            socket: default_socket(),
            pull_policy: PullPolicy::default(),
            reap_orphans: false,
            stop_timeout_secs: default_stop_timeout(),
        }
    }
}

/// Whether `prepare_revision` may pull a missing image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// The image must already be on the host (`image_not_found` otherwise).
    Never,
    /// Pull it when it is not on the host.
    #[default]
    IfNotPresent,
}

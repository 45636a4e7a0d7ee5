//! `[kube]` in the agent config.

use serde::Deserialize;
use std::path::PathBuf;

/// kube driver settings (`[kube]` in the agent config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeConfig {
    /// The kubeconfig to use; absent: `$KUBECONFIG`, `~/.kube/config`, else the
    /// in-cluster ServiceAccount (kube-rs's `Config::infer`).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; absent: its current context.
    #[serde(default)]
    pub context: Option<String>,
    /// How long `activate`/`start` wait for a rollout to complete before the command
    /// fails `rollout_timeout` (retryable: the rollout goes on in the cluster).
    #[serde(default = "default_rollout_timeout")]
    pub rollout_timeout_secs: u32,
    /// `spec.progressDeadlineSeconds` of every Deployment: after this long without
    /// progress the cluster marks the rollout `ProgressDeadlineExceeded`.
    #[serde(default = "default_progress_deadline")]
    pub progress_deadline_secs: u32,
}

fn default_rollout_timeout() -> u32 {
    300
}

fn default_progress_deadline() -> u32 {
    600
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            kubeconfig: None,
            context: None,
            rollout_timeout_secs: default_rollout_timeout(),
            progress_deadline_secs: default_progress_deadline(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_section_is_the_default_and_unknown_keys_are_refused() {
        let empty: KubeConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, KubeConfig::default());
        assert!(serde_json::from_str::<KubeConfig>(r#"{"kube_config":"/x"}"#).is_err());
    }
}

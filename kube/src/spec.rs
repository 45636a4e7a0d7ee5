//! The kube driver's own part of a spec: its section ([`KubeSpec`], under `"kube"`)
//! and its rules (an image, no host mounts, 1 to [`MAX_REPLICAS`] replicas).

use capstan_common::{DriverKind, ErrorCode, Rejection, Settings, Spec};
use serde::{Deserialize, Serialize};

/// The most replicas a spec may ask for.
pub const MAX_REPLICAS: u32 = 1000;

/// A Kubernetes workload's own settings, the spec's `"kube"` section (`docs/kube.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// The pods the Deployment runs when the workload runs (1 to 1000);
    /// `start_workload` scales back to this.
    #[serde(default = "one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

impl Default for KubeSpec {
    fn default() -> Self {
        KubeSpec { replicas: one() }
    }
}

impl Settings for KubeSpec {
    const KIND: DriverKind = DriverKind::KUBE;
}

/// The kube driver's rules for a spec of its own: an image to run, no host mounts, a
/// section it can read with 1 to [`MAX_REPLICAS`] replicas. Answers the settings.
pub fn check(spec: &Spec) -> Result<KubeSpec, Rejection> {
    let invalid = |m: String| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    if spec.image.is_none() {
        return invalid("a kube workload needs an image".into());
    }
    if !spec.mounts.is_empty() {
        return invalid("the kube driver does not mount host paths".into());
    }
    let settings = match KubeSpec::read(spec) {
        Ok(settings) => settings,
        Err(e) => return invalid(format!("`kube`: {e}")),
    };
    if !(1..=MAX_REPLICAS).contains(&settings.replicas) {
        return invalid(format!("kube.replicas must be 1 to {MAX_REPLICAS}"));
    }
    Ok(settings)
}

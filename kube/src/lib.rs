//! The kube driver: the cluster agent's workloads as Deployments in one Kubernetes
//! cluster, through kube-rs. The agent's host name is the cluster's name. A namespace
//! is a Namespace labelled ours (`io.capstan.managed`, `io.capstan.host`); a workload
//! is a Deployment `capstan-<workload>` written with server-side apply (field manager
//! `capstan`), its revision in a label and an annotation of it and of its pod
//! template; a prepared revision is a ConfigMap `capstan-<workload>-<revision>`
//! holding its spec. The cluster owns the workloads' lifecycle: the agent's own stop
//! and start touch nothing. See docs/kube.md.
//!
//! k8s-openapi is used without a Kubernetes version feature: the binary that links
//! this crate chooses it (`v1_33`, the oldest API supported).

#[cfg(feature = "driver")]
mod config;
#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
pub mod objects;
pub mod spec;
#[cfg(all(feature = "driver", feature = "testing"))]
pub mod test_hooks;

#[cfg(feature = "driver")]
pub use config::KubeConfig;
#[cfg(feature = "driver")]
pub use driver::KubeDriver;
pub use spec::KubeSpec;

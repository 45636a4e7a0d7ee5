//! The kube side: a real control plane per test ([`capstan_tests::kube::KubeCluster`]:
//! etcd, kube-apiserver with RBAC, kube-controller-manager, built by `.ci/kube.sh`)
//! and the node stand-in that plays the kubelet.

mod agent;
mod conflict;
mod contract;
mod crash;
mod driver;
mod grants;
mod node;
mod readiness;
mod smoke;
mod values;

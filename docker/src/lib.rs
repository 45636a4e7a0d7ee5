//! The docker driver: workloads as containers, through the Docker Engine API
//! (bollard). A namespace is a bridge network `capstan-<ns>`; a revision is one
//! container, created by `prepare` and started by `activate`/`start`. Everything is
//! found again by its labels (see [`naming`]), never by name alone, and only objects
//! labelled with this agent's host are ever changed. What engines answer differently
//! (podman's Docker-compatible API) is read raw, in [`engine`].

mod config;
#[cfg(feature = "driver")]
mod container;
#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
pub mod engine;
#[cfg(feature = "driver")]
pub mod naming;
#[cfg(feature = "driver")]
mod network;
#[cfg(feature = "driver")]
mod probe;
mod spec;

pub use config::{DockerConfig, PullPolicy, DEFAULT_SOCKET};
#[cfg(feature = "driver")]
pub use driver::DockerDriver;
#[cfg(feature = "driver")]
use driver::{backend, gone_is_done, status};
pub use spec::check_spec;

//! capstan-agent: the node agent.
//!
//! Commands arrive (`apply`, or NATS through [`transport`]), are written down
//! ([`log`]), decided ([`intent`]: the fold, [`plan`]: the decisions), carried out
//! ([`executor`] through a driver: [`capstan_driver`], composed in [`drivers`]), and reported (the log is the outbox;
//! [`metrics`] counts what happened, for `/metrics` and the heartbeat).

pub mod config;
pub mod daemon;
pub mod drivers;
pub mod event;
pub mod executor;
pub mod grants;
pub mod hooks;
pub mod host_key;
pub mod intent;
pub mod local_socket;
pub mod log;
pub mod metrics;
pub mod plan;
pub mod sim_fleet;
pub mod supervise;
pub mod transport;

#[cfg(test)]
mod testkit;

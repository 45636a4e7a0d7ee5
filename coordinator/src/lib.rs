//! capstan coordinator: an HTTP/JSON API for the controller over the fleet's NATS
//! streams ([`fleet`], [`api`]), and the HTTP client the `capstan` CLI uses
//! ([`client`], and [`rollout`]: one command to many hosts). It keeps no local state; API tokens ([`auth`]) come from a file.

pub mod answers;
pub mod api;
pub mod auth;
pub mod client;
pub mod config;
pub mod fleet;
pub mod guard;
pub mod install;
pub mod metrics;
pub mod natsconf;
pub mod rollout;
pub mod spec_rules;
pub mod verify;

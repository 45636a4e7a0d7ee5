//! The systemd driver: workloads as systemd units, managed over systemd's D-Bus API
//! (zbus), never by running `systemctl`. A namespace is a slice `capstan-<ns>.slice`
//! plus a state directory; a revision is one service unit, written by `prepare` and
//! started by `activate`/`start`, with the launch environment in a drop-in written
//! before every (re)start. Units are found again by the `X-Capstan-*` markers the
//! driver writes into them, and a unit without them is never touched.

pub mod bus;
mod config;
mod driver;
pub mod escape;
pub mod files;
pub mod naming;
pub mod unit;

pub use config::SystemdConfig;
pub use driver::SystemdDriver;

//! The systemd driver: workloads as systemd units, managed over systemd's D-Bus API
//! (zbus), never by running `systemctl`. A namespace is a slice `capstan-<ns>.slice`
//! plus a state directory; a revision is one service unit, written by `prepare` and
//! started by `activate`/`start`, with the launch environment in a drop-in written
//! before every (re)start. Units are found again by the `X-Capstan-*` markers the
//! driver writes into them, and a unit without them is never touched.

#[cfg(feature = "driver")]
pub mod bus;
#[cfg(feature = "driver")]
mod config;
#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
pub mod escape;
#[cfg(feature = "driver")]
pub mod files;
#[cfg(feature = "driver")]
pub mod naming;
pub mod spec;
#[cfg(feature = "driver")]
pub mod unit;

#[cfg(feature = "driver")]
pub use config::SystemdConfig;
#[cfg(feature = "driver")]
pub use driver::SystemdDriver;
pub use spec::SystemdSpec;

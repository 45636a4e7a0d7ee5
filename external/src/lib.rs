//! External drivers: a driver in a process of its own, behind a Unix socket, speaking
//! the protocol of `docs/driver-protocol.md` (JSON lines, versioned, capabilities
//! negotiated in a hello). [`ExternalDriver`] is the agent's side, a
//! [`capstan_driver::Driver`] like the built-in ones; [`serve`] is the driver's side,
//! exposing any `Driver` over the protocol; `capstan-sim-driver` serves the sim
//! driver that way.

pub mod client;
pub mod config;
pub mod server;
pub mod wire;

pub use client::{ConnectError, ExternalDriver};
pub use config::{ExternalConfig, ExternalConfigError};
pub use server::serve;

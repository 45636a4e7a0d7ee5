//! The agent with `driver = "external"`, talking to the standalone sim driver
//! (`capstan-sim-driver`) over its socket: a driver that goes away mid-command, and
//! the shutdown sweep following the capabilities the driver announced, a signal
//! during the agent's startup, and readiness probes over the socket when the driver
//! announces `probes`.

mod gone;
mod lifecycle;
mod readiness;
mod startup;

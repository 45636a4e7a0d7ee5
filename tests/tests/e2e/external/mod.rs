//! The agent with `driver = "external"`, talking to the standalone sim driver
//! (`capstan-sim-driver`) over its socket: a driver that goes away mid-command, and
//! the shutdown sweep following the capabilities the driver announced, a signal
//! during the agent's startup.

mod gone;
mod lifecycle;
mod startup;

//! The agent alone on the sim driver: crash safety, tamper evidence, bad input.

mod bad_input;
mod crash;
mod layout;
mod local_reads;
pub(crate) mod retention;
mod stop;
mod tamper;

//! capstan wire protocol, version 1.
//!
//! Everything that crosses a process boundary between the coordinator, the agents and
//! the operator's tools is defined here: [`Command`]s (what to do), [`CommandResult`]s
//! (what happened), and the stable [`ErrorCode`]s both sides match on. Parsing and
//! validation live together so that every consumer rejects bad input the same way.
//! The format is documented, with examples, in `docs/protocol.md`.

pub mod answers;
pub mod audit_table;
mod command;
mod error;
pub mod files;
#[cfg(feature = "nats")]
pub mod nats;
pub mod nats_layout;
mod outcome;
mod phase;
pub mod published;
pub mod readiness;
mod report;
#[cfg(feature = "service")]
pub mod service;
pub mod signing;
pub mod status;
pub mod validate;

pub use command::{
    is_kind_name, json_error_at, salvage_id, workload_key, BadKind, Command, DriverKind, Mount, Op,
    PortMapping, Protocol, Section, Sections, Settings, Spec, Strategy, WorkloadRef, KNOWN_OPS,
    MAX_COMMAND_BYTES, MAX_KIND_LEN, PROTOCOL_VERSION,
};
pub use error::{ErrorCode, Rejection};
pub use outcome::{CommandResult, Outcome};
pub use phase::Phase;
pub use readiness::{Check, Readiness};
pub use report::report;

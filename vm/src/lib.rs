//! The VM driver: workloads as QEMU virtual machines. A namespace is a directory; a
//! revision is its files (spec, launch environment, disk overlay, console log, exit
//! record), made by `prepare`, and one daemonized QEMU process, started by
//! `activate`/`start`/`resume` and controlled over QMP. The launch environment and the
//! spec's `command` reach the guest byte for byte through fw_cfg, never on a command
//! line. `docs/vm.md` is the operator's and image builder's guide.

mod config;
#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
mod exits;
#[cfg(feature = "driver")]
pub mod launch;
#[cfg(feature = "driver")]
mod process;
#[cfg(feature = "driver")]
pub mod qmp;
pub mod spec;

pub use config::{VmConfig, DEFAULT_IMAGES_DIR};
#[cfg(feature = "driver")]
pub use driver::{VmDriver, VmError};

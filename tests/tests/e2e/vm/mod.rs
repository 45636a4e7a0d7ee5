//! The VM driver against real QEMU (TCG) and the test guest of `.ci/vmguest.sh`.

mod agent;
mod contract;
mod guest;
mod hostile;
mod systemd;

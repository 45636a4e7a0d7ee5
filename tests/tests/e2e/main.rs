//! capstan's end-to-end tests, as one test binary: the real `capstan-agent`,
//! `capstan-coordinator` and `capstan` binaries (built first: `cargo build --workspace
//! --bins`) against real services — the private dockerd of `.ci/services.sh`, a
//! nats-server per test and a systemd per test (`capstan_tests::systemd`). Harness:
//! the `capstan_tests` library (`tests/harness/`).
//!
//! Run a group with a filter: `cargo test -p capstan-tests --test e2e docker::` (every
//! test that needs dockerd, `hooks::docker` included), `nats::`, `hooks::`, `core::`,
//! `systemd::`, `external::` (the standalone sim driver over its socket), `kube::` (a
//! real kube-apiserver per test, `capstan_tests::kube`), `fleet::`
//! (real Debian hosts booted on this machine, `capstan_tests::fleet`), `docs::` (the
//! README's quickstart as written, and the docs' names against the code), `messages::`
//! (what an operator reads when something is off).

mod bench;
mod core;
mod docker;
mod docs;
mod external;
mod fleet;
mod hooks;
mod kube;
mod messages;
mod nats;
mod packaging;
mod systemd;
mod vm;

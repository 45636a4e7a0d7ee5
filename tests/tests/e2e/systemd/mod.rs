//! The systemd side: a real systemd per test ([`capstan_tests::systemd::SystemdHost`])
//! and the `capstan-envdump` workload in it.

mod smoke;

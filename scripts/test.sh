#!/usr/bin/env bash
# Runs every capstan test: unit, property and end-to-end tests against real services.
# Needs root (it installs packages and starts a private dockerd through .ci/services.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages (nats-server, docker.io, busybox-static, …) and a private dockerd.
eval "$(.ci/services.sh)"

# The end-to-end tests run the real binaries: build them first.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast "$@"

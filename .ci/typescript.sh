#!/usr/bin/env bash
# The TypeScript packages' checks and tests (clients/typescript), as scripts/test.sh
# runs them after the Rust tests: dependencies from the lockfile (`npm ci`), the
# generated types against a fresh generation from coordinator/src/openapi.json, the
# description against Redocly's recommended ruleset (no errors), the live tests (each
# test file starts its own nats-server — $CAPSTAN_NATS_SERVER, else nats-server on
# PATH — coordinator and agents from target/debug, or $CAPSTAN_BIN_DIR), and both
# packages packed with `npm run pack` (`npm pack --workspaces`, as its README says) and
# installed into an empty project.
set -euo pipefail
cd "$(dirname "$0")/../clients/typescript"
echo "node $(node --version), npm $(npm --version)"
npm ci --no-audit --no-fund
npm run check:generated
npm run check:format
npm run lint:openapi
npm test
npm run check:examples
npm run check:pack

#!/usr/bin/env bash
# Start sandbox-sidecar in the foreground on the default (bubblewrap)
# backend. What is missing is installed (as root directly, otherwise with
# sudo for the install alone; without sudo it says what to install). As
# root the daemon is the host's (/run/sandbox-sidecar/sidecar.sock), as any
# other user a per-user one ($XDG_RUNTIME_DIR/sandbox-sidecar/sidecar.sock),
# and it says which. Extra arguments go to `sandbox-sidecar serve`.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/packages.sh

need=(bubblewrap)
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  need+=(golang-go)
fi
# A bwrap found on PATH counts even when it did not come from the package.
if command -v bwrap >/dev/null 2>&1; then need=("${need[@]:1}"); fi
if [ ${#need[@]} -gt 0 ] && ! ensure_packages "${need[@]}"; then
  exit 1
fi
export PATH="$PATH:/usr/local/go/bin"

mkdir -p bin
go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar
if [ "$(id -u)" -eq 0 ]; then
  echo "== starting the host's daemon as root" >&2
else
  echo "== starting a per-user daemon as $(id -un) (no cgroup or disk limits; run as root for the host's daemon)" >&2
fi
exec bin/sandbox-sidecar serve "$@"

#!/usr/bin/env bash
# Start sandbox-sidecar in the foreground on the default (bubblewrap)
# backend. As root it installs what is missing; otherwise it says what to
# install. Extra arguments go to `sandbox-sidecar serve`.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  need+=(golang-go)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
  else
    echo "missing: ${need[*]}. Install with: sudo apt-get install ${need[*]}" >&2
    echo "(or run this script as root and it installs them)" >&2
    exit 1
  fi
fi
export PATH="$PATH:/usr/local/go/bin"

mkdir -p bin
go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar
exec bin/sandbox-sidecar serve "$@"

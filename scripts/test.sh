#!/usr/bin/env bash
# Install what the tests need and run the whole suite: formatting,
# go vet, every Go test under the race detector (including the fuzz seed
# corpus, the end-to-end tests and the escape battery against the real
# daemon and bubblewrap, and the gvisor backend's tests against a cached
# build of the pinned runsc), a short fuzzing run of every decoder, a smoke run
# of the benchmark tool, the Python client's tests against the real daemon,
# the Debian package's test in a booted container, and the container image
# run with podman. Missing packages are installed (as root directly,
# otherwise with sudo for the install alone); as a normal user the tests
# that need root skip (and fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

. scripts/lib/packages.sh

apt_packages=(bubblewrap python3-msgpack python3-pytest util-linux libcap2-bin iproute2 iputils-ping curl procps strace e2fsprogs busybox-static debootstrap)
if ! ensure_packages "${apt_packages[@]}"; then
  echo "tests that need the missing packages will skip" >&2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "== running as $(id -un), not root: tests that need root (cgroups, disks, the escape battery's privileged parts, packaging) skip; run as root for the whole suite" >&2
fi

# gVisor's runsc at the pinned version, built once per machine and cached
# (scripts/install-runsc.sh); the gvisor backend's tests use it through
# SANDBOX_SIDECAR_RUNSC.
if [ "$(id -u)" -eq 0 ]; then
  echo "== runsc (cached build)"
  SANDBOX_SIDECAR_RUNSC=$(scripts/install-runsc.sh)
  export SANDBOX_SIDECAR_RUNSC
else
  echo "not root: the gvisor backend's tests will skip (scripts/install-runsc.sh needs root)" >&2
fi

echo "== gofmt"
unformatted=$(find . -name '*.go' -not -path './bin/*' -print0 | xargs -0 gofmt -l)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi

echo "== go vet"
go vet ./...

# test/sandboximage debootstraps a bookworm with python3, numpy, pandas and
# matplotlib (once, about 2 minutes and 600 MB, cached under
# /var/cache/sandbox-sidecar-test) to prove images end to end, and code
# contexts' DataFrames and figures on them.
export SANDBOX_SIDECAR_SANDBOX_IMAGE_TEST=1

echo "== go test -race"
go test -race -count=1 -timeout 30m ./...

# TestNumpyImage must hold whether or not the host's system Python has numpy
# (a worker host often has python3-numpy). The run above proved this host;
# under CI=true, on a machine without numpy, one more run of that test
# proves the other kind (about 2 minutes; the install and purge about 20 s),
# and exactly what it installed is purged after.
if [ "${CI:-}" = true ] && [ "$(id -u)" -eq 0 ] && ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "== TestNumpyImage again, with python3-numpy on the host"
  installed() { dpkg-query -W -f='${db:Status-Status} ${Package}\n' | awk '$1 == "installed" {print $2}' | sort; }
  before=$(installed)
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq --no-install-recommends python3-numpy >&2
  mapfile -t added < <(comm -13 <(echo "$before") <(installed))
  status=0
  SANDBOX_SIDECAR_TEST_HOST_NUMPY=1 go test -race -count=1 -timeout 15m -run '^TestNumpyImage$' ./test/sandboximage || status=$?
  "${apt[@]}" purge -y -qq "${added[@]}" >&2
  [ "$status" -eq 0 ] || exit "$status"
fi

# Budgets are execution counts (about 15 s each on an idle 2-core machine),
# not durations: a -fuzztime duration races Go's fuzzing coordinator against
# its workers and fails with a bare "context deadline exceeded" on a loaded
# machine. FUZZTIME (e.g. 5m) overrides them all for a longer run.
echo "== fuzz every decoder"
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime "${FUZZTIME:-$2}" "$3"; }
fuzz FuzzDecodeFrame 300000x ./ipc
fuzz FuzzClientResponses 80000x ./ipc
fuzz FuzzHandle 150000x ./service
fuzz FuzzLoadConfig 40000x ./cmd/sandbox-sidecar
fuzz FuzzCheckShape 150000x ./ipc
fuzz FuzzDecodeWire 150000x ./ipc
fuzz FuzzDecodeRequestTypes 100000x ./ipc
fuzz FuzzReadAt 30000x ./backend/proclog
fuzz FuzzDecodeRequest 50000x ./backend/agent
fuzz FuzzCellresRead 200000x ./backend/cellres
fuzz FuzzDecodeCodeRequest 300000x ./backend/bwrap/bwwire
fuzz FuzzDecodeCellRequest 300000x ./backend/agent
fuzz FuzzParseContextList 200000x ./backend/agent
fuzz FuzzDecodeCodeFrames 100000x ./backend/gvisor

# The .deb is built for 32-bit hosts too, where a 32-bit length in a frame
# overflows an int: the frame walk's tests run there as well. As a 386
# build where this kernel runs one (IA32 emulation on); otherwise as a
# 32-bit ARM build under Debian's qemu-user-static (qemu 7.2's i386
# emulation crashes in Go 1.26's runtime start, its ARM one does not).
echo "== go test the frame walk as a 32-bit build"
frame_tests='Shape|DecodeWire|Frame|DecodeRequest'
probe_dir=$(mktemp -d)
printf 'package main\nfunc main() {}\n' >"$probe_dir/main.go"
if GOARCH=386 go build -o "$probe_dir/probe" "$probe_dir/main.go" && "$probe_dir/probe" 2>/dev/null; then
  GOARCH=386 go test -count=1 -run "$frame_tests" ./ipc
else
  echo "this kernel does not run 386 binaries: a 32-bit ARM build under qemu-arm-static"
  ensure_packages qemu-user-static
  GOARCH=arm GOARM=7 go test -exec /usr/bin/qemu-arm-static -count=1 -run "$frame_tests" ./ipc
fi
rm -rf "$probe_dir"

echo "== benchmark tool smoke run (small counts; measurements are 'make bench')"
mkdir -p bin
go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar
CGO_ENABLED=0 go build -o bin/sandbox-sidecar-init ./cmd/sandbox-sidecar-init
go run ./cmd/sidecar-bench --quick --daemon-bin bin/sandbox-sidecar --json "$(mktemp -d)/bench.json" >/dev/null

if [ -d clients/python/tests ]; then
  echo "== python client tests (/usr/bin/python3)"
  mkdir -p bin
  go build -o bin/sandbox-sidecar ./cmd/sandbox-sidecar
  SANDBOX_SIDECAR_BIN="$PWD/bin/sandbox-sidecar" /usr/bin/python3 -m pytest -q -p no:cacheprovider clients/python/tests
fi

# ---------------------------------------------------------------------------
# Packaging: build the .deb, run lintian on it, and prove it on a real
# systemd: test/packaging boots a minimal Debian bookworm with systemd-nspawn
# (debootstrapped once, then cached under /var/cache/sandbox-sidecar-test)
# and installs, exercises, upgrades and purges the package inside.
echo "== packaging: .deb, lintian, systemd-nspawn end to end"
if [ "$(id -u)" -eq 0 ]; then
  ensure_packages debootstrap systemd-container lintian podman runc || true
fi
SANDBOX_SIDECAR_PACKAGING_TEST=1 go test -count=1 -timeout 25m -v ./test/packaging

# ---------------------------------------------------------------------------
# Container image: make image (debootstrap, cached beside the packaging
# test's root filesystem, plus the static daemon), then Debian's podman runs
# it as the daemon and a second container of uid 50000 sharing only the
# socket's directory runs the Python client end to end.
echo "== container image: make image, podman (runc)"
SANDBOX_SIDECAR_IMAGE_TEST=1 go test -count=1 -timeout 25m -v ./test/image

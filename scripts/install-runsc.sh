#!/usr/bin/env bash
# Build gVisor's runsc at the pinned version from the Go module proxy, once per
# machine, and print the path of the cached binary.
#
#   scripts/install-runsc.sh            # build if needed, print the path
#   RUNSC_CACHE=/some/dir scripts/install-runsc.sh
#
# The build happens in a throwaway module (runsc's dependencies never enter
# our go.mod). `go build` of runsc leaves its version unset (runsc --version
# says VERSION_MISSING), so the pinned version is stamped in with -ldflags.
# It must be built with CGO_ENABLED=0. runsc re-executes itself through
# /proc/self/exe (its gofer, sandbox and umounter are all runsc), and the
# sandbox process does so after pivot_root into an empty tmpfs chroot: a
# dynamically linked runsc (a plain `go build` with gcc installed links the
# cgo resolver and gets /lib64/ld-linux-x86-64.so.2 as its interpreter)
# then fails to find its ELF interpreter there, and execve reports that as
# "error executing umounter: fork/exec /proc/self/exe: no such file or
# directory" (reproduced here with the same version built CGO_ENABLED=1).
# The binary lands in a directory that stays in place, written atomically
# (build to a temp name, rename), so a concurrent run never sees half of it.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

# The pinned version: a commit of gVisor's Go branch (the module proxy
# serves the "go" branch, which is the one that builds with go build), from
# 2026-09; internal/runscpin names the same one for the tests. (Until
# 2026-12 it was v0.0.0-20250205023644-9414b50a5633, built with go1.23.6:
# this one runs a command in half the time here, docs/benchmarks-history.md.)
RUNSC_VERSION="${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
# The Go toolchain runsc is built with. gVisor reads fields of the Go
# runtime's own structures (pkg/goid: a goroutine's id at a fixed offset in
# runtime.g, per Go release), so a runsc built with a newer Go than its
# version knows compiles fine and then panics in the sentry ("running on
# goroutine 0 (task goroutine for kernel.Task ...)") at the first blocking
# file read. go1.26.3 is what this gVisor version's go.mod names; the go
# command fetches that toolchain from the module proxy (golang.org/toolchain).
RUNSC_GO="${RUNSC_GO:-go1.26.3}"
cache="${RUNSC_CACHE:-/var/cache/sandbox-sidecar-test}"
dest="$cache/runsc-$RUNSC_VERSION"

# A cached binary counts only if it runs, says the pinned version (one built
# before the version was stamped says VERSION_MISSING) and was built with the
# pinned toolchain. Its output is read whole before it is matched: piped
# into `grep -q`, which exits at the first match, runsc got SIGPIPE writing
# its next line about every other time, pipefail failed the check, and a
# good cached binary was rebuilt (and the build's own check failed as often).
#
# It must also carry the sentry's seccomp programs compiled ahead of time
# (scripts/runsc-precompile: gVisor's Go branch ships them empty, and a
# runsc without them compiles the sentry's program at every boot and every
# restore, ~125 ms of CPU here): the key of one of them names the systrap
# platform with its literal settings, a string no build without them holds.
precompiled_mark='Platform="systrap" HostNetwork=false HostNetworkRawSockets=false HostFilesystem=true'
built_right() {
  local says
  says=$("$1" --version 2>/dev/null) || return 1
  [[ $says == *"runsc version $RUNSC_VERSION"* ]] &&
    [ "$(go version "$1" 2>/dev/null | awk '{print $2}')" = "$RUNSC_GO" ] &&
    grep -qaF "$precompiled_mark" "$1"
}
if [ -x "$dest" ] && built_right "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache"
precompile="$(cd "$(dirname "$0")" && pwd)/runsc-precompile/precompile.go"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  export GOFLAGS=-mod=mod GOTOOLCHAIN="$RUNSC_GO" CGO_ENABLED=0
  go mod init runsc-build >/dev/null 2>&1
  go get "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
  # runsc is built from a writable copy of gVisor's source at the pin, into
  # which the seccomp programs are generated first (about half a minute).
  cp -r "$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)" gvisor
  chmod -R u+w gvisor
  go mod edit -replace gvisor.dev/gvisor=./gvisor
  cp "$precompile" precompile.go
  go build -o precompile-programs ./precompile.go >&2
  ./precompile-programs gvisor/runsc/boot/filter/filter_precompiled.go \
    gvisor/runsc/fsgofer/filter/filter_precompiled.go >&2
  go build -trimpath \
    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" \
    -o "$work/runsc" gvisor.dev/gvisor/runsc >&2
)
if ! built_right "$work/runsc"; then
  echo "the runsc just built is not version $RUNSC_VERSION built with $RUNSC_GO, with precompiled seccomp programs:" >&2
  go version "$work/runsc" >&2
  "$work/runsc" --version >&2
  exit 1
fi
install -m 0755 "$work/runsc" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "$dest"

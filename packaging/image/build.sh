#!/usr/bin/env bash
# Build the daemon's container image without pulling a base image:
#   OUTDIR/sandbox-sidecar-image.tar   (an OCI archive; OUTDIR defaults to bin/)
#
# A Debian bookworm root filesystem made with debootstrap (minbase, plus
# bubblewrap for the sandboxes, python3 for guest code and python3-msgpack
# for the Python client), cached, then the daemon built static and added as
# a layer of its own by mkimage (go-containerregistry). Load it with
#   podman load -i bin/sandbox-sidecar-image.tar
# or push it with skopeo copy oci-archive:bin/sandbox-sidecar-image.tar docker://REGISTRY/sandbox-sidecar:TAG
#
# Environment:
#   VERSION      the version compiled in and the image's tag (default: the
#                changelog's, as packaging/deb/build.sh makes it)
#   IMAGE_CACHE  where the debootstrapped root filesystem is kept
#                (default: OUTDIR/cache)
#   DEBIAN_MIRROR  (default: http://deb.debian.org/debian)
#
# Needs root, debootstrap and go. Prints the archive's path on stdout.
set -euo pipefail
umask 022
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PATH="$PATH:/usr/local/go/bin"

changelog_version=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$root/packaging/deb/changelog")
version=${VERSION:-$changelog_version}
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct HEAD)}
fi

suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
include=bubblewrap,python3-minimal,python3-msgpack,ca-certificates
cache=${IMAGE_CACHE:-$out/cache}
mkdir -p "$cache"
key=$(printf '%s %s %s 1' "$suite" "$include" "$mirror" | sha256sum | cut -c1-16)
rootfs="$cache/image-rootfs-$suite-$key.tar"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

exec 9>"$rootfs.lock"
flock 9
if [ ! -s "$rootfs" ]; then
  echo "image: debootstrap $suite (minbase, +$include) from $mirror into $rootfs" >&2
  debootstrap --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" >&2
  # What a container runtime provides, and what only apt needs.
  rm -rf "$work/root/dev/"* "$work/root/proc/"* "$work/root/sys/"* "$work/root/var/cache/apt/archives/"*.deb \
    "$work/root/var/lib/apt/lists/"* "$work/root/var/log/"*
  : >"$work/root/etc/machine-id"
  tar -C "$work/root" --numeric-owner --sort=name ${SOURCE_DATE_EPOCH:+--mtime=@$SOURCE_DATE_EPOCH --clamp-mtime} \
    -cf "$rootfs.tmp" .
  mv "$rootfs.tmp" "$rootfs"
  rm -rf "$work/root"
fi
flock -u 9

(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$work/sandbox-sidecar" ./cmd/sandbox-sidecar)
(cd "$root" && go run ./packaging/image/mkimage --rootfs "$rootfs" --binary "$work/sandbox-sidecar" \
  --out "$out/sandbox-sidecar-image.tar" --ref "sandbox-sidecar:$version" --version "$version")
echo "$out/sandbox-sidecar-image.tar"

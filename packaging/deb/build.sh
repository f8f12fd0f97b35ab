#!/usr/bin/env bash
# Build the Debian package with plain dpkg-deb:
#   OUTDIR/sandbox-sidecar_<version>_<arch>.deb   (OUTDIR defaults to bin/)
#
# Environment:
#   VERSION         the package version, also compiled into the binary
#                   (-X main.version); default: the top entry of
#                   packaging/deb/changelog followed by ~git<commit time>.<commit>,
#                   e.g. 0.1.0~git20261129081500.d7e0230 (sorts before 0.1.0)
#   GOARCH          the architecture to build for (default: the Go default)
#   DEB_MAINTAINER  the Maintainer field (default: the changelog's)
#
# It prints the path of the .deb on stdout. Needs go, dpkg-deb, gzip, and
# git for the default version.
set -euo pipefail
umask 022
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PATH="$PATH:/usr/local/go/bin"
pkg=sandbox-sidecar

changelog_version=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$here/changelog")
changelog_maintainer=$(sed -n 's/^ -- \(.*>\)  .*/\1/p' "$here/changelog" | head -1)
maintainer=${DEB_MAINTAINER:-$changelog_maintainer}

if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git -C "$root" rev-parse --short=7 HEAD)
  commit_time=$(git -C "$root" log -1 --format=%ct HEAD)
else
  commit=
  commit_time=$(date +%s)
fi
# Reproducible: every timestamp in the package is the commit's.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$commit_time}
if [ -z "${VERSION:-}" ]; then
  VERSION="$changelog_version~git$(date -u -d "@$commit_time" +%Y%m%d%H%M%S)${commit:+.$commit}"
fi
version=$VERSION
case "$version" in
[0-9]*) ;;
*) echo "build.sh: VERSION $version must start with a digit (Debian policy)" >&2; exit 2 ;;
esac

goarch=${GOARCH:-$(go env GOARCH)}
case "$goarch" in
amd64 | arm64 | riscv64 | s390x) arch=$goarch ;;
386) arch=i386 ;;
arm) arch=armhf; export GOARM=${GOARM:-7} ;;
ppc64le) arch=ppc64el ;;
*) echo "build.sh: no Debian architecture known for GOARCH=$goarch" >&2; exit 2 ;;
esac

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/libexec/$pkg" "$stage/lib/systemd/system" \
  "$stage/usr/lib/sysusers.d" "$stage/usr/lib/tmpfiles.d" "$stage/etc/$pkg" \
  "$stage/usr/share/man/man1" "$stage/usr/share/doc/$pkg/examples" "$stage/usr/share/lintian/overrides"

# No cgo: the binaries need no shared library (user and group names resolve
# through /etc/passwd and /etc/group, where systemd-sysusers puts
# sandbox-sidecar). The daemon is position-independent where Go supports it,
# for ASLR. The sandboxes' init (cmd/sandbox-sidecar-init) is truly static
# (-buildmode=exe): it runs inside roots without the host's loader and C
# library (an image: busybox, musl), where a Go PIE, which names
# /lib64/ld-linux-x86-64.so.2 as its interpreter even without cgo, cannot
# start. Why a second binary: docs/design.md ("A static init").
buildmode=pie
case "$goarch" in
s390x | riscv64) buildmode=exe ;;
esac
echo "== go build $pkg $version ($goarch, $buildmode; its init static)" >&2
(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath -buildmode=$buildmode \
  -ldflags "-s -w -X main.version=$version" -o "$stage/usr/bin/$pkg" ./cmd/sandbox-sidecar)
(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath -buildmode=exe \
  -ldflags "-s -w" -o "$stage/usr/libexec/$pkg/$pkg-init" ./cmd/sandbox-sidecar-init)

install -m 0644 "$root/packaging/systemd/$pkg.service" "$root/packaging/systemd/$pkg.socket" "$root/packaging/systemd/$pkg-metrics.socket" "$stage/lib/systemd/system/"
install -m 0644 "$root/packaging/sysusers.d/$pkg.conf" "$stage/usr/lib/sysusers.d/$pkg.conf"
install -m 0644 "$root/packaging/tmpfiles.d/$pkg.conf" "$stage/usr/lib/tmpfiles.d/$pkg.conf"

# Generated from the binary just built (a cross-built one cannot run here:
# then from a native build of the same source).
gen_bin="$stage/usr/bin/$pkg"
if [ "$goarch" != "$(go env GOHOSTARCH)" ]; then
  gen_bin="$stage/native-$pkg"
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$version" -o "$gen_bin" ./cmd/sandbox-sidecar)
fi
"$here/gen-config.sh" "$gen_bin" >"$stage/etc/$pkg/config.toml"
chmod 0644 "$stage/etc/$pkg/config.toml"
"$here/gen-man.sh" "$gen_bin" "$version" "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" | gzip -9n >"$stage/usr/share/man/man1/$pkg.1.gz"
rm -f "$stage/native-$pkg"

doc="$stage/usr/share/doc/$pkg"
install -m 0644 "$here/copyright" "$doc/copyright"
# A snapshot gets its own entry on top of the maintained changelog.
{
  if [ "$version" != "$changelog_version" ]; then
    printf '%s (%s) unstable; urgency=medium\n\n  * Snapshot build of %s.\n\n -- %s  %s\n\n' \
      "$pkg" "$version" "${commit:-the source tree}" "$maintainer" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
  fi
  cat "$here/changelog"
} >"$stage/changelog"
# Native versions (no Debian revision) ship changelog.gz, others changelog.Debian.gz.
case "$version" in
*-*) changelog_name=changelog.Debian.gz ;;
*) changelog_name=changelog.gz ;;
esac
gzip -9n <"$stage/changelog" >"$doc/$changelog_name"
rm "$stage/changelog"
install -m 0644 "$root/README.md" "$doc/README.md"
for d in operations packaging protocol; do
  [ -f "$root/docs/$d.md" ] && gzip -9n <"$root/docs/$d.md" >"$doc/$d.md.gz"
done
install -m 0644 "$root/packaging/systemd/examples/"*.conf "$doc/examples/"
install -m 0644 "$here/lintian-overrides" "$stage/usr/share/lintian/overrides/$pkg"

installed_size=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: bubblewrap (>= 0.5.0), systemd | systemd-standalone-sysusers | systemd-sysusers
Recommends: systemd
Suggests: python3, runsc
Section: admin
Priority: optional
Homepage: https://github.com/sandbox-sidecar/sandbox-sidecar
Description: runs AI-agent code in sandboxes for Apache Airflow workers
 sandbox-sidecar is one small daemon per Airflow worker host. The worker
 talks to it over a permissioned Unix socket and never touches the sandbox
 machinery; the daemon runs each sandbox with bubblewrap (user, PID, mount,
 IPC, UTS and network namespaces, no capabilities, a read-only /usr), tracks
 sandboxes per Airflow run, reaps what clients abandon, and cleans up every
 orphan after its own crash.
 .
 The package runs it under systemd, socket-activated, as the system user
 sandbox-sidecar. Add the Airflow worker's user to the group sandbox-sidecar
 to let it connect. Sandboxes see the host's /usr, so the interpreters they
 need (python3, ...) must be installed on the host.
EOF
echo "/etc/$pkg/config.toml" >"$stage/DEBIAN/conffiles"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"
find "$stage" -depth -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

deb="$out/${pkg}_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >&2
echo "$deb"

#!/usr/bin/env bash
# Print the packaged /etc/sandbox-sidecar/config.toml, generated from the
# binary itself: `config show` gives every key with its built-in default and
# `serve --help` the description of the matching flag, so the file cannot
# drift from the code. Every key is commented out except the [server] paths
# and group that the packaged service needs (see the header).
#
# Usage: gen-config.sh PATH/TO/sandbox-sidecar
set -euo pipefail
bin=${1:?usage: gen-config.sh PATH/TO/sandbox-sidecar}

# What the flags' descriptions cannot know about the packaged service.
declare -A notes=(
  [bwrap]='The packaged daemon is not root: with CAP_SETUID, CAP_SETGID and CAP_KILL
(AmbientCapabilities= of sandbox-sidecar.service) it runs every sandbox as
a host uid of its own from the uid range, in an unprivileged user namespace
(uid 1000 inside), so sandbox_uid and sandbox_gid do not apply.'
  [bwrap.share_host_network]='Also needs PrivateNetwork=no in a drop-in for sandbox-sidecar.service:
the packaged service has no network of its own.'
  [sbx]='With backend = "sbx", install the drop-in that gives the service /dev/kvm
and the network: /usr/share/doc/sandbox-sidecar/examples/sbx-backend.conf.'
  [gvisor]='With backend = "gvisor", install gVisor'"'"'s runsc (docs/operations.md, gVisor) and the
drop-in that runs the service as root: /usr/share/doc/sandbox-sidecar/examples/gvisor-backend.conf.'
  [metrics]='The packaged service has no network of its own (PrivateNetwork=yes): leave
listen unset and enable sandbox-sidecar-metrics.socket instead (its header
says how); systemd hands the daemon that socket.'
  [airflow]='The packaged service has no network of its own: install the drop-in
/usr/share/doc/sandbox-sidecar/examples/airflow-api.conf (naming your API
server) so the daemon can reach api_url.'
  [images]='The images sandboxes may run on, besides host (the host'"'"'s /usr): an operator
imports them with `sandbox-sidecar image import PATH --name NAME` or `image pull
REF --name NAME` (the CLI reads or pulls, the daemon needs no network) and
lists them with `sandbox-sidecar image ls`.'
  [images.pools]='A warm pool per image, NAME = N (lifecycle.pool_size is the default
image'"'"'s), e.g. analytics = 2.'
  [egress]='Per-sandbox egress allow-lists (allow_egress_to, allow_egress_to_cidrs) for
the bwrap backend; off, such specs are refused (spec_unenforceable). On needs
the drop-in /usr/share/doc/sandbox-sidecar/examples/egress.conf (the host'"'"'s
network, /dev/net/tun, CAP_SYS_ADMIN and CAP_NET_ADMIN; docs/operations.md,
Egress). Names the egress resolver answers itself go in a table:
[egress.hosts] "mirror.internal" = ["10.20.1.5"]'
  [egress.private_allowed]='Loopback, private or host-own CIDRs sandboxes may be let reach (never
link-local: 169.254.169.254 is always refused).'
  [egress.max_conns]='Connections and UDP flows at once, per sandbox.'
  [egress.conn_idle_timeout]='A connection with no byte either way for this long is closed.'
  [server.audit_file]='The service may write under /var/log/sandbox-sidecar (LogsDirectory=).'
  [limits.cgroups]='The service has Delegate=yes: sandboxes get cgroups of their own where the
host'"'"'s cgroup v2 has the memory, pids and cpu controllers (Debian 12,
Ubuntu 24.04); elsewhere the daemon warns at start and only the unit'"'"'s
MemoryMax= and TasksMax= bound them, all together.'
  [limits.disk_caps]='The service does not run as root, so it cannot loop-mount: each sandbox'"'"'s
disk is not capped (the state directory'"'"'s filesystem bounds them all), and
the daemon says so at start.'
)

# Values pinned for the packaged service. They must match the units:
# ListenStream= of sandbox-sidecar.socket, StateDirectory= of the service.
declare -A pinned=(
  [server.socket]='"/run/sandbox-sidecar/sidecar.sock"'
  [server.socket_group]='"sandbox-sidecar"'
  [server.state_dir]='"/var/lib/sandbox-sidecar"'
)

# /dev/null as the file: the built-in defaults, whatever /etc holds here.
# The socket and state directory defaults depend on who runs this; the
# environment makes them the system ones for root and others alike.
export SANDBOX_SIDECAR_SOCKET=/run/sandbox-sidecar/sidecar.sock XDG_STATE_HOME=/var/lib
defaults=$("$bin" config show --config /dev/null)
help=$("$bin" serve --help 2>&1 || true)

# flag_help NAME prints the description of serve's -NAME flag, if any.
flag_help() {
  awk -v want="-$1" '
    $1 == want { found = 1; next }
    found && /^\t|^    / { sub(/^[ \t]+/, ""); print; exit }
    found { exit }
  ' <<<"$help"
}

# describe SECTION KEY finds the flag that sets SECTION.KEY: the key with
# dashes, singular for lists (allow_uids: -allow-uid), or with the section
# as prefix (bwrap.share_host_network: -bwrap-share-host-network), singular
# too (limits.open_files: -limit-open-files).
describe() {
  local section=$1 key=$2 name d
  name=${key//_/-}
  for cand in "$name" "${name%s}" "$section-$name" "${section%s}-$name"; do
    d=$(flag_help "$cand")
    if [ -n "$d" ]; then
      printf '%s' "$d"
      return
    fi
  done
}

cat <<'EOF'
# /etc/sandbox-sidecar/config.toml: configuration of `sandbox-sidecar serve`.
#
# Every setting is listed with its built-in default, commented out. To change
# one, uncomment it, then check the file and restart the daemon:
#
#   sandbox-sidecar config check && systemctl restart sandbox-sidecar
#
# Unknown keys and bad values are refused with their line. Durations are
# written "30s", "10m", "1h"; modes in octal, "0660". `sandbox-sidecar config
# show` prints the effective configuration, `sandbox-sidecar serve --help`
# the matching command-line flags (a flag overrides this file).
#
# The packaged service runs as the unprivileged system user sandbox-sidecar,
# whose built-in defaults would be per-user paths, so three [server] keys are
# set: the socket (which, under socket activation, sandbox-sidecar.socket
# creates: change its path, mode or group there, with a drop-in), the group
# of a socket the daemon creates itself when started by hand, and the state
# directory (StateDirectory= of sandbox-sidecar.service: move both together).

EOF

section=
while IFS= read -r line; do
  case "$line" in
    '') echo; continue ;;
    '['*']')
      section=${line#[}; section=${section%]}
      echo "$line"
      [ -n "${notes[$section]:-}" ] && sed 's/^/# /' <<<"${notes[$section]}"
      continue ;;
  esac
  key=${line%% = *}
  value=${line#* = }
  # The value line shows the default; drop the flag's own "(default ...)".
  d=$(describe "$section" "$key" | sed -E 's/ \(default [^:][^)]*\)$//')
  [ -n "$d" ] && fold -s -w 76 <<<"$d" | sed -E 's/ +$//; s/^/# /'
  [ -n "${notes[$section.$key]:-}" ] && sed 's/^/# /' <<<"${notes[$section.$key]}"
  if [ -n "${pinned[$section.$key]:-}" ]; then
    echo "$key = ${pinned[$section.$key]}"
  else
    echo "# $key = $value"
  fi
done <<<"$defaults"

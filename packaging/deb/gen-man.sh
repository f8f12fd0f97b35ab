#!/usr/bin/env bash
# Print sandbox-sidecar(1) in roff, generated from the binary's own --help
# (the command list and every subcommand's synopsis and flags), with the
# packaged files, environment and exit codes around it.
#
# Usage: gen-man.sh PATH/TO/sandbox-sidecar VERSION DATE(YYYY-MM-DD)
set -euo pipefail
bin=${1:?usage: gen-man.sh BINARY VERSION DATE}
version=${2:?usage: gen-man.sh BINARY VERSION DATE}
date=${3:?usage: gen-man.sh BINARY VERSION DATE}

# roff escapes: backslashes, minus signs, and a leading . or ' on a line.
esc() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

# The defaults --help shows depend on who runs it; show the system ones.
export SANDBOX_SIDECAR_SOCKET=/run/sandbox-sidecar/sidecar.sock XDG_STATE_HOME=/var/lib

commands=$("$bin" --help | awk '/^Commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { exit }')

cat <<EOF
.TH SANDBOX\\-SIDECAR 1 "$date" "sandbox\\-sidecar $(esc <<<"$version")" "User Commands"
.SH NAME
sandbox\\-sidecar \\- run AI\\-agent code in bubblewrap sandboxes on behalf of Airflow workers
.SH SYNOPSIS
.B sandbox\\-sidecar
.I command
.RI [ flags ]
.SH DESCRIPTION
.B sandbox\\-sidecar
is one daemon per Apache Airflow worker host that runs the code an AI agent
writes in sandboxes, on behalf of the worker.
The worker talks to the daemon over a Unix socket that only root, the daemon
and members of the
.B sandbox\\-sidecar
group may open; the daemon tracks every sandbox per Airflow run, reaps what
clients abandon, and after a crash cleans up every orphan when it starts again.
.PP
.B sandbox\\-sidecar serve
is the daemon; the packaged
.B sandbox\\-sidecar.service
runs it under systemd, socket\\-activated by
.BR sandbox\\-sidecar.socket .
Every other command is a client of a running daemon's socket, or, for
.BR config ,
of the configuration file.
.SH COMMANDS
EOF

for c in $commands; do
  out=$("$bin" "$c" --help 2>&1 || true)
  synopsis=$(sed -n 's/^Usage: //p' <<<"$out" | head -1)
  summary=$(awk 'NR == 3 { print; exit }' <<<"$out")
  echo ".SS \"$(esc <<<"$synopsis")\""
  grep -q '^Flags:' <<<"$out" && esc <<<"$summary"
  # Flags: "  -name type" then "    \tdescription" lines.
  awk '
    /^Flags:/ { on = 1; next }
    !on { next }
    /^  -/ { n = split($0, f, " "); print "F\t" f[1] "\t" (n > 1 ? f[2] : ""); next }
    /^[ \t]+/ { sub(/^[ \t]+/, ""); print "D\t" $0 }
  ' <<<"$out" | while IFS=$'\t' read -r kind a b; do
    if [ "$kind" = F ]; then
      echo .TP
      if [ -n "$b" ]; then
        echo ".B $(esc <<<"$a") \\fI$(esc <<<"$b")\\fR"
      else
        echo ".B $(esc <<<"$a")"
      fi
    else
      esc <<<"$a"
    fi
  done
  # config's help has no Flags: section; print its explanation instead.
  if ! grep -q '^Flags:' <<<"$out"; then
    awk 'NR > 2 && NF' <<<"$out" | esc | sed 's/$/\n.br/'
  fi
done

cat <<'EOF'
.SH FILES
.TP
.I /etc/sandbox\-sidecar/config.toml
The daemon's configuration (TOML; unknown keys are refused with their line).
Every key is listed with its default;
.B sandbox\-sidecar config check
validates it and
.B sandbox\-sidecar config show
prints the effective configuration.
.TP
.I /run/sandbox\-sidecar/sidecar.sock
The daemon's socket, mode 0660, owner and group
.BR sandbox\-sidecar ,
in a directory of mode 0750.
.TP
.I /var/lib/sandbox\-sidecar
The state directory: the journal
.RI ( journal.db ),
the lock, and one directory per bubblewrap sandbox.
.TP
.I /lib/systemd/system/sandbox\-sidecar.socket
.TQ
.I /lib/systemd/system/sandbox\-sidecar.service
The systemd units.
.SH ENVIRONMENT
.TP
.B SANDBOX_SIDECAR_SOCKET
The socket the client commands use when
.B \-\-socket
is not given. Worker users set it to
.IR /run/sandbox\-sidecar/sidecar.sock .
.SH EXIT STATUS
.B health
exits 0 when the daemon is healthy, 1 when it is degraded and 2 when it is
unreachable.
.B exec
exits with the command's status (124 when it timed out).
Every command exits 2 on a usage error.
.SH EXAMPLES
Let the Airflow worker's user use the daemon (restart the worker afterwards,
so it picks up the group):
.PP
.nf
.RS
usermod \-aG sandbox\-sidecar airflow
.RE
.fi
.PP
A health check for Consul, Nagios or a Kubernetes exec probe:
.PP
.nf
.RS
sandbox\-sidecar health \-\-socket /run/sandbox\-sidecar/sidecar.sock
.RE
.fi
.SH SEE ALSO
.BR systemctl (1),
.BR journalctl (1),
.BR bwrap (1),
.IR /usr/share/doc/sandbox\-sidecar/operations.md.gz
EOF

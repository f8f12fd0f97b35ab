# Sourced by scripts/run.sh and scripts/test.sh: install missing Debian
# packages, elevating only for the install itself and saying how.
#
#   ensure_packages PKG...   returns 0 when every package is there afterwards
#
# As root it runs apt-get directly (a container or a fresh VM often has no
# sudo). As another user it runs `sudo apt-get` when sudo is installed,
# printing the command first; without sudo it prints what to install and
# returns 1, leaving the decision (stop, or skip what needs them) to the
# caller.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "missing: ${missing[*]}; as root: apt-get install ${missing[*]}" >&2
      return 1
    fi
    echo "== not root: installing ${missing[*]} with sudo apt-get (only this step is elevated)" >&2
    apt=(sudo "${apt[@]}")
  else
    echo "== installing ${missing[*]}" >&2
  fi
  "${apt[@]}" update -qq && "${apt[@]}" install -y -qq "${missing[@]}" >&2
}

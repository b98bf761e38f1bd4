# Which RabbitMQ series start.sh, stop.sh and cluster.sh run, and where it comes from.
# Sourced, not run: choose_series sets ROOTFS, EPMD_PORT and IN_ROOT, the command prefix
# that runs the series' own programs (empty for the host's package, `chroot ROOTFS`).
#
#   RMQ_SERIES=       (unset) the host's rabbitmq-server package, as it comes (3.10.8 on Debian 12)
#   RMQ_SERIES=3.10   Debian 12's package      \
#   RMQ_SERIES=4.0    Debian 13's package       } the host's own package when it is that
#   RMQ_SERIES=4.3    Debian unstable's package /  series, else a Debian chroot of it
#   RMQ_CHROOTS=/var/lib/faststream-retry   where the chroots are built (root only, ~35 s each,
#                     Debian's package registry only; reused while their series holds)
#   RMQ_DEBIAN_MIRROR=http://deb.debian.org/debian
#
# A node in a chroot shares the host's network, pids and its state dir (RMQ_BASE is
# bind-mounted at the same path, until stop.sh), so the suite's ctl wrapper, pid file and
# SIGKILL work as on the host. To remove a chroot: stop its nodes, `umount -R` it, then
# delete it. Each series has its own Erlang port mapper (ERL_EPMD_PORT): nodes of
# different Erlang releases never register with one another's epmd.

RMQ_SERIES="${RMQ_SERIES:-}"
RMQ_CHROOTS="${RMQ_CHROOTS:-/var/lib/faststream-retry}"
RMQ_DEBIAN_MIRROR="${RMQ_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# The version a rabbitmq_server-X.Y.Z directory under $1 holds, or nothing.
version_in() {
  local dir
  for dir in "$1"/usr/lib/rabbitmq/lib/rabbitmq_server-*; do
    [[ -d "$dir" ]] && { echo "${dir##*rabbitmq_server-}"; return 0; }
  done
  return 1
}

series_of() { local v="$1"; echo "${v%.*}"; }   # 4.3.6 -> 4.3

debian_suite_of() {
  case "$1" in
    3.10) echo bookworm ;;
    4.0) echo trixie ;;
    4.3) echo sid ;;
    *) return 1 ;;
  esac
}

# One epmd per series: 4369 is the host's; a chroot's is 4369 + 1, 2, 3.
epmd_port_of() {
  case "$1" in
    3.10) echo 4372 ;;
    4.0) echo 4370 ;;
    4.3) echo 4371 ;;
  esac
}

# apt-get install "$@", one at a time: scripts/test starts several series at once, and
# dpkg takes one install at a time.
apt_install() {
  (
    flock -w 600 7 || exit 1
    apt-get -o DPkg::Lock::Timeout=300 update -q \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
        --no-install-recommends "$@"
  ) 7>"${TMPDIR:-/tmp}/faststream-retry-apt.lock" >&2
}

# Decide where the series comes from. Sets ROOTFS ("" = the host), EPMD_PORT and IN_ROOT.
choose_series() {
  ROOTFS="" EPMD_PORT="${ERL_EPMD_PORT:-4369}" IN_ROOT=()
  [[ -n "$RMQ_SERIES" ]] || return 0
  debian_suite_of "$RMQ_SERIES" >/dev/null \
    || die "RMQ_SERIES=$RMQ_SERIES is not a series these scripts run: 3.10, 4.0 or 4.3 (or unset for the host's package)"
  local host
  if host="$(version_in "")" && [[ "$(series_of "$host")" == "$RMQ_SERIES" ]]; then
    return 0  # the host's package is the series asked for
  fi
  if [[ -z "${host:-}" ]] && [[ "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" \
      == "$(debian_suite_of "$RMQ_SERIES")" ]]; then
    return 0  # the host's Debian ships the series: start.sh installs it there
  fi
  ROOTFS="$RMQ_CHROOTS/rabbitmq-$RMQ_SERIES"
  EPMD_PORT="$(epmd_port_of "$RMQ_SERIES")"
  IN_ROOT=(chroot "$ROOTFS")
}

# Build the chroot of the series if it is not there (serialised: a cluster's nodes start
# at once), and check that it still holds the series (sid moves on).
ensure_chroot() {
  [[ -n "$ROOTFS" ]] || return 0
  local suite found
  suite="$(debian_suite_of "$RMQ_SERIES")"
  mkdir -p "$RMQ_CHROOTS"
  exec 8>"$ROOTFS.lock"
  flock -w 600 8 || die "timed out waiting for $ROOTFS.lock (another start is building the chroot)"
  if ! found="$(version_in "$ROOTFS")"; then
    [[ "$(id -u)" == 0 ]] || die "RabbitMQ $RMQ_SERIES runs in a Debian chroot, and building one needs root (or set RABBITMQ_URL to a $RMQ_SERIES broker you run)"
    if ! command -v debootstrap >/dev/null; then
      log "installing debootstrap"
      apt_install debootstrap || die "apt-get install debootstrap failed"
    fi
    log "building a Debian $suite chroot with rabbitmq-server in $ROOTFS (~35 s) ..."
    rm -rf "$ROOTFS.new"
    debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$ROOTFS.new" "$RMQ_DEBIAN_MIRROR" \
      >"$RMQ_CHROOTS/debootstrap-$RMQ_SERIES.log" 2>&1 \
      || { tail -n 20 "$RMQ_CHROOTS/debootstrap-$RMQ_SERIES.log" >&2; die "debootstrap $suite failed (log: $RMQ_CHROOTS/debootstrap-$RMQ_SERIES.log)"; }
    mv "$ROOTFS.new" "$ROOTFS"
    found="$(version_in "$ROOTFS")" || die "the $suite chroot has no rabbitmq-server"
    log "built in $(elapsed) s: RabbitMQ $found"
  fi
  [[ "$(series_of "$found")" == "$RMQ_SERIES" ]] \
    || die "Debian $suite now ships RabbitMQ $found, not $RMQ_SERIES: point RMQ_CHROOTS at a chroot of $RMQ_SERIES, or move the scripts to the series Debian ships"
  cp /etc/hosts "$ROOTFS/etc/hosts"  # the node is name@localhost
  mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc" \
    || die "could not mount /proc in $ROOTFS"
  flock -u 8
}

# Bind the node's state dir into the chroot at the same path, so a path means one thing
# inside and out (never the whole of /tmp: removing a chroot must not reach the host's).
bind_base() {
  [[ -n "$ROOTFS" ]] || return 0
  mkdir -p "$ROOTFS$1"
  mountpoint -q "$ROOTFS$1" || mount --bind "$1" "$ROOTFS$1" || die "could not bind $1 into $ROOTFS"
}

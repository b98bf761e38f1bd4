# Which nats-server series start.sh and cluster.sh run, and where it comes from.
# Sourced, not run: choose_nats sets ROOTFS ("" = the host) and IN_ROOT (the command prefix
# that runs the series' own nats-server: empty on the host, `chroot ROOTFS` else), and
# installs the series where it is missing.
#
#   NATS_SERIES=       (unset) the host's nats-server package, as it comes (2.9.10 on Debian 12)
#   NATS_SERIES=2.9    Debian 12's package      \  the host's own package when it is that
#   NATS_SERIES=2.15   Debian unstable's package /  series, else a Debian chroot of it
#
# The chroot is RabbitMQ's of the same Debian release (scripts/rabbitmq/series.sh: sid is
# RabbitMQ 4.3's chroot, bookworm 3.10's), built by the same code when it is missing and
# given the nats-server package on top: one sid to download and keep, not two. nats-server
# is one Go binary that needs nothing the chroot lacks; a node in it shares the host's
# network and pids, and its state dir is bind-mounted at the same path (until stop.sh).

NATS_SERIES="${NATS_SERIES:-}"
# shellcheck source=../rabbitmq/series.sh
source "$(dirname "${BASH_SOURCE[0]}")/../rabbitmq/series.sh"

nats_suite_of() {
  case "$1" in
    2.9) echo bookworm ;;
    2.15) echo sid ;;
    *) return 1 ;;
  esac
}

# The RabbitMQ series whose chroot is the Debian release a NATS series comes from.
rabbitmq_series_of() {
  case "$1" in
    2.9) echo 3.10 ;;
    2.15) echo 4.3 ;;
  esac
}

# The version of the nats-server under root $1 ("" = the host), or nothing.
nats_version_in() {
  local bin="$1/usr/sbin/nats-server" out
  [[ -x "$bin" ]] || bin="$1/usr/bin/nats-server"
  [[ -x "$bin" ]] || return 1
  if [[ -n "$1" ]]; then out="$(chroot "$1" "${bin#"$1"}" --version 2>/dev/null)" || return 1
  else out="$("$bin" --version 2>/dev/null)" || return 1; fi
  out="${out##*v}"
  [[ -n "$out" ]] && echo "$out"
}

nats_binary_in() {
  if [[ -x "$1/usr/sbin/nats-server" ]]; then echo /usr/sbin/nats-server; else echo /usr/bin/nats-server; fi
}

# apt-get install nats-server into the chroot $1 (built already: ensure_chroot), under the
# lock every apt-get in a chroot takes (scripts/sid-python's, scripts/redis/series.sh's):
# two apt-gets in one chroot at once fail on its lists' lock, and the nodes of a cluster
# start at once. Without systemd, the
# package's postinst would start a system server on 4222 unless policy-rc.d forbids it.
nats_install_in_chroot() {
  local root="$1" made=0
  (
    flock -w 600 8 || exit 1
    nats_version_in "$root" >/dev/null && exit 0
    log "installing Debian's nats-server into $root (~15 s) ..."
    if [[ ! -e "$root/usr/sbin/policy-rc.d" ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod +x "$root/usr/sbin/policy-rc.d" && made=1
    fi
    local rc=0
    # The chroot's package lists first (what debootstrap fetched); sid drops old versions
    # from the mirror, so a download that fails is retried after an update.
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -o DPkg::Lock::Timeout=300 install -y -q \
      --no-install-recommends nats-server >&2 \
      || { chroot "$root" apt-get -o DPkg::Lock::Timeout=300 update -q >&2 \
        && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -o DPkg::Lock::Timeout=300 \
          install -y -q --no-install-recommends nats-server >&2; } || rc=$?
    [[ $made == 1 ]] && rm -f "$root/usr/sbin/policy-rc.d"
    exit "$rc"
  ) 8>"$root.apt.lock"
}

# The host's package: apt-get install it (root only).
nats_install_on_host() {
  [[ "${NATS_AUTO_INSTALL:-1}" == 1 && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null \
    || die "nats-server is not installed: apt-get install nats-server (as root), or set NATS_URL to a server you run"
  log "nats-server not installed: installing the Debian package (~10 s) ..."
  local made=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made=1
  fi
  local rc=0
  apt_install nats-server || rc=$?
  [[ $made == 1 ]] && rm -f /usr/sbin/policy-rc.d
  [[ $rc == 0 ]] || die "apt-get install nats-server failed"
}

# Decide where the series comes from, install it if it is missing, and check that what is
# there is the series asked for. Sets ROOTFS, IN_ROOT, NATS_BIN (its path under ROOTFS)
# and NATS_VERSION.
choose_nats() {
  ROOTFS="" IN_ROOT=()
  local host suite codename
  host="$(nats_version_in "")" || host=""
  if [[ -z "$NATS_SERIES" ]]; then
    [[ -n "$host" ]] || nats_install_on_host
  else
    suite="$(nats_suite_of "$NATS_SERIES")" \
      || die "NATS_SERIES=$NATS_SERIES is not a series these scripts run: 2.9 or 2.15 (or unset for the host's package)"
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    if [[ -n "$host" && "$(series_of "$host")" == "$NATS_SERIES" ]]; then
      :  # the host's package is the series asked for
    elif [[ -z "$host" && "$codename" == "$suite" ]]; then
      nats_install_on_host  # the host's Debian ships the series
    else
      [[ "$(id -u)" == 0 ]] || [[ -d "$RMQ_CHROOTS/rabbitmq-$(rabbitmq_series_of "$NATS_SERIES")/usr" ]] \
        || die "nats-server $NATS_SERIES runs in a Debian $suite chroot, and building one needs root (or set NATS_URL to a $NATS_SERIES server you run)"
      # RabbitMQ's chroot of this Debian release: built if missing, /etc/hosts and /proc.
      RMQ_SERIES="$(rabbitmq_series_of "$NATS_SERIES")"
      choose_series
      [[ -n "$ROOTFS" ]] || die "nats-server $NATS_SERIES: the host runs RabbitMQ $RMQ_SERIES but has no nats-server $NATS_SERIES; install it (apt-get install nats-server)"
      ensure_chroot
      nats_version_in "$ROOTFS" >/dev/null || {
        [[ "$(id -u)" == 0 ]] || die "nats-server $NATS_SERIES is not in $ROOTFS, and installing it needs root"
        nats_install_in_chroot "$ROOTFS" || die "apt-get install nats-server failed in $ROOTFS"
      }
    fi
  fi
  NATS_VERSION="$(nats_version_in "$ROOTFS")" || die "no nats-server${ROOTFS:+ in $ROOTFS} after installing it"
  NATS_BIN="$(nats_binary_in "$ROOTFS")"
  [[ -z "$NATS_SERIES" || "$(series_of "$NATS_VERSION")" == "$NATS_SERIES" ]] \
    || die "Debian ${suite:-here} ships nats-server $NATS_VERSION, not $NATS_SERIES: move the scripts to the series Debian ships"
  [[ -z "$ROOTFS" ]] || IN_ROOT=(chroot "$ROOTFS")
}

# Which Redis (or Valkey) series start.sh and cluster.sh run, and where it comes from.
# Sourced, not run: choose_redis sets ROOTFS ("" = the host), IN_ROOT (the command prefix
# that runs the series' own programs: empty on the host, `chroot ROOTFS` else), REDIS_BIN
# and REDIS_CLI (their paths under ROOTFS) and REDIS_VERSION, and installs the series
# where it is missing.
#
#   REDIS_SERIES=            (unset) the host's redis-server package, as it comes (7.0.15 on Debian 12)
#   REDIS_SERIES=7.0         Debian 12's redis-server       \  the host's own package when it
#   REDIS_SERIES=8.0         Debian unstable's redis-server  } is that series, else a Debian
#   REDIS_SERIES=valkey-9.1  Debian unstable's valkey-server /  chroot of it
#
# The chroot is RabbitMQ's of the same Debian release (scripts/rabbitmq/series.sh: sid is
# RabbitMQ 4.3's chroot), built by the same code when it is missing, with the server's
# package installed on top: one sid to download and keep. A server in it shares the host's
# network and pids, and its state dir is bind-mounted at the same path (until stop.sh).

REDIS_SERIES="${REDIS_SERIES:-}"
# shellcheck source=../rabbitmq/series.sh
source "$(dirname "${BASH_SOURCE[0]}")/../rabbitmq/series.sh"

redis_suite_of() {
  case "$1" in
    7.0) echo bookworm ;;
    8.0 | valkey-9.1) echo sid ;;
    *) return 1 ;;
  esac
}

# The RabbitMQ series whose chroot is the Debian release a Redis series comes from.
redis_rabbitmq_series_of() {
  case "$(redis_suite_of "$1")" in
    bookworm) echo 3.10 ;;
    sid) echo 4.3 ;;
  esac
}

# The server, its command line client and its Debian packages, by flavour.
redis_flavour_of() { [[ "$1" == valkey-* ]] && echo valkey || echo redis; }
redis_packages_of() {
  # valkey-tools wants `systemd | systemd-standalone-sysusers`, and so on: apt picks the
  # first alternative that is there, and the chroot has systemd already (rabbitmq-server's).
  case "$(redis_flavour_of "$1")" in
    valkey) echo valkey-server valkey-tools ;;
    redis) echo redis-server redis-tools ;;
  esac
}

# redis_version_in ROOT FLAVOUR: the version of FLAVOUR's server under ROOT ("" = the
# host), or nothing. `redis-server --version` says "Redis server v=7.0.15 sha=...",
# valkey-server "Valkey server v=9.1.2 ...".
redis_version_in() {
  local bin="/usr/bin/$2-server" out
  [[ -x "$1$bin" ]] || return 1
  if [[ -n "$1" ]]; then out="$(chroot "$1" "$bin" --version 2>/dev/null)" || return 1
  else out="$("$bin" --version 2>/dev/null)" || return 1; fi
  out="${out#*v=}"
  out="${out%% *}"
  [[ -n "$out" ]] && echo "$out"
}

# The series a version of a flavour belongs to: 7.0.15 -> 7.0, valkey 9.1.2 -> valkey-9.1.
redis_series_of() {
  local s; s="$(series_of "$2")"
  if [[ "$1" == valkey ]]; then echo "valkey-$s"; else echo "$s"; fi
}

# Without systemd running, a package's postinst would start a system server on 6379 (through
# /etc/init.d) unless policy-rc.d forbids it.
redis_apt_in() {  # redis_apt_in ROOT PACKAGE...: apt-get install into ROOT ("" = the host)
  local root="$1" made=0 rc=0; shift
  if [[ ! -e "$root/usr/sbin/policy-rc.d" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" \
      && chmod +x "$root/usr/sbin/policy-rc.d" && made=1
  fi
  if [[ -z "$root" ]]; then
    apt_install "$@" || rc=$?
  else
    # One apt-get at a time in the chroot (its apt lock, which scripts/sid-python and
    # scripts/nats/series.sh take too): they install into it too. The chroot's package lists first
    # (what debootstrap fetched); sid drops old versions from the mirror, so a download
    # that fails is retried after an update (a mirror's snapshot of sid may be past its
    # Release file's Valid-Until: no reason to refuse it here).
    (
      flock -w 600 7 || exit 1
      in_root() {
        DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -o DPkg::Lock::Timeout=300 "$@"
      }
      in_root install -y -q --no-install-recommends "$@" \
        || { in_root -o Acquire::Check-Valid-Until=false update -q \
          && in_root install -y -q --no-install-recommends "$@"; }
    ) 7>"$root.apt.lock" >&2 || rc=$?
  fi
  [[ $made == 0 ]] || rm -f "$root/usr/sbin/policy-rc.d"
  return "$rc"
}

# Decide where the series comes from, install it if it is missing, and check that what is
# there is the series asked for. Sets ROOTFS, IN_ROOT, REDIS_FLAVOUR, REDIS_BIN, REDIS_CLI
# and REDIS_VERSION.
choose_redis() {
  ROOTFS="" IN_ROOT=()
  REDIS_FLAVOUR="$(redis_flavour_of "$REDIS_SERIES")"
  local host suite codename packages
  read -r -a packages <<<"$(redis_packages_of "$REDIS_SERIES")"
  if [[ -n "$REDIS_SERIES" ]]; then
    suite="$(redis_suite_of "$REDIS_SERIES")" \
      || die "REDIS_SERIES=$REDIS_SERIES is not a series these scripts run: 7.0, 8.0 or valkey-9.1 (or unset for the host's redis-server package)"
  fi
  host="$(redis_version_in "" "$REDIS_FLAVOUR")" || host=""
  codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
  can_install() { [[ "${REDIS_AUTO_INSTALL:-1}" == 1 && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; }
  if [[ -z "$REDIS_SERIES" \
      || ( -n "$host" && "$(redis_series_of "$REDIS_FLAVOUR" "$host")" == "$REDIS_SERIES" ) \
      || ( -z "$host" && "$codename" == "$suite" ) ]]; then
    # The host's own package: it is there, or the host's Debian ships the series.
    if [[ -z "$host" ]]; then
      can_install || die "${packages[0]} is not installed: apt-get install ${packages[*]} (as root), or set REDIS_URL to a server you run"
      log "${packages[0]} not installed: installing the Debian package (~10 s) ..."
      redis_apt_in "" "${packages[@]}" || die "apt-get install ${packages[*]} failed"
    fi
  else
    [[ "$(id -u)" == 0 ]] \
      || die "${REDIS_FLAVOUR}-server $REDIS_SERIES runs in a Debian $suite chroot, and building or entering one needs root (or set REDIS_URL to a $REDIS_SERIES server you run)"
    # RabbitMQ's chroot of this Debian release: built if missing, /etc/hosts and /proc.
    RMQ_SERIES="$(redis_rabbitmq_series_of "$REDIS_SERIES")"
    choose_series
    [[ -n "$ROOTFS" ]] \
      || die "${REDIS_FLAVOUR}-server $REDIS_SERIES: this host's Debian is $suite, yet its package is not that series"
    ensure_chroot
    if ! redis_version_in "$ROOTFS" "$REDIS_FLAVOUR" >/dev/null; then
      log "installing Debian $suite's ${packages[*]} into $ROOTFS (~15 s) ..."
      redis_apt_in "$ROOTFS" "${packages[@]}" || die "apt-get install ${packages[*]} failed in $ROOTFS"
    fi
    IN_ROOT=(chroot "$ROOTFS")
  fi
  REDIS_VERSION="$(redis_version_in "$ROOTFS" "$REDIS_FLAVOUR")" \
    || die "no ${REDIS_FLAVOUR}-server${ROOTFS:+ in $ROOTFS} after installing it"
  [[ -z "$REDIS_SERIES" || "$(redis_series_of "$REDIS_FLAVOUR" "$REDIS_VERSION")" == "$REDIS_SERIES" ]] \
    || die "Debian ${suite:-here} ships ${REDIS_FLAVOUR}-server $REDIS_VERSION, not $REDIS_SERIES: move the scripts to the series Debian ships"
  REDIS_BIN="/usr/bin/$REDIS_FLAVOUR-server"
  REDIS_CLI="/usr/bin/$REDIS_FLAVOUR-cli"
}

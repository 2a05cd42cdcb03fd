# shellcheck shell=bash
# Shared by scripts/dev and scripts/bench: finding PostgreSQL's server
# programs and running them as the cluster's owner. Source it after defining
# say and die.

# The system user that owns a private cluster when we run as root (initdb and
# postgres refuse to run as root).
PG_OS_USER=postgres

have() { command -v "$1" >/dev/null 2>&1; }

# The folder holding initdb and pg_ctl: PATH first, then the newest
# /usr/lib/postgresql/<version>/bin (Debian/Ubuntu keep them there).
find_pg_bin_dir() {
    local initdb dir
    if initdb="$(command -v initdb 2>/dev/null)"; then
        dir="$(dirname "$initdb")"
        if [[ -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

# Runs a command as the owner of the cluster: ourselves normally, the
# `postgres` system user when we are root.
as_cluster_owner() {
    if [[ $EUID -ne 0 ]]; then
        "$@"
    elif have runuser; then
        runuser -u "$PG_OS_USER" -- "$@"
    elif have su; then
        su -s /bin/bash "$PG_OS_USER" -c "$(printf '%q ' "$@")"
    else
        die "running as root, but neither runuser nor su is available to switch to the '$PG_OS_USER' user"
    fi
}

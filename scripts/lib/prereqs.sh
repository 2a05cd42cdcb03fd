# shellcheck shell=bash
# What the whole test suite needs besides Rust, checked in seconds before
# anything compiles, by `scripts/dev test`, `scripts/dev prereqs` and so
# `.ci/run`. What is missing is installed when it can be (as root, with
# apt-get; web/node_modules with npm ci), saying so; otherwise the run stops
# at once, naming everything that is missing and the command to install it.
# Source it after postgres.sh (have, find_pg_bin_dir) and after defining say
# and die.
#
# Each prerequisite is a function `prereq_NAME` that prints its apt packages
# if what it checks is missing (nothing if present); PREREQS lists them in
# order. Another file adds one with `PREREQS+=(name)` and its function.
#
# Where to look can be overridden (the prerequisites' own test does, to make
# them absent): CHROMIUM_PATH (default /usr/bin/chromium, as tests/browser.rs
# reads it), PGBOUNCER_PATH (default /usr/sbin/pgbouncer or
# /usr/bin/pgbouncer, as the test kit reads it). PREREQS_DRY_RUN=1 says what
# it would install and installs nothing.

PREREQS=(postgres node chromium pgbouncer python faketime)

# initdb, pg_ctl and pg_basebackup: the private clusters of the failover,
# chaos and PgBouncer tests.
prereq_postgres() {
    local dir
    # initdb on PATH may be a link into the server's folder, as the test kit
    # finds it.
    if dir="$(find_pg_bin_dir)" && dir="$(dirname "$(readlink -f "$dir/initdb")")" &&
        [[ -x "$dir/pg_ctl" && -x "$dir/pg_basebackup" ]]; then
        return 0
    fi
    echo "postgresql"
}
describe_postgres() { echo "PostgreSQL's server programs (initdb, pg_ctl, pg_basebackup)"; }

# Node.js 20 or newer with npm: tests/browser.rs.
prereq_node() {
    local major
    major="$(node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/')"
    if ! have npm || [[ ! "$major" =~ ^[0-9]+$ ]] || ((major < 20)); then
        echo "nodejs npm"
    fi
}
describe_node() { echo "Node.js 20 or newer with npm"; }

prereq_chromium() { [[ -x "${CHROMIUM_PATH:-/usr/bin/chromium}" ]] || echo "chromium"; }
describe_chromium() { echo "Chromium (${CHROMIUM_PATH:-/usr/bin/chromium}, the browser tests)"; }

prereq_pgbouncer() {
    if [[ -n "${PGBOUNCER_PATH:-}" ]]; then
        [[ -x "$PGBOUNCER_PATH" ]] || echo "pgbouncer"
    elif [[ ! -x /usr/sbin/pgbouncer && ! -x /usr/bin/pgbouncer ]]; then
        echo "pgbouncer"
    fi
}
describe_pgbouncer() { echo "PgBouncer (${PGBOUNCER_PATH:-/usr/sbin/pgbouncer}, the API suite's second pass)"; }

# venv with ensurepip: hadolint and schemathesis go into virtualenvs under
# target/ (ensure_venv_tool).
prereq_python() {
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || echo "python3-venv"
}
describe_python() { echo "Python 3 with venv (python3-venv)"; }

# libfaketime: tests/api/clock.rs runs instances whose clocks are days off.
prereq_faketime() {
    [[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || echo "faketime"
}
describe_faketime() { echo "libfaketime (faketime, instances with a wrong clock in tests/api/clock.rs)"; }

# The apt packages of every missing prerequisite, one line each as
# "PACKAGES|DESCRIPTION".
missing_prereqs() {
    local name packages
    for name in "${PREREQS[@]}"; do
        packages="$("prereq_$name")"
        [[ -z "$packages" ]] || echo "$packages|$("describe_$name")"
    done
}

# Checks every prerequisite; installs the missing ones as root, else stops.
ensure_prereqs() {
    local missing packages command line
    missing="$(missing_prereqs)"
    if [[ -n "$missing" ]]; then
        packages="$(cut -d'|' -f1 <<<"$missing" | tr '\n' ' ' | sed 's/ *$//')"
        command="apt-get install -y $packages"
        if [[ $EUID -ne 0 ]] || ! have apt-get; then
            {
                echo "missing what the test suite needs:"
                while IFS= read -r line; do echo "  - ${line#*|}"; done <<<"$missing"
                echo "install it as root, then run this again:"
                echo "  sudo apt-get update && sudo $command"
            } | while IFS= read -r line; do say "$line"; done
            exit 1
        fi
        say "installing what the test suite needs: apt-get update && $command"
        if [[ -n "${PREREQS_DRY_RUN:-}" ]]; then
            say "(dry run: nothing installed)"
            exit 0
        fi
        # shellcheck disable=SC2086 # the packages are words
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive $command; } ||
            die "could not install $packages; run as root: $command"
        missing="$(missing_prereqs)"
        [[ -z "$missing" ]] || die "still missing after installing: $(cut -d'|' -f2 <<<"$missing" | paste -sd ';')"
    fi
    # The browser tests' packages, from the committed lock file.
    if [[ ! -f web/node_modules/playwright-core/package.json || ! -f web/node_modules/pg/package.json ]]; then
        say "installing web/node_modules (npm ci in web/)"
        [[ -z "${PREREQS_DRY_RUN:-}" ]] || exit 0
        (cd web && npm ci --no-audit --no-fund >/dev/null) ||
            die "npm ci in web/ failed: the browser tests need the packages of web/package-lock.json"
    fi
}

# A Python tool in a virtualenv under target/ (so `cargo clean` removes it):
# `ensure_venv_tool VENV PACKAGE==VERSION COMMAND VERSION_TEXT`, installed
# with pip unless `COMMAND --version` already prints VERSION_TEXT.
ensure_venv_tool() {
    local venv=$1 spec=$2 command=$3 version_text=$4
    if ! "$venv/bin/$command" --version 2>/dev/null | grep -qF "$version_text"; then
        say "installing $spec into $venv (pip)"
        python3 -m venv --clear "$venv" ||
            die "python3 with venv is needed for $command: apt-get install python3-venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$spec" ||
            die "pip could not install $spec"
    fi
}

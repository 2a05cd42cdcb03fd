# A local Citus cluster for trying and testing chargeonce on a distributed
# PostgreSQL: a coordinator and two workers under .pgdata/citus/ (git-ignored),
# and, when the `citus` extension is not installed, building it from its
# source tarball (CITUS_SOURCE). Used by scripts/citus and the Citus hooks of
# scripts/dev and .ci/run. Source it after scripts/lib/postgres.sh, with
# REPO_ROOT, say and die defined.
#
# Citus is AGPL-3.0: nothing of it is kept in this repository, source or
# binary. It is built here only from the unmodified release tarball the
# caller names, whose digest must be the one below.

CITUS_VERSION=13.2.2
CITUS_SHA256=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430

# Debian's packages for building a PostgreSQL extension with everything
# Citus's configure looks for.
CITUS_BUILD_PACKAGES=(
    build-essential postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev
    libzstd-dev libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev flex bison
)

# The nodes, their folders under CITUS_ROOT and their ports (TCP on
# 127.0.0.1 only, no unix socket). The first is the coordinator.
CITUS_HOST=127.0.0.1
CITUS_NODES=(coordinator worker1 worker2)
# Below Linux's ephemeral port range (32768-60999): a port in it can be held
# by any client connection's local end, and the server then cannot bind it.
CITUS_PORTS=(25440 25441 25442)
CITUS_ROOT="$REPO_ROOT/.pgdata/citus"
# The database `up` prepares for the service; the `postgres` database is
# prepared too, for tools and tests that create their own databases.
CITUS_APP_DATABASE=chargeonce

citus_url() { echo "postgres://postgres@$CITUS_HOST:${CITUS_PORTS[0]}/${1:-$CITUS_APP_DATABASE}"; }

# The folder of PostgreSQL's server programs (find_pg_bin_dir), links
# followed: pg_config is found beside them (it is not always on PATH, e.g.
# when only initdb and pg_ctl are linked into /usr/local/bin).
citus_pg_bin_dir() {
    local bin_dir
    bin_dir="$(find_pg_bin_dir)" ||
        die "no initdb/pg_ctl found (PATH, /usr/lib/postgresql/*/bin): install PostgreSQL 15 (apt-get install postgresql)"
    dirname "$(readlink -f "$bin_dir/pg_ctl")"
}

# Is the citus extension installed for the PostgreSQL of bin folder $1?
citus_installed() {
    local pg_config=$1/pg_config
    [[ -x $pg_config ]] || pg_config=pg_config
    [[ -f "$("$pg_config" --pkglibdir)/citus.so" &&
        -f "$("$pg_config" --sharedir)/extension/citus.control" ]]
}

# Wraps Citus's own have_createdb_privilege in `#if PG_VERSION_NUM < 150020`:
# Citus 13.2.2 defines it as a static inline function for every PostgreSQL
# before 16, and PostgreSQL 15.20's commands/dbcommands.h declares the real
# one ("static declaration of 'have_createdb_privilege' follows non-static
# declaration"). From 15.20 on, the server's function is used. A source
# that no longer has that definition is left as it is.
citus_fix_pg15_headers() {
    local header=$1/src/include/pg_version_compat.h
    grep -qx 'have_createdb_privilege(void)' "$header" || return 0
    awk '
        held != "" {
            if ($0 == "have_createdb_privilege(void)") {
                print "#if PG_VERSION_NUM < 150020 /* 15.20 declares it in commands/dbcommands.h */"
                inside = 1
                patched = 1
            }
            print held
            held = ""
        }
        $0 == "static inline bool" && !inside { held = $0; next }
        { print }
        inside && $0 == "}" { print "#endif"; inside = 0 }
        END { exit patched ? 0 : 1 }
    ' "$header" >"$header.fixed" ||
        die "could not apply the PostgreSQL 15.20 fix to $header"
    mv "$header.fixed" "$header"
}

# Installs the Debian build packages that are missing (root only).
citus_install_build_packages() {
    local missing=() package
    for package in "${CITUS_BUILD_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
            missing+=("$package")
    done
    ((${#missing[@]} > 0)) || return 0
    say "installing the build packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
        die "could not install the build packages: apt-get install ${missing[*]}"
}

# Builds Citus from CITUS_SOURCE and installs it for the PostgreSQL of bin
# folder $1.
citus_build() {
    local bin_dir=$1 source=${CITUS_SOURCE:-} build digest tool
    if [[ -z $source ]]; then
        die "the citus extension is not installed for $("$bin_dir/postgres" --version). Install Citus $CITUS_VERSION from its packages (https://docs.citusdata.com/en/stable/installation/), or set CITUS_SOURCE to the citus-$CITUS_VERSION.tar.gz source tarball to build it here"
    fi
    [[ -f $source ]] || die "CITUS_SOURCE=$source: no such file"
    digest="$(sha256sum "$source" | cut -d' ' -f1)"
    [[ $digest == "$CITUS_SHA256" ]] ||
        die "CITUS_SOURCE=$source has sha256 $digest, not that of the Citus $CITUS_VERSION source ($CITUS_SHA256)"

    if [[ $EUID -eq 0 ]] && have apt-get; then
        citus_install_build_packages
    fi
    local pg_config=$bin_dir/pg_config
    [[ -f "$("$pg_config" --pgxs 2>/dev/null)" ]] ||
        die "PostgreSQL's extension build files are missing: as root, apt-get install ${CITUS_BUILD_PACKAGES[*]}"
    for tool in make gcc flex bison; do
        have "$tool" || die "$tool is needed to build Citus: as root, apt-get install ${CITUS_BUILD_PACKAGES[*]}"
    done
    [[ -w "$("$pg_config" --pkglibdir)" && -w "$("$pg_config" --sharedir)/extension" ]] ||
        die "installing Citus writes to $("$pg_config" --pkglibdir): run scripts/citus up as root (e.g. with sudo)"

    local started=$SECONDS
    build="$CITUS_ROOT/build"
    rm -rf "$build"
    mkdir -p "$build"
    say "building Citus $CITUS_VERSION from $source (log: $CITUS_ROOT/build.log)"
    tar -xzf "$source" -C "$build" --strip-components=1
    citus_fix_pg15_headers "$build"
    if ! (cd "$build" && ./configure PG_CONFIG="$pg_config" && make -j"$(nproc)" && make install) \
        >"$CITUS_ROOT/build.log" 2>&1; then
        tail -n 30 "$CITUS_ROOT/build.log" >&2
        die "building Citus failed (the end of $CITUS_ROOT/build.log is above)"
    fi
    rm -rf "$build"
    citus_installed "$bin_dir" || die "Citus was built but is not found where PostgreSQL looks for it"
    say "Citus $CITUS_VERSION built and installed for $("$bin_dir/postgres" --version) in $((SECONDS - started)) s"
}

# Runs SQL on node $1 (an index into CITUS_NODES) in database $2.
citus_psql() {
    local node=$1 database=$2
    shift 2
    PGOPTIONS='-c client_min_messages=warning' psql -X -w -v ON_ERROR_STOP=1 -h "$CITUS_HOST" -p "${CITUS_PORTS[$node]}" -U postgres \
        -d "$database" -Atq "$@"
}

# Does something answer as node $1?
citus_node_answers() {
    citus_psql "$1" postgres -c 'SELECT 1' >/dev/null 2>&1
}

citus_node_running() {
    local bin_dir=$1 node=$2
    as_cluster_owner "$bin_dir/pg_ctl" -D "$CITUS_ROOT/${CITUS_NODES[$node]}" status >/dev/null 2>&1
}

# Creates node $2's cluster on first use; starts it unless it runs.
citus_start_node() {
    local bin_dir=$1 node=$2
    local name=${CITUS_NODES[$node]} port=${CITUS_PORTS[$node]}
    local data=$CITUS_ROOT/$name log=$CITUS_ROOT/$name.log

    if [[ ! -f $data/PG_VERSION ]]; then
        say "creating the $name cluster in $data"
        if ! as_cluster_owner "$bin_dir/initdb" -D "$data" -U postgres --auth=trust \
            --encoding=UTF8 --locale=C >"$CITUS_ROOT/initdb-$name.log" 2>&1; then
            cat "$CITUS_ROOT/initdb-$name.log" >&2
            die "initdb failed for the $name (output above)"
        fi
        # A throwaway cluster for trying and testing: durability is traded
        # for speed (tests create and drop a database on every node per
        # test), as in testkit's clusters. wal_level=logical lets Citus move
        # shards (citus_rebalance_start, isolate_tenant_to_new_shard). The
        # test suite runs several services at once, each with its pools,
        # and every Citus database has a maintenance worker on every node.
        as_cluster_owner tee -a "$data/postgresql.conf" >/dev/null <<EOF

# scripts/citus: the $name of the local Citus cluster
listen_addresses = '$CITUS_HOST'
port = $port
unix_socket_directories = ''
shared_preload_libraries = 'citus'
max_connections = 300
max_prepared_transactions = 300
max_worker_processes = 64
wal_level = logical
fsync = off
synchronous_commit = off
full_page_writes = off
# Which database a line is about: the test suite makes one per test.
log_line_prefix = '%m [%p] %q%u@%d '
EOF
    fi

    if ! citus_node_running "$bin_dir" "$node"; then
        citus_node_answers "$node" &&
            die "something else answers on $CITUS_HOST:$port, where the $name must run; stop it first"
        say "starting the $name on $CITUS_HOST:$port (log: $log)"
        if ! as_cluster_owner "$bin_dir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null; then
            tail -n 20 "$log" >&2 || true
            die "could not start the $name"
        fi
    fi
    citus_node_answers "$node" || die "the $name runs but does not answer on $CITUS_HOST:$port"
}

# Makes database $1 a Citus database on every node with the workers
# registered at the coordinator. Each step is skipped when already done.
citus_prepare_database() {
    local database=$1 node
    for node in "${!CITUS_NODES[@]}"; do
        if [[ "$(citus_psql "$node" postgres -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" != 1 ]]; then
            citus_psql "$node" postgres -c "CREATE DATABASE \"$database\""
        fi
        citus_psql "$node" "$database" -c 'CREATE EXTENSION IF NOT EXISTS citus'
    done
    citus_psql 0 "$database" -c "SELECT citus_set_coordinator_host('$CITUS_HOST', ${CITUS_PORTS[0]})" >/dev/null
    for node in "${!CITUS_NODES[@]}"; do
        ((node > 0)) || continue
        # citus_add_node returns the node's id if it is registered already.
        citus_psql 0 "$database" -c "SELECT citus_add_node('$CITUS_HOST', ${CITUS_PORTS[$node]})" >/dev/null
    done
}

# Builds Citus if needed, starts the three nodes, prepares the databases.
citus_up() {
    local bin_dir node
    bin_dir="$(citus_pg_bin_dir)"
    have psql || die "psql is needed: apt-get install postgresql-client"
    if [[ $EUID -eq 0 ]]; then
        id -u "$PG_OS_USER" >/dev/null 2>&1 ||
            die "running as root, but there is no '$PG_OS_USER' system user to run PostgreSQL as"
    fi
    mkdir -p "$CITUS_ROOT"
    if citus_installed "$bin_dir"; then
        :
    else
        citus_build "$bin_dir"
    fi
    if [[ $EUID -eq 0 ]]; then
        chown -R "$PG_OS_USER": "$CITUS_ROOT"
        as_cluster_owner test -w "$CITUS_ROOT" ||
            die "the '$PG_OS_USER' user cannot write to $CITUS_ROOT (a parent folder is not searchable by it?)"
    fi
    for node in "${!CITUS_NODES[@]}"; do
        citus_start_node "$bin_dir" "$node"
    done
    citus_prepare_database postgres
    citus_prepare_database "$CITUS_APP_DATABASE"
    say "Citus $(citus_psql 0 postgres -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'"): coordinator $CITUS_HOST:${CITUS_PORTS[0]}, workers $(citus_psql 0 postgres -c "SELECT string_agg(nodename || ':' || nodeport, ', ' ORDER BY nodeport) FROM pg_dist_node WHERE groupid <> 0")"
}

# Stops the nodes this cluster runs (only those in CITUS_ROOT).
citus_down() {
    local bin_dir node
    bin_dir="$(citus_pg_bin_dir)"
    for node in "${!CITUS_NODES[@]}"; do
        [[ -f $CITUS_ROOT/${CITUS_NODES[$node]}/PG_VERSION ]] || continue
        if citus_node_running "$bin_dir" "$node"; then
            say "stopping the ${CITUS_NODES[$node]}"
            as_cluster_owner "$bin_dir/pg_ctl" -D "$CITUS_ROOT/${CITUS_NODES[$node]}" -m fast -w stop >/dev/null
        fi
    done
}

# Says what runs; exit status 0 when all three nodes run.
citus_status() {
    local bin_dir node all=0 pid
    bin_dir="$(citus_pg_bin_dir)"
    if citus_installed "$bin_dir"; then
        echo "citus extension: installed for $("$bin_dir/postgres" --version)"
    else
        echo "citus extension: not installed for $("$bin_dir/postgres" --version) (scripts/citus up builds it from CITUS_SOURCE)"
    fi
    for node in "${!CITUS_NODES[@]}"; do
        local name=${CITUS_NODES[$node]}
        if [[ ! -f $CITUS_ROOT/$name/PG_VERSION ]]; then
            echo "$name: not created"
            all=1
        elif citus_node_running "$bin_dir" "$node"; then
            pid="$(head -n 1 "$CITUS_ROOT/$name/postmaster.pid" 2>/dev/null || echo '?')"
            echo "$name: running on $CITUS_HOST:${CITUS_PORTS[$node]} (pid $pid, data $CITUS_ROOT/$name)"
        else
            echo "$name: stopped (data $CITUS_ROOT/$name)"
            all=1
        fi
    done
    if citus_node_answers 0; then
        echo "registered nodes: $(citus_psql 0 postgres -c "SELECT string_agg(nodename || ':' || nodeport || CASE WHEN groupid = 0 THEN ' (coordinator)' ELSE '' END, ', ' ORDER BY groupid) FROM pg_dist_node" 2>/dev/null || echo 'none')"
        echo "DATABASE_URL=$(citus_url)"
    fi
    return "$all"
}

# The API suite once more, on the local Citus cluster (started first, and
# Citus built if needed): test databases are made on every node
# (testkit/src/db.rs) and migrating distributes the tables.
citus_test_pass() {
    citus_up
    say "the API suite again, on Citus: a coordinator and two workers (scripts/citus)"
    TEST_DATABASE_URL="$(citus_url postgres)" cargo test --locked --features crash-points --test api
}

# The same load on chargeonce over the Citus cluster and over plain
# PostgreSQL, one after the other (docs/scaling.md, "Measured"): new
# charges (a fresh key each) and replays (one key) at 32 connections, by
# wrk, through the release binary with its defaults (simulated processor,
# RUST_LOG=warn). Plain PostgreSQL: CITUS_BENCH_PLAIN_URL (any database of
# the server; default the machine's 127.0.0.1:5432), where a database of
# its own is created and dropped. On Citus it also counts, from
# citus_stat_counters, the statements the coordinator ran on one shard
# (they named one merchant) and those it ran on several.
citus_bench() {
    command -v wrk >/dev/null || {
        [[ $(id -u) -eq 0 ]] || die "wrk is missing: apt-get install wrk"
        apt-get install -y -qq wrk >/dev/null
    }
    cargo build --release --locked --bin chargeonce >&2
    local plain_admin=${CITUS_BENCH_PLAIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
    local plain_db=chargeonce_citus_bench_plain
    psql -X -q "$plain_admin" -c "DROP DATABASE IF EXISTS $plain_db" -c "CREATE DATABASE $plain_db"
    local work
    work=$(mktemp -d)
    # Each request a fresh key (per wrk thread, counter); or always one.
    cat >"$work/new.lua" <<'LUA'
local counter, thread_id = 0, 0
setup = function(thread) thread:set("tid", thread_id); thread_id = thread_id + 1 end
init = function() prefix = "k" .. tid .. "-" .. os.time() .. "-" end
request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. counter
  return wrk.format("POST", "/v1/charges", nil, '{"amount": 1000, "currency": "USD"}')
end
LUA
    cat >"$work/replay.lua" <<'LUA'
request = function()
  wrk.headers["Idempotency-Key"] = "replay-one"
  return wrk.format("POST", "/v1/charges", nil, '{"amount": 1000, "currency": "USD"}')
end
LUA
    local plain_url=${plain_admin%/*}/$plain_db
    echo "| database | new charges/s | new p50 / p99 ms | replays/s | replay p99 ms | non-2xx |"
    echo "|---|---:|---:|---:|---:|---:|"
    citus_bench_one "$work" "Citus: coordinator + 2 workers" "$(citus_url)" 18441 citus
    citus_bench_one "$work" "PostgreSQL" "$plain_url" 18442
    psql -X -q "$plain_admin" -c "DROP DATABASE IF EXISTS $plain_db"
    echo
    cat "$work/shards.txt"
    rm -rf "$work"
}

# One row of citus_bench's table: WORK LABEL DATABASE_URL PORT [citus].
# With `citus`, the shard counts of the new charges' run go to
# WORK/shards.txt.
citus_bench_one() {
    local work=$1 label=$2 url=$3 port=$4 citus=${5:-} bin=target/release/chargeonce
    DATABASE_URL=$url "$bin" migrate >/dev/null
    local key
    key=$(DATABASE_URL=$url "$bin" merchant create "bench $(date +%s)")
    DATABASE_URL=$url CHARGEONCE__SERVER__PORT=$port RUST_LOG=warn "$bin" serve >"$work/service-$port.log" 2>&1 &
    local pid=$!
    local base=http://127.0.0.1:$port
    for _ in $(seq 100); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.1; done
    local args=(-t2 -c32 --latency -H "Authorization: Bearer $key" -H "Content-Type: application/json")
    wrk "${args[@]}" -d3s -s "$work/new.lua" "$base" >/dev/null # warm-up
    [[ -n $citus ]] && citus_bench_reset_counters
    wrk "${args[@]}" -d20s -s "$work/new.lua" "$base" >"$work/new.txt"
    [[ -n $citus ]] && citus_bench_shards "$(awk '/requests in/ {print $1}' "$work/new.txt")" >"$work/shards.txt"
    # The replayed charge exists before its replays start.
    curl -sf -o /dev/null -X POST "${args[@]:3}" -H "Idempotency-Key: replay-one" \
        -d '{"amount": 1000, "currency": "USD"}' "$base/v1/charges"
    wrk "${args[@]}" -d10s -s "$work/replay.lua" "$base" >"$work/replay.txt"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local field='/Requests\/sec/ {r=$2} / 50%/ {p50=$2} / 99%/ {p99=$2} /Non-2xx/ {bad=$5}'
    local new replay
    new=$(awk "$field END {print r, p50, p99, bad+0}" "$work/new.txt")
    replay=$(awk "$field END {print r, p99, bad+0}" "$work/replay.txt")
    read -r new_rate new_p50 new_p99 new_bad <<<"$new"
    read -r replay_rate replay_p99 replay_bad <<<"$replay"
    echo "| $label | ${new_rate%.*} | $new_p50 / $new_p99 | ${replay_rate%.*} | $replay_p99 | $((new_bad + replay_bad)) |"
    if ((new_bad + replay_bad > 0)); then
        say "$label: answers other than 2xx; the service's warnings:"
        grep -E 'WARN|ERROR' "$work/service-$port.log" | tail -n 5 >&2
    fi
}

# Counts, from now on, the statements the coordinator runs on one shard
# and on several (citus_stat_counters, off by default).
citus_bench_reset_counters() {
    citus_psql 0 postgres -c 'ALTER SYSTEM SET citus.enable_stat_counters = on' \
        -c 'SELECT pg_reload_conf()' >/dev/null
    sleep 0.2
    citus_psql 0 "$CITUS_APP_DATABASE" \
        -c 'SELECT citus_stat_counters_reset(oid) FROM pg_database WHERE datname = current_database()' >/dev/null
}

# The statements of the last run by how many shards Citus ran them on
# (REQUESTS: how many new charges it made): one (the statement named one
# merchant) or several (the background workers' reads across merchants).
citus_bench_shards() {
    local requests=$1 one several
    read -r one several < <(citus_psql 0 "$CITUS_APP_DATABASE" -F ' ' -c "
        SELECT query_execution_single_shard, query_execution_multi_shard
          FROM citus_stat_counters WHERE name = current_database()")
    echo "On Citus, during the $requests new charges: $one statements ran on one shard" \
        "($(awk "BEGIN {printf \"%.2f\", $one / $requests}") per new charge), $several on several" \
        "(the background workers' reads across merchants, about one per worker round)."
}

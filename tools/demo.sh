#!/bin/bash
# demo.sh - the main job of `make demo`: data-parallel training of a small
# MLP on the digits data set with 4 worker processes and one coordinator.
#
#   tools/demo.sh [BIN_DIR]        default BIN_DIR: build/bin
#
# 1. fetches the data set (tools/fetch-digits.sh -> build/data/digits.csv);
# 2. starts BIN_DIR/cohortd on a free loopback port;
# 3. launches COHORT_DEMO_RANKS (default 4) train_digits workers with
#    COHORT_COORDINATOR, COHORT_JOB, COHORT_RANK and COHORT_WORLD_SIZE set;
# 4. waits for them, at most COHORT_DEMO_TIMEOUT seconds (default 300),
#    then stops the coordinator; the exit status is the workers' (the first
#    failing rank's exit code, 0 if all succeeded).
#
# Rank 0 prints the progress; every rank's stderr (library logs) and the
# other ranks' stdout go to build/demo/rank-N.log, the coordinator's to
# build/demo/cohortd.log; the curves go to build/demo/curves.svg. Extra
# arguments for train_digits: COHORT_DEMO_ARGS (e.g. "--epochs 10").
# Only processes this script started are ever signalled.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bindir=${1:-build/bin}
build=$(dirname "$bindir")
ranks=${COHORT_DEMO_RANKS:-4}
timeout_s=${COHORT_DEMO_TIMEOUT:-300}
outdir=$build/demo
data=$build/data/digits.csv
svg=$outdir/curves.svg
job=demo-$$

coord_pid=
worker_pids=()

log() { echo "demo: $*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
	local pid
	for pid in "${worker_pids[@]}"; do
		kill -0 "$pid" 2> /dev/null && kill -KILL "$pid" 2> /dev/null
	done
	if [[ -n $coord_pid ]] && kill -0 "$coord_pid" 2> /dev/null; then
		kill -TERM "$coord_pid" 2> /dev/null
		for _ in $(seq 50); do
			kill -0 "$coord_pid" 2> /dev/null || break
			sleep 0.1
		done
		kill -KILL "$coord_pid" 2> /dev/null
	fi
	wait 2> /dev/null
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
	if command -v python3 > /dev/null; then
		python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
	else
		echo $((20000 + RANDOM % 30000))
	fi
}

port_open() {
	(exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null
}

# Starts cohortd; sets coord_pid and coord_url. Retries on a port race.
start_coordinator() {
	local port
	for _ in 1 2 3 4 5; do
		port=$(free_port)
		coord_url=tcp://127.0.0.1:$port
		"$bindir/cohortd" --listen "$coord_url" \
		    > "$outdir/cohortd.log" 2>&1 &
		coord_pid=$!
		for _ in $(seq 200); do
			if port_open "$port"; then
				log "coordinator $coord_url (pid $coord_pid)"
				return 0
			fi
			kill -0 "$coord_pid" 2> /dev/null || break
			sleep 0.05
		done
		kill -KILL "$coord_pid" 2> /dev/null
		wait "$coord_pid" 2> /dev/null
		coord_pid=
	done
	cat "$outdir/cohortd.log" >&2
	die "cohortd did not start (log: $outdir/cohortd.log)"
}

# The launch: one process per rank with the environment libcohort reads.
# (`cohort run -n N` does the same; this stays the one place to change.)
launch_workers() {
	local r
	# shellcheck disable=SC2206
	local args=(--data "$data" --svg "$svg" ${COHORT_DEMO_ARGS:-})
	for ((r = 0; r < ranks; r++)); do
		if ((r == 0)); then
			env COHORT_COORDINATOR="$coord_url" COHORT_JOB="$job" \
			    COHORT_RANK=$r COHORT_WORLD_SIZE="$ranks" \
			    "$bindir/train_digits" "${args[@]}" \
			    2> "$outdir/rank-$r.log" &
		else
			env COHORT_COORDINATOR="$coord_url" COHORT_JOB="$job" \
			    COHORT_RANK=$r COHORT_WORLD_SIZE="$ranks" \
			    "$bindir/train_digits" "${args[@]}" \
			    > "$outdir/rank-$r.log" 2>&1 &
		fi
		worker_pids+=($!)
	done
}

# Waits for every worker up to timeout_s; sets rc to the first failing
# rank's exit code (124 on timeout).
wait_workers() {
	local deadline=$((SECONDS + timeout_s)) r alive st
	rc=0
	while :; do
		alive=0
		for r in "${!worker_pids[@]}"; do
			kill -0 "${worker_pids[$r]}" 2> /dev/null && alive=1
		done
		((alive)) || break
		if ((SECONDS >= deadline)); then
			log "timeout after ${timeout_s}s: killing the workers"
			rc=124
			for r in "${!worker_pids[@]}"; do
				kill -KILL "${worker_pids[$r]}" 2> /dev/null
			done
			break
		fi
		sleep 0.1
	done
	for r in "${!worker_pids[@]}"; do
		wait "${worker_pids[$r]}"
		st=$?
		if ((st != 0 && rc != 124)); then
			log "rank $r exited with status $st" \
			    "(log: $outdir/rank-$r.log)"
			((rc == 0)) && rc=$st
		fi
	done
}

show_failure_logs() {
	local r
	for ((r = 0; r < ranks; r++)); do
		echo "--- rank $r: $outdir/rank-$r.log (last lines)" >&2
		tail -n 8 "$outdir/rank-$r.log" >&2
	done
}

[[ -x $bindir/cohortd && -x $bindir/train_digits ]] ||
    die "$bindir/cohortd or $bindir/train_digits missing (run make)"
[[ $ranks =~ ^[1-9][0-9]*$ ]] || die "bad COHORT_DEMO_RANKS '$ranks'"
mkdir -p "$outdir" || die "cannot create $outdir"
"$here/fetch-digits.sh" "$data" || die "no data set"

start_coordinator
log "training on $ranks ranks (job $job; logs in $outdir/)"
start=$(date +%s.%N)
launch_workers
wait_workers
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" \
    'BEGIN { printf "%.1f", b - a }')
if ((rc == 0)); then
	log "done in ${elapsed}s; curves: $svg"
else
	show_failure_logs
	log "FAILED (status $rc) after ${elapsed}s"
fi
exit "$rc"

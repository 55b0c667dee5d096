#!/bin/bash
# gpu-check-lib.sh - what tools/gpu-check.sh and tools/gpu-check-nccl.sh
# share (sourced, not run): messages, the output folder, the summary (a
# Markdown table, one row a step) and a Check suite as one of its rows.
#
# Set before sourcing: NAME (the prefix of messages and the summary's
# name, NAME.md), BIN (the built binaries), ROOT (the repository).

die() { echo "$NAME: $*" >&2; exit 2; }

# The output folder ($OUT, the device tool's, or build/gpu-check), the
# carried libraries on the search path, COHORT_BIN, an empty summary.
gpu_setup() {
	OUTDIR=${OUT:-$ROOT/build/gpu-check}
	mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
	[ -d "$ROOT/build/gpu-libs" ] &&
	    export LD_LIBRARY_PATH="$ROOT/build/gpu-libs:${LD_LIBRARY_PATH:-}"
	export COHORT_BIN=$BIN
	summary=$OUTDIR/$NAME.md
	failed=0
	: > "$summary"
}

row() { printf '| %-28s | %-6s | %s |\n' "$1" "$2" "$3" >> "$summary"; }

# gpu_header [LINE...]: the summary's title, the GPU and the LINEs in a
# block, then the head of the table.
gpu_header() {
	{
		echo "# cohort $NAME $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo
		echo '```'
		if command -v nvidia-smi > /dev/null; then
			nvidia-smi --query-gpu=name,driver_version,memory.total \
			    --format=csv,noheader 2>&1
		else
			echo "nvidia-smi: not available"
		fi
		for line in "$@"; do
			echo "$line"
		done
		echo '```'
		echo
		echo "| step                         | result | detail |"
		echo "|------------------------------|--------|--------|"
	} >> "$summary"
}

# suite NAME [LIMIT]: one Check suite through the test runner
# (CK_RUN_SUITE is Check's own) within LIMIT seconds (540), its log in
# suite-NAME.log, its row in the summary; a SKIP line on the GPU machine
# counts as a failure.
suite() {
	local name=$1 limit=${2:-540} log=$OUTDIR/suite-$1.log rc tally
	CK_RUN_SUITE=$name CK_FORK=yes timeout "$limit" "$BIN/cohort-tests" \
	    > "$log" 2>&1
	rc=$?
	tally=$(grep -Eo '[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' \
	    "$log" | tail -1)
	# A test that needs more GPUs than the machine has may skip ("needs
	# ... three GPUs"); one that found no GPU at all fails.
	nogpu=$(grep '^SKIP ' "$log" | grep -v -E 'needs .*(two|three|[2-9]) GPUs' | head -1)
	more=$(grep '^SKIP ' "$log" | grep -E 'needs .*(two|three|[2-9]) GPUs' | head -1)
	if [ -n "$nogpu" ]; then
		row "suite $name" FAIL "skipped on the GPU machine: $nogpu"
		failed=1
	elif [ $rc -ne 0 ] || [ -z "$tally" ]; then
		row "suite $name" FAIL \
		    "exit $rc; ${tally:-no tally}; see suite-$name.log"
		failed=1
	else
		row "suite $name" PASS "$tally${more:+ ($more)}"
	fi
}

#!/bin/bash
# demo.sh - the main job of `make demo`: data-parallel training of a small
# MLP on the digits data set with 4 worker processes through cohort run.
#
#   tools/demo.sh [BIN_DIR]        default BIN_DIR: build/bin
#
# 1. fetches the data set (tools/fetch-digits.sh -> build/data/digits.csv);
# 2. `cohort run -n RANKS` starts an embedded coordinator and the workers,
#    supervises them, and prints a failure report if one fails;
# 3. the run is bounded by COHORT_DEMO_TIMEOUT seconds (default 300).
#
# Rank 0 prints the progress; the curves go to build/demo/curves.svg.
# Settings: COHORT_DEMO_RANKS (default 4), COHORT_DEMO_ARGS (extra
# train_digits arguments, e.g. "--epochs 10 --accum 2", "--hook bf16",
# "--strategy hvd"). The strategy is ddp unless COHORT_DEMO_ARGS names
# another; with "--strategy spawn" or "--strategy dp" train_digits starts
# its workers (or replicas) itself: it runs without cohort run, with
# --ranks COHORT_DEMO_RANKS.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bindir=${1:-build/bin}
build=$(dirname "$bindir")
ranks=${COHORT_DEMO_RANKS:-4}
timeout_s=${COHORT_DEMO_TIMEOUT:-300}
outdir=$build/demo
data=$build/data/digits.csv
svg=$outdir/curves.svg

log() { echo "demo: $*" >&2; }

mkdir -p "$outdir"
"$here/fetch-digits.sh" "$data" || { log "error: no data set"; exit 1; }
[[ -x $bindir/cohort && -x $bindir/train_digits ]] ||
	{ log "error: $bindir/cohort or train_digits missing (run make)"; exit 1; }

# Library logs (JSON lines when not on a terminal) go to a file; the
# progress and the launcher's failure report stay on the screen.
export COHORT_LOG_LEVEL=${COHORT_LOG_LEVEL:-warn}

# The strategy: the last --strategy of COHORT_DEMO_ARGS, else ddp.
strategy=ddp
read -ra extra <<<"${COHORT_DEMO_ARGS:-}"
for ((i = 0; i < ${#extra[@]}; i++)); do
	case ${extra[i]} in
	--strategy=*) strategy=${extra[i]#--strategy=} ;;
	--strategy) ((i + 1 < ${#extra[@]})) && strategy=${extra[i + 1]} ;;
	esac
done
case $strategy in
spawn | dp)
	log "running train_digits --strategy $strategy --ranks $ranks" \
		"(one process starts them; timeout ${timeout_s} s)"
	launch=("$bindir/train_digits" --ranks "$ranks")
	;;
*)
	log "running train_digits --strategy $strategy on $ranks ranks" \
		"through cohort run (timeout ${timeout_s} s)"
	launch=("$bindir/cohort" run -n "$ranks" --job "demo-$$" --
		"$bindir/train_digits")
	;;
esac

start=$SECONDS
timeout --signal=TERM --kill-after=10 "$timeout_s" \
	"${launch[@]}" --data "$data" --svg "$svg" \
	${extra[@]+"${extra[@]}"} 2> >(tee "$outdir/stderr.log" |
	grep -v '^{"ts"' >&2)
rc=$?
if ((rc == 0)); then
	log "done in $((SECONDS - start)) s; curves: $svg"
else
	log "failed with status $rc (logs: $outdir/stderr.log)"
fi
exit $rc

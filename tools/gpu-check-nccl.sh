#!/bin/bash
# gpu-check-nccl.sh - the GPU checks of the nccl and tcp-staged backends.
#
#   tools/gpu-check-nccl.sh [BIN]      on the GPU machine (BIN: build/bin)
#
# 1. finds the machine's own libnccl.so.2 and libcudart.so.{13,12} (NCCL
#    is not carried: PyTorch's wheel or the CUDA toolkit has one) and
#    points COHORT_NCCL_LIB / COHORT_CUDART_LIB at them, unless set;
# 2. runs suite_nccl (world-size-1 collectives on device buffers, init
#    and run deadlines, abort from another thread, argument errors,
#    tcp-staged with 1-3 ranks sharing the GPU); a SKIP line there fails;
# 3. runs suite_nccl_bench: all-reduce (f32 sum) time through nccl (1
#    rank), tcp-staged (1, 2, 4 ranks on the one GPU) and plain tcp on
#    host memory (2, 4 ranks), and prints the table.
#
# Output: $OUT (the device tool's folder) or build/gpu-check:
# gpu-check-nccl.md (summary + table), suite-nccl.log, suite-nccl_bench.log.
# Exit status 0 when every step passed. Carry build/bin (and build/gpu-libs
# from tools/gpu-check.sh --bundle): nothing is installed on the machine.
set -u

NAME=gpu-check-nccl
BIN=${1:-build/bin}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tools/gpu-check-lib.sh"
gpu_setup
[ -x "$BIN/cohort-tests" ] || die "$BIN/cohort-tests missing (carry build/bin)"
# the suites' logs say what the backends do
export COHORT_LOG_LEVEL=${COHORT_LOG_LEVEL:-info}

# First match of a library name under the usual roots (site-packages of
# any Python, the CUDA toolkits, the system library folders).
find_lib() {
	local name=$1 hit
	hit=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
	if [ -z "$hit" ]; then
		hit=$(find /usr /opt /root /home /usr/local -xdev \
		    \( -name "$name" -o -name "$name.*" \) \
		    \( -type f -o -type l \) 2>/dev/null | sort | head -1)
	fi
	echo "$hit"
}

if [ -z "${COHORT_NCCL_LIB:-}" ]; then
	lib=$(find_lib libnccl.so.2)
	[ -n "$lib" ] && export COHORT_NCCL_LIB=$lib
fi
# The runtime goes on the search path rather than in COHORT_CUDART_LIB,
# so that the loader can fall back from libcudart.so.13 to .so.12 when the
# driver is too old for 13.
if [ -z "${COHORT_CUDART_LIB:-}" ]; then
	for v in 12 13; do
		lib=$(find_lib libcudart.so.$v)
		[ -n "$lib" ] &&
		    export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
	done
fi

gpu_header "COHORT_NCCL_LIB=${COHORT_NCCL_LIB:-(default search)}" \
    "COHORT_CUDART_LIB=${COHORT_CUDART_LIB:-(search: libcudart.so.13, .12)}" \
    "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

suite nccl 400
suite nccl_bench 540

{
	echo
	echo "## Abort and timeout latencies (suite nccl)"
	echo
	echo '```'
	grep -E 'EABORTED|ETIMEDOUT after' "$OUTDIR/suite-nccl.log" || echo "(none printed)"
	echo '```'
	echo
	echo "## All-reduce, f32 sum (suite nccl_bench; GB/s = bytes / time)"
	echo
	grep -E '^\| (path|-|nccl|tcp)' "$OUTDIR/suite-nccl_bench.log" ||
	    echo "(no table: see suite-nccl_bench.log)"
	echo
	echo "## NCCL through cohort against raw NCCL (suite nccl_bench)"
	echo
	grep -E '^\| +(bytes|-|[0-9])' "$OUTDIR/suite-nccl_bench.log" ||
	    echo "(no table: see suite-nccl_bench.log)"
	echo
	echo "gpu-check-nccl: $([ $failed -eq 0 ] && echo PASS || echo FAIL)"
} >> "$summary"
cat "$summary"
exit $failed

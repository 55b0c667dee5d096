#!/bin/bash
# gpu-check.sh - the one command for cohort's GPU checks (docs: GPU.md).
#
#   tools/gpu-check.sh [BIN]            on a GPU machine: kernel suites,
#                                       extra GPU suites, kernel benchmark
#   tools/gpu-check.sh --bundle [BIN]   here: copy the shared libraries the
#                                       test binaries need into build/gpu-libs
#   tools/gpu-check.sh --emulate [BIN]  here, no GPU: run suite_cuda_kernels
#                                       with fusion.cu's kernels executed on
#                                       the host (sequential blocks/threads)
#
# BIN defaults to build/bin. On the GPU machine (nothing to install there):
#   here:   make && tools/gpu-check.sh --bundle
#   device: run(command="tools/gpu-check.sh build/bin",
#               carry=["build/bin", "build/gpu-libs"])
# Results go to $OUT (the device tool's output folder) or build/gpu-check:
# gpu-check.md (summary table + kernel table), one .log per step.
# GPU_CHECK_SUITES adds Check suites to run (e.g. "nccl ddp_gpu"); a GPU
# suite that prints a SKIP line on the GPU machine counts as a failure,
# unless the line says the test needs more GPUs than the machine has.
# Exit status: 0 when every step passed.
set -u

mode=run
case "${1:-}" in
--bundle) mode=bundle; shift ;;
--emulate) mode=emulate; shift ;;
-h|--help) sed -n '2,22p' "$0"; exit 0 ;;
esac
NAME=gpu-check
BIN=${1:-build/bin}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tools/gpu-check-lib.sh"

# --- bundle: the Debian libraries cohort links, for carrying -----------------
if [ "$mode" = bundle ]; then
	dest=$ROOT/build/gpu-libs
	mkdir -p "$dest" || die "cannot create $dest"
	for b in "$BIN"/cohort-tests "$BIN"/cuda_bench; do
		[ -x "$b" ] || die "$b missing: run make first"
		ldd "$b" | awk '/=> \// { print $3 }'
	done | sort -u | while read -r lib; do
		case "$(basename "$lib")" in
		libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|\
		libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
		*) cp -L "$lib" "$dest/" ;;
		esac
	done
	# The CUDA runtime libcohort's bridge dlopen()s (client/backend/
	# cudart.c; the kernel helpers go through it too): the toolkit's own,
	# the one the kernels were compiled against.
	for lib in "${CUDA_HOME:-/usr/local/cuda}"/lib64/libcudart.so.[0-9]*; do
		case $lib in *.so.[0-9] | *.so.[0-9][0-9]) cp -L "$lib" "$dest/" ;; esac
	done
	du -sh "$dest"
	ls "$dest"
	exit 0
fi

# --- emulate: the real kernel source on the host ---------------------------
if [ "$mode" = emulate ]; then
	NVCC_INC=${CUDA_HOME:-/usr/local/cuda}/include
	LIBDIR=$(cd "$BIN/../lib" 2>/dev/null && pwd) ||
	    die "$BIN/../lib missing: run make first"
	GEN=$(cd "$BIN/../gen" 2>/dev/null && pwd) ||
	    die "$BIN/../gen missing: run make first"
	[ -f "$NVCC_INC/cuda_fp16.h" ] || die "no CUDA headers in $NVCC_INC"
	tmp=$(mktemp -d) || die "mktemp"
	trap 'rm -rf "$tmp"' EXIT
	cat > "$tmp/emu.h" <<'EOF'
/* Kernels as host functions: blocks and threads run one after another
 * (fusion.cu uses no shared memory, no __syncthreads, and every thread
 * writes its own elements). */
#include <cuda_runtime_api.h>
#include <vector_types.h>
#include <cmath>
#undef __global__
#define __global__
#undef __grid_constant__
#define __grid_constant__
#define __launch_bounds__(x)
struct emu_dim { unsigned x, y, z; };
static emu_dim threadIdx, blockIdx, blockDim, gridDim;
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
using std::isnan;
template <typename F> struct emu_launch {
	unsigned g, t;
	F f;
	template <typename... A> void operator()(A... a)
	{
		gridDim = { g, 1, 1 };
		blockDim = { t, 1, 1 };
		for (unsigned b = 0; b < g; b++)
			for (unsigned th = 0; th < t; th++) {
				blockIdx = { b, 0, 0 };
				threadIdx = { th, 0, 0 };
				f(a...);
			}
	}
};
template <typename F>
emu_launch<F> emu_make(unsigned g, unsigned t, int, cudaStream_t, F f)
{
	return { g, t, f };
}
#define cudaGetLastError() cudaSuccess
EOF
	cat > "$tmp/emu_gpu.c" <<'EOF'
/* cohort__gpu_* over host memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cohort_impl.h"
#include "kernels.h"
static _Thread_local char last[256];
const char *cohort__cuda_last_error(void) { return (last); }
cohort_status cohort__cuda_fail(const char *w, int c, const char *n,
    const char *t)
{
	snprintf(last, sizeof(last), "%s: %s (%d): %s", w, n, c, t);
	return (cohort__err(COHORT_ECUDA, "%s", last));
}
bool cohort__gpu_available(void) { return (true); }
const char *cohort__gpu_unavailable_reason(void) { return (""); }
cohort_status cohort__gpu_describe(char *buf, size_t len)
{
	snprintf(buf, len, "host emulation of fusion.cu");
	return (COHORT_OK);
}
cohort_status cohort__gpu_alloc(void **p, size_t n)
{
	void *q = n > ((size_t) 1 << 40) ? NULL : malloc(n);
	if (q == NULL)
		return (cohort__cuda_fail("cudaMalloc", 2,
		    "cudaErrorMemoryAllocation", "out of memory"));
	*p = q;
	return (COHORT_OK);
}
void cohort__gpu_free(void *p) { free(p); }
cohort_status cohort__gpu_memcpy_h2d(void *d, const void *s, size_t n)
{ memcpy(d, s, n); return (COHORT_OK); }
cohort_status cohort__gpu_memcpy_d2h(void *d, const void *s, size_t n)
{ memcpy(d, s, n); return (COHORT_OK); }
cohort_status cohort__gpu_memcpy_d2d(void *d, const void *s, size_t n,
    void *st)
{ memcpy(d, s, n); return (COHORT_OK); }
cohort_status cohort__gpu_memset(void *d, int b, size_t n)
{ memset(d, b, n); return (COHORT_OK); }
cohort_status cohort__gpu_sync(void) { return (COHORT_OK); }
EOF
	cat > "$tmp/run.c" <<'EOF'
#include <check.h>
Suite *suite_cuda_kernels(void);
int main(void)
{
	SRunner *sr = srunner_create(suite_cuda_kernels());
	int nf;
	srunner_run_all(sr, CK_NORMAL);
	nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return (nf != 0);
}
EOF
	cd "$ROOT" || die "cd $ROOT"
	# kernel<<<grid, threads, shmem, stream>>>(args) becomes
	# emu_make(grid, threads, shmem, stream, kernel)(args)
	k='s/([A-Za-z_0-9]+(?:<[^<>;()]*>)?)\s*<<<([^>]*)>>>\(/emu_make(\2, \1)(/g'
	perl -0pe "$k"';s/#include <cuda_runtime.h>/#include "emu.h"/' \
	    tests/cuda/kernels/fusion.cu \
	    > "$tmp/fusion_emu.cpp" || die "perl"
	INC="-Iinclude -Iclient -Icommon -Iproto -Itests/cuda/kernels -Itests/harness -I$GEN -I$tmp"
	g++ -std=c++17 -O2 -w $INC -I"$NVCC_INC" -c "$tmp/fusion_emu.cpp" \
	    -o "$tmp/fusion_emu.o" || die "compiling the emulated kernels"
	for f in "$tmp/emu_gpu.c" "$tmp/run.c" tests/cuda/test_kernels.c; do
		gcc -std=c11 -D_GNU_SOURCE -O2 -DCOHORT_HAVE_CUDA $INC \
		    $(pkg-config --cflags check) -c "$f" \
		    -o "$tmp/$(basename "$f" .c).o" || die "compiling $f"
	done
	g++ -pthread -o "$tmp/emu" "$tmp"/run.o "$tmp"/test_kernels.o \
	    "$tmp"/emu_gpu.o "$tmp"/fusion_emu.o "$LIBDIR/libcohort_cuda.a" \
	    "$BIN/../obj/tests/harness/harness.o" "$LIBDIR/libcohort.a" \
	    -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart_static -lrt \
	    -lnng -lmbedx509 -lmbedcrypto $(pkg-config --libs check libprotobuf-c) -ldl -lm ||
	    die "linking"
	"$tmp/emu"
	exit $?
fi

# --- run: on the GPU machine -----------------------------------------------
gpu_setup
gpu_header

[ -x "$BIN/cohort-tests" ] || die "$BIN/cohort-tests missing (carry build/bin)"
suite cuda_ref
suite cuda_kernels
for s in ${GPU_CHECK_SUITES:-}; do
	suite "$s"
done

if [ -x "$BIN/cuda_bench" ]; then
	timeout 300 "$BIN/cuda_bench" -o "$OUTDIR/kernels.md" \
	    > "$OUTDIR/cuda_bench.log" 2>&1
	rc=$?
	if grep -q '^SKIP ' "$OUTDIR/cuda_bench.log"; then
		row "cuda_bench" FAIL "$(head -1 "$OUTDIR/cuda_bench.log")"
		failed=1
	elif [ $rc -ne 0 ]; then
		row "cuda_bench" FAIL "exit $rc; see cuda_bench.log"
		failed=1
	else
		row "cuda_bench" PASS "see the kernel table"
	fi
else
	row "cuda_bench" FAIL "$BIN/cuda_bench missing"
	failed=1
fi

if [ -f "$OUTDIR/kernels.md" ]; then
	{
		echo
		echo "## Kernels (25 MiB buckets; GB/s = bytes read + written)"
		echo
		cat "$OUTDIR/kernels.md"
	} >> "$summary"
fi
# The NCCL backend (world size 1), abort/error paths, and all-reduce time
# through each path (nccl, tcp-staged with 1-4 ranks on the one GPU, tcp).
if [ -x "$ROOT/tools/gpu-check-nccl.sh" ]; then
	if OUT="$OUTDIR" "$ROOT/tools/gpu-check-nccl.sh" "$BIN" \
	    > "$OUTDIR/gpu-check-nccl.log" 2>&1; then
		row "nccl backend" PASS "see gpu-check-nccl.md"
	else
		row "nccl backend" FAIL "see gpu-check-nccl.log"
		failed=1
	fi
	if [ -f "$OUTDIR/gpu-check-nccl.md" ]; then
		{ echo; cat "$OUTDIR/gpu-check-nccl.md"; } >> "$summary"
	fi
fi

echo >> "$summary"
echo "gpu-check: $([ $failed -eq 0 ] && echo PASS || echo FAIL)" >> "$summary"
cat "$summary"
exit $failed

# cohort - top-level Makefile.
#
#   make              build everything (CPU path always; CUDA/NCCL if found)
#   make test         install missing Debian packages, build, run all suites
#   make test SAN=address,undefined   the same under ASan/UBSan (build/san/)
#   make demo         the main job: multi-process training on 4 ranks
#   make demo-lightning   the same with PyTorch Lightning on "cohort"
#   make test-python  the Python suite (real torch + Lightning in .venv)
#   make bench        cohort vs Gloo vs Open MPI, interleaved, medians
#   make install PREFIX=/usr/local
#   make check-style  clang-format check + banned-function grep
#   make check-k8s    kustomize build + kubernetes-validate + hadolint (deploy/)
#   make fuzz [FUZZ_SECONDS=60]   every libFuzzer target in fuzz/ (clang)
#   make chaos        the chaos suites at full size (about 30 min)
#
# Sources are discovered by directory, so adding a file needs no edit here:
#   client/*.c client/backend/*/*.c   -> libcohort.{a,so}
#   server/*/*.c                      -> libcohortd.a (cohortd + embedded)
#   strategies/*.c                    -> libcohort_strategies.a
#   tools/cohort/*.c                  -> bin/cohort (CLI)
#   tests/{harness,unit,integration,fault,chaos,cuda}/*.c -> bin/cohort-tests
#   tests/bin/NAME.c                  -> bin/NAME (helper programs for tests)
#   examples/NAME.c                   -> bin/NAME
#   tests/cuda/kernels/*.c (CPU refs, GPU helpers), *.cu (only with nvcc)
#                                     -> libcohort_cuda.a (tests, cuda_bench)

SHELL := /bin/bash
PREFIX ?= /usr/local
CC ?= gcc
ifeq ($(origin CC),default)
CC := gcc
endif

ifneq ($(strip $(SAN)),)
BUILD ?= build/san
SANFLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
else
BUILD ?= build
SANFLAGS :=
endif

# The release, as the public header spells it (its one place).
VERSION := $(shell sed -nE 's/^\#define COHORT_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+).*/\2/p' \
	include/cohort/cohort.h | paste -sd.)

OBJ := $(BUILD)/obj
GEN := $(BUILD)/gen
BIN := $(BUILD)/bin
LIB := $(BUILD)/lib

PKGS := libprotobuf-c check
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT ?= -O2
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror \
	-Wstrict-prototypes -Wno-unused-parameter -fPIC -fvisibility=hidden \
	-pthread -MMD -MP \
	$(SANFLAGS)
# Each part of the tree sees only its own headers and the layers below it
# (docs/architecture.md; tools/check-layers.sh checks the sources too):
#   common -> proto -> client | server -> strategies, tools, examples
INC_COMMON := -Iinclude -iquote common
INC_PROTO := $(INC_COMMON) -iquote proto -I$(GEN)
INC_STRAT := -Iinclude -iquote strategies
$(OBJ)/common/%.o: PART_INC := $(INC_COMMON)
$(OBJ)/proto/%.o: PART_INC := $(INC_PROTO)
$(OBJ)/gen/%.o: PART_INC := $(INC_PROTO)
$(OBJ)/client/%.o: PART_INC := $(INC_PROTO) -iquote client
# server/: a header of the same folder is included bare, one of another
# folder by its folder ("core/call.h"), so -iquote server is all it needs.
$(OBJ)/server/%.o: PART_INC := $(INC_PROTO) -iquote server
$(OBJ)/strategies/%.o: PART_INC := $(INC_STRAT)
$(OBJ)/examples/lib/%.o: PART_INC := -Iinclude -iquote examples/lib
$(OBJ)/examples/%.o: PART_INC := $(INC_STRAT) -iquote examples/lib
# The cohort CLI embeds the coordinator (server.h), speaks the protocol
# through the client's coordinator engine, and starts its workers with the
# launcher core of cohort_spawn (strategies/launch.h).
$(OBJ)/tools/%.o: PART_INC := $(INC_PROTO) -iquote client -iquote server \
	-iquote strategies
$(OBJ)/bench/%.o: PART_INC := $(INC_PROTO) -iquote client -iquote tests/unit
# Tests look inside every part.
$(OBJ)/tests/%.o: PART_INC := $(INC_PROTO) -iquote client -iquote server \
	-iquote tests/cuda/kernels -iquote strategies -iquote tests/harness \
	-iquote examples/lib -iquote examples
CPPFLAGS = $(PART_INC) $(PKG_CFLAGS)
LDLIBS := -lnng -lmbedx509 -lmbedcrypto $(PKG_LIBS) -lpthread -lm -ldl
# What libcohort.so itself needs (no test framework).
LIB_LDLIBS := -lnng -lmbedx509 -lmbedcrypto $(shell pkg-config --libs libprotobuf-c 2>/dev/null) \
	-lpthread -lm -ldl
LDFLAGS := $(SANFLAGS) -pthread

# --- optional GPU toolchain probe (never required) -------------------------
CUDA_HOME ?= /usr/local/cuda
NVCC := $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h $(CUDA_HOME)/targets/x86_64-linux/include/nccl.h))
ifneq ($(strip $(NVCC)),)
HAVE_CUDA := 1
endif
ifneq ($(strip $(NCCL_H)),)
HAVE_NCCL := 1
endif
ifeq ($(NO_CUDA),1)
HAVE_CUDA :=
HAVE_NCCL :=
endif

# --- sources ----------------------------------------------------------------
PROTO_C := $(GEN)/cohort.pb-c.c
PROTO_H := $(GEN)/cohort.pb-c.h

# The floor (common/ + the wire framing and generated code of proto/).
COMMON_SRC := $(wildcard common/*.c) $(wildcard proto/*.c)
# libcohort. The nccl backend is plain C that dlopen()s libnccl/libcudart
# at run time, so it is always built; it reports ENOTSUP where no GPU or
# library exists.
LIB_SRC := $(wildcard client/*.c) $(wildcard client/backend/*.c) \
	$(wildcard client/backend/*/*.c)
# The CUDA kernels and their CPU references, beside their tests: a library
# of their own (libcohort_cuda.a), used by the GPU tests and cuda_bench;
# libcohort does not call them (docs/gpu.md).
CUDA_SRC := $(wildcard tests/cuda/kernels/*.c)
CU_SRC := $(if $(HAVE_CUDA),$(wildcard tests/cuda/kernels/*.cu))
SRV_SRC := $(filter-out server/main.c,$(wildcard server/*.c server/*/*.c))
STRAT_SRC := $(wildcard strategies/*.c)
CLI_SRC := $(wildcard tools/cohort/*.c)
TEST_SRC := $(wildcard tests/harness/*.c tests/unit/*.c tests/integration/*.c \
	tests/fault/*.c tests/chaos/*.c tests/cuda/*.c)
TESTBIN_SRC := $(wildcard tests/bin/*.c)
EXAMPLE_SRC := $(wildcard examples/*.c)
# Shared model/data code of the examples (also linked into the tests).
EXLIB_SRC := $(wildcard examples/lib/*.c)

o = $(patsubst %.c,$(OBJ)/%.o,$(1))
COMMON_OBJ := $(call o,$(COMMON_SRC)) $(OBJ)/gen/cohort.pb-c.o
LIB_OBJ := $(call o,$(LIB_SRC)) $(COMMON_OBJ)
CUDA_OBJ := $(call o,$(CUDA_SRC)) $(patsubst %.cu,$(OBJ)/%.cu.o,$(CU_SRC))
SRV_OBJ := $(call o,$(SRV_SRC))
STRAT_OBJ := $(call o,$(STRAT_SRC))
EXLIB_OBJ := $(call o,$(EXLIB_SRC))
CLI_OBJ := $(call o,$(CLI_SRC))
TEST_OBJ := $(call o,$(TEST_SRC)) $(OBJ)/gen/suites.o
TESTBINS := $(patsubst tests/bin/%.c,$(BIN)/%,$(TESTBIN_SRC))
EXAMPLES := $(patsubst examples/%.c,$(BIN)/%,$(EXAMPLE_SRC))

DEFS := $(if $(HAVE_CUDA),-DCOHORT_HAVE_CUDA) $(if $(HAVE_NCCL),-DCOHORT_HAVE_NCCL)
CFLAGS := $(CFLAGS_BASE) $(DEFS)

STATIC_LIBS := $(LIB)/libcohort_examples.a $(LIB)/libcohort_strategies.a \
	$(LIB)/libcohortd.a $(LIB)/libcohort_cuda.a $(LIB)/libcohort.a
CUDA_LINK := $(if $(CU_SRC),-L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++)

.PHONY: all test test-unit test-python test-hosts test-san demo demo-lightning bench \
	test-lane-c test-lane-py pyenv \
	bench-faults bench-torch install clean check-style deps probe gpu-check \
	check-k8s fuzz fuzz-build chaos
.DEFAULT_GOAL := all

all: probe $(BIN)/cohortd $(BIN)/cohort $(LIB)/libcohort.so \
	$(LIB)/libcohort_strategies.so $(BIN)/cohort-tests \
	$(TESTBINS) $(EXAMPLES) $(BIN)/tcp_microbench $(BUILD)/cohort.pc

probe:
	@echo "cohort $(VERSION) build: CC=$(CC) BUILD=$(BUILD) SAN=$(or $(SAN),none)" \
	  "cuda=$(if $(HAVE_CUDA),$(NVCC),not found)" \
	  "nccl=$(if $(HAVE_NCCL),$(NCCL_H),not found)"

# --- generated code ---------------------------------------------------------
$(PROTO_C) $(PROTO_H): proto/cohort.proto
	@mkdir -p $(GEN)
	protoc-c --proto_path=proto --c_out=$(GEN) proto/cohort.proto

# Every test file defines `Suite *suite_<name>(void)`; collect them.
$(GEN)/suites.c: $(TEST_SRC) tools/gen_suites.sh
	@mkdir -p $(GEN)
	tools/gen_suites.sh $(filter %.c,$^) > $@.tmp && mv $@.tmp $@

$(OBJ)/gen/%.o: $(GEN)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-error -c $< -o $@

# Everything that includes the protobuf header needs it generated first.
$(call o,$(COMMON_SRC) $(LIB_SRC) $(SRV_SRC) $(CLI_SRC) $(TEST_SRC) $(CUDA_SRC) \
	$(TESTBIN_SRC) server/main.c bench/tcp_microbench.c): | $(PROTO_H)

$(OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(OBJ)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden \
	  -Iinclude -Icommon -Itests/cuda/kernels \
	  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	  -gencode arch=compute_90,code=compute_90 $(DEFS) -c $< -o $@

# --- libraries --------------------------------------------------------------
# The static libraries: each one's objects, then the one recipe.
$(LIB)/libcohort.a: $(LIB_OBJ)
$(LIB)/libcohort_common.a: $(COMMON_OBJ)
$(LIB)/libcohort_cuda.a: $(CUDA_OBJ)
$(LIB)/libcohortd.a: $(SRV_OBJ)
$(LIB)/libcohort_strategies.a: $(STRAT_OBJ)
$(LIB)/libcohort_examples.a: $(EXLIB_OBJ)
$(LIB)/%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB)/libcohort.so: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libcohort.so.0 -Wl,--no-undefined $(LDFLAGS) \
	  -o $@ $^ $(LIB_LDLIBS)

$(LIB)/libcohort_strategies.so: $(STRAT_OBJ) $(LIB)/libcohort.so
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libcohort_strategies.so.0 $(LDFLAGS) -o $@ \
	  $(STRAT_OBJ) -L$(LIB) -lcohort -lpthread -lm

# --- programs ---------------------------------------------------------------
# cohortd stands on the floor only: no client code in the coordinator.
$(BIN)/cohortd: $(OBJ)/server/main.o $(LIB)/libcohortd.a $(LIB)/libcohort_common.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIB_LDLIBS)

$(BIN)/cohort: $(CLI_OBJ) $(STATIC_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(CUDA_LINK) $(LDLIBS)

$(BIN)/cohort-tests: $(TEST_OBJ) $(STATIC_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(CUDA_LINK) $(LDLIBS)

$(BIN)/%: $(OBJ)/tests/bin/%.o $(STATIC_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(CUDA_LINK) $(LDLIBS)

$(BIN)/%: $(OBJ)/examples/%.o $(STATIC_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(CUDA_LINK) $(LDLIBS)

# Internal microbenchmark of the tcp backend (uses cohort__ symbols).
$(BIN)/tcp_microbench: $(OBJ)/bench/tcp_microbench.o $(LIB)/libcohort.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/cohort.pc: tools/cohort.pc.in include/cohort/cohort.h
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

# --- tasks ------------------------------------------------------------------
deps:
	@tools/deps.sh

# make test: dependencies, build, every suite: the Check suites, then the
# Python suite against the real torch and Lightning in .venv (installed by
# tools/pyenv.sh; COHORT_SKIP_PYTHON=1 skips it on a machine without PyPI,
# CI never does). COHORT_TEST_SUITE=name (or Check's CK_RUN_SUITE /
# CK_RUN_CASE) narrows the Check run; PYTEST_ARGS the Python one.
#
# The suites run in two lanes at once: the Check suites then the namespace
# hosts, beside the Python suite then deploy/'s check. They mostly wait (on
# sockets, deadlines and child processes: the C suite uses a sixth of its
# wall time on a CPU), so on a 2-core machine the whole takes about the
# longer lane. Each lane's output is printed whole when the lane ends;
# either failing fails the run (after the other ends).
test: deps
	$(MAKE) all
	$(MAKE) pyenv
	@tools/fetch-digits.sh build/data/digits.csv
	$(MAKE) -j2 --output-sync=target test-lane-c test-lane-py

test-lane-c:
	COHORT_BIN=$(BIN) $(BIN)/cohort-tests
	$(MAKE) test-hosts

test-lane-py:
	$(MAKE) test-python
	$(MAKE) check-k8s

# The venv once, before the lanes (two pip runs into one venv would race);
# the digits data set too (tools/fetch-digits.sh): the elastic suites of
# both lanes train the demo on it, at train_digits' default path.
pyenv:
	@if [[ "$(COHORT_SKIP_PYTHON)" != 1 && -z "$(SAN)" ]]; then \
	  tools/pyenv.sh $(VENV); \
	fi

VENV ?= .venv
test-python:
	@if [[ "$(COHORT_SKIP_PYTHON)" == 1 ]]; then \
	  echo "test-python: SKIPPED (COHORT_SKIP_PYTHON=1): torch and Lightning were not tested"; \
	elif [[ -n "$(SAN)" ]]; then \
	  echo "test-python: not run under SAN=$(SAN) (a sanitized libcohort cannot load into python)"; \
	else \
	  tools/pyenv.sh $(VENV) && \
	  COHORT_BIN=$(abspath $(BIN)) $(VENV)/bin/python -m pytest python/tests -q $(PYTEST_ARGS); \
	fi

# Many hosts: network namespaces on a bridge (tests/hosts/hostnet.py), each
# with its own address and /dev/shm; needs root, iproute2 and nftables
# (tools/deps.sh) and pytest from the venv. Skips with a line otherwise.
test-hosts:
	@if [[ "$(COHORT_SKIP_PYTHON)" == 1 ]]; then \
	  echo "test-hosts: SKIPPED (COHORT_SKIP_PYTHON=1: pytest comes from the venv)"; \
	elif [[ -n "$(SAN)" ]]; then \
	  echo "test-hosts: not run under SAN=$(SAN)"; \
	else \
	  tools/pyenv.sh $(VENV) && \
	  COHORT_BIN=$(abspath $(BIN)) $(VENV)/bin/python -m pytest tests/hosts -q -rs $(PYTEST_ARGS); \
	fi

# deploy/ checked offline: every kustomize overlay rendered and validated
# (kubernetes-validate --strict, Kubernetes 1.30 on), the Dockerfile
# linted (hadolint); the tools are pinned wheels in .venv.
check-k8s:
	@if [[ "$(COHORT_SKIP_PYTHON)" == 1 ]]; then \
	  echo "check-k8s: SKIPPED (COHORT_SKIP_PYTHON=1): deploy/ was not checked"; \
	else \
	  tools/pyenv.sh $(VENV) && $(VENV)/bin/python tools/check-k8s.py; \
	fi

test-san:
	$(MAKE) test SAN=address,undefined

# The chaos suites (tests/chaos/, issue 22) at the issue's sizes: floods
# of descriptors, partial frames, parked requests and TCPStore
# connections; a byte flipped at every offset of a small log and a log
# cut in half; tenancy; the coordinator kill storm (20 runs of a 60 s
# storm under `cohort run -n 4` training). Each case prints CHAOS lines
# with its figures. `make test` runs the same suites at a small size.
CHAOS_SUITES := chaos_flood,chaos_journal,chaos_tenancy,chaos_storm
chaos: all
	COHORT_CHAOS=full COHORT_BIN=$(BIN) COHORT_TEST_SUITE=$(CHAOS_SUITES) \
	  $(BIN)/cohort-tests

demo: deps
	$(MAKE) all
	@tools/demo.sh $(BIN)

# The same training with PyTorch Lightning on the cohort backend.
demo-lightning: deps
	$(MAKE) all
	@tools/pyenv.sh $(VENV)
	@tools/fetch-digits.sh $(BUILD)/data/digits.csv
	$(VENV)/bin/python examples/lightning_digits.py --devices 2 --data $(BUILD)/data/digits.csv

bench:
	@COHORT_DEPS_BENCH=1 tools/deps.sh
	$(MAKE) all
	@bench/compare $(BIN)

# cohort vs gloo from PyTorch: DDP steps, all_reduce, per-call cost.
bench-torch: deps
	$(MAKE) all
	@tools/pyenv.sh $(VENV)
	$(VENV)/bin/python bench/torch_compare.py $(BENCH_ARGS)

bench-faults: deps
	$(MAKE) all
	@bench/faults $(BIN) --trials 20 --stop-trials 5

gpu-check: all
	@tools/gpu-check.sh $(BIN)

# libcohort (cohort.pc) and the strategies (cohort-strategies.pc: ddp,
# spawn, dp, hvd; headers <cohort/ddp.h> ...), static and shared.
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include/cohort
	install -m 755 $(BIN)/cohortd $(BIN)/cohort $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB)/libcohort.a $(LIB)/libcohort_strategies.a \
	  $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB)/libcohort.so $(DESTDIR)$(PREFIX)/lib/libcohort.so.0
	ln -sf libcohort.so.0 $(DESTDIR)$(PREFIX)/lib/libcohort.so
	install -m 755 $(LIB)/libcohort_strategies.so \
	  $(DESTDIR)$(PREFIX)/lib/libcohort_strategies.so.0
	ln -sf libcohort_strategies.so.0 \
	  $(DESTDIR)$(PREFIX)/lib/libcohort_strategies.so
	install -m 644 include/cohort/*.h \
	  $(filter-out strategies/launch.h,$(wildcard strategies/*.h)) \
	  $(DESTDIR)$(PREFIX)/include/cohort/
	for pc in cohort cohort-strategies; do \
	  sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    tools/$$pc.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$pc.pc; \
	done

# --- fuzzing (libFuzzer; clang from tools/deps.sh) ---------------------------
# Every fuzz/fuzz_<name>.c defining LLVMFuzzerTestOneInput is a target; an
# optional fuzz/seed_<name>.c writes its seed corpus (with the project's
# own encoder) into the directory it is given. `make fuzz` builds them with
# clang -fsanitize=fuzzer,address,undefined over the whole tree (common,
# proto, client, server: instrumented into build/fuzz/), generates the
# seeds, runs each target FUZZ_SECONDS (60) and prints executions,
# coverage and crashes per target (tools/fuzz.sh); any crash fails it.
# FUZZ_TARGETS=a,b narrows the run. Corpora grow in build/fuzz/corpus/.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD := build/fuzz
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wno-unused-parameter \
	-pthread -MMD -MP $(FUZZ_SAN) $(INC_PROTO) -iquote client -iquote server \
	-iquote fuzz -iquote tests/unit -I$(FUZZ_BUILD)/gen $(PKG_CFLAGS)
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
FUZZ_NAMES := $(patsubst fuzz/fuzz_%.c,%,$(FUZZ_SRC))
FUZZ_SEEDS := $(patsubst fuzz/seed_%.c,%,$(wildcard fuzz/seed_*.c))
FUZZ_LIBSRC := $(COMMON_SRC) $(LIB_SRC) $(SRV_SRC)
FUZZ_LIBOBJ := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_LIBSRC)) \
	$(FUZZ_BUILD)/obj/gen/cohort.pb-c.o
FUZZ_BINS := $(patsubst %,$(FUZZ_BUILD)/bin/fuzz_%,$(FUZZ_NAMES)) \
	$(patsubst %,$(FUZZ_BUILD)/bin/seed_%,$(FUZZ_SEEDS))

$(FUZZ_BUILD)/gen/cohort.pb-c.c $(FUZZ_BUILD)/gen/cohort.pb-c.h: proto/cohort.proto
	@mkdir -p $(FUZZ_BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(FUZZ_BUILD)/gen proto/cohort.proto

$(FUZZ_LIBOBJ) $(patsubst fuzz/%.c,$(FUZZ_BUILD)/obj/fuzz/%.o,$(wildcard fuzz/*.c)): \
	| $(FUZZ_BUILD)/gen/cohort.pb-c.h

$(FUZZ_BUILD)/obj/gen/%.o: $(FUZZ_BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/lib/libcohort_fuzz.a: $(FUZZ_LIBOBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/bin/fuzz_%: $(FUZZ_BUILD)/obj/fuzz/fuzz_%.o $(FUZZ_BUILD)/lib/libcohort_fuzz.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -pthread -o $@ $^ $(LIB_LDLIBS)

$(FUZZ_BUILD)/bin/seed_%: $(FUZZ_BUILD)/obj/fuzz/seed_%.o $(FUZZ_BUILD)/lib/libcohort_fuzz.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_SAN) -pthread -o $@ $^ $(LIB_LDLIBS)

fuzz-build:
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found (tools/deps.sh installs clang)"; exit 2; }
	$(MAKE) $(FUZZ_BINS)

fuzz: fuzz-build
	@tools/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) "$(or $(FUZZ_TARGETS),$(FUZZ_NAMES))"

check-style:
	@tools/check-style.sh

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
ifneq ($(filter fuzz fuzz-build $(FUZZ_BUILD)/%,$(MAKECMDGOALS)),)
-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)
endif

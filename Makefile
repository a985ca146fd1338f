# rlk - one build for the library, the tools, the tests and the benchmarks.
#
#   make                 librlk.so / librlk.a and the tools under build/
#   make test            every test that needs no GPU (what CI runs)
#   make test-gpu        the same plus the GPU suites (needs a CUDA device)
#   make sanitize        the tests under AddressSanitizer + UBSan (build-asan/)
#   make fuzz            the fuzz targets (tests/fuzz, clang's libFuzzer + ASan/UBSan, build-fuzz/),
#                        FUZZ_SECONDS (60) each after replaying their kept corpus
#   make bench           the benchmarks (tools/rlk-bench); kept results are in tools/bench/
#   make precompile      a shippable cache for PRECOMPILE_TARGETS under cache/
#   make install PREFIX=/usr/local
#
# Needs: a C11 compiler, make, and Check (Debian: apt-get install check) for the tests.
# NVRTC, hiprtc, libcuda and libamdhip64 are opened at run time, never linked.

VERSION_MAJOR := 0
VERSION_MINOR := 1
VERSION_PATCH := 0
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)

CC ?= cc
PREFIX ?= /usr/local
BUILD ?= build
SANITIZE ?=

OPT ?= -O2
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-missing-field-initializers
CPPFLAGS += -Iinclude -Isrc -Itemplates -D_GNU_SOURCE
CFLAGS += -std=c11 $(OPT) -g -fPIC -fvisibility=hidden -pthread $(WARN) $(SANITIZE)
LDFLAGS += -pthread $(SANITIZE)
LDLIBS += -ldl -lm

# Check is linked statically so the test binaries also run on machines that lack it.
CHECK_LIBS := $(shell pkg-config --libs --static check 2>/dev/null | sed 's/-lcheck_pic/-l:libcheck.a/; s/-lsubunit/-l:libsubunit.a/')
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)

LIB_SRCS := $(sort $(wildcard src/core/*.c src/jit/*.c src/backend/*/*.c src/backend/*.c src/runtime/*.c src/ops/*.c src/tune/*.c))
TEMPLATES := $(sort $(wildcard templates/common/* templates/cuda/* templates/host/*))
GEN_EMBED := $(BUILD)/gen/templates_embedded.c

LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/templates_embedded.o
TOOLS := $(patsubst tools/%.c,%,$(sort $(wildcard tools/rlk-*.c)))
TOOL_BINS := $(TOOLS:%=$(BUILD)/bin/%)
TOOL_OBJS := $(TOOLS:%=$(BUILD)/obj/tools/%.o)
.SECONDARY: $(TOOL_OBJS)

TEST_SRCS := $(sort $(wildcard tests/*.c tests/ref/*.c))
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(BUILD)/tests/check_rlk

SONAME := librlk.so.$(VERSION_MAJOR)
SHLIB := $(BUILD)/lib/librlk.so.$(VERSION)
STLIB := $(BUILD)/lib/librlk.a

# `make` alone builds the library and the tools (the first rule below is not that).
.DEFAULT_GOAL := all

.PHONY: all lib tools tests test test-targets test-gpu sanitize bench precompile install clean deps demo
.PHONY: fuzz fuzz-build fuzz-corpus
.PHONY: python-test conformance conformance-venv trainer-test trainer-test-openrlhf vllm-test check-layers wheel sdist
.PHONY: package-test python-test-torch

all: lib tools

# The layers of src/ at the include level (the source) and the link level (the objects: each
# layer calls only its own and lower ones), the tools' use of the public header, the templates'
# includes.
check-layers: $(STLIB) $(TOOL_OBJS)
	CC="$(CC)" tools/build/check_layers.sh --self-test
	tools/build/check_layers.sh
	tools/build/check_layers.sh --links $(BUILD)/obj

lib: $(SHLIB) $(STLIB)
tools: $(TOOL_BINS)
tests: $(TEST_BIN) $(TOOL_BINS)

# ---- template embedding --------------------------------------------------------
$(BUILD)/bin/rlk-embed-templates: tools/build/embed_templates.c src/jit/sha256.c src/jit/sources_digest.c | $(BUILD)/bin
	$(CC) $(CPPFLAGS) -std=c11 -O2 $(WARN) -o $@ $^

$(GEN_EMBED): $(BUILD)/bin/rlk-embed-templates $(TEMPLATES) | $(BUILD)/gen
	$(BUILD)/bin/rlk-embed-templates templates $@ $(TEMPLATES:templates/%=%)

# ---- library ---------------------------------------------------------------------
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/gen/templates_embedded.o: $(GEN_EMBED)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(SHLIB): $(LIB_OBJS) | $(BUILD)/lib
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined $(LDFLAGS) -o $@ $^ $(LDLIBS)
	ln -sf librlk.so.$(VERSION) $(BUILD)/lib/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/lib/librlk.so

$(STLIB): $(LIB_OBJS) | $(BUILD)/lib
	rm -f $@
	ar rcs $@ $^

# Tools and tests link the static library: one self-contained binary each, which is also
# what travels to the GPU machine. A tool's object stays under $(BUILD)/obj/tools, where the
# link check reads what it calls.
$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(STLIB) | $(BUILD)/bin
	$(CC) -o $@ $< $(STLIB) $(LDFLAGS) $(LDLIBS)

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	@pkg-config --exists check || { echo "Check is missing: apt-get install check pkg-config" >&2; exit 1; }
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(CHECK_CFLAGS) -MMD -MP -c $< -o $@

$(TEST_BIN): $(TEST_OBJS) $(STLIB) | $(BUILD)/tests
	$(CC) -o $@ $(TEST_OBJS) $(STLIB) $(LDFLAGS) $(CHECK_LIBS) $(LDLIBS)

$(BUILD)/bin $(BUILD)/lib $(BUILD)/gen $(BUILD)/tests:
	mkdir -p $@

# ---- running ---------------------------------------------------------------------
# deps installs missing system packages (as root) or names the command that does.
deps:
	@tools/build/deps.sh

# The main job: JIT-compile and run the first op, then a whole GRPO step (sample, log-probs and
# entropy, group advantages, policy loss and gradient, log-prob backward), on the best backend
# present, each checked against fp64, with the cache's work and per-op times.
demo: deps
	$(MAKE) tools
	$(BUILD)/bin/rlk-demo
	$(BUILD)/bin/rlk-grpo-step

# Tests run against a private cache so they never touch the user's.
# The build and the suites use every CPU (TEST_JOBS; the suites, one per process, longest first).
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps
	CC="$(CC)" tools/build/check_layers.sh --self-test
	tools/build/check_layers.sh
	$(MAKE) -j$(TEST_JOBS) tests
	tools/build/check_layers.sh --links $(BUILD)/obj
	RLK_TEST_BIN_DIR=$(abspath $(BUILD)/bin) tools/build/run_checks.sh $(TEST_BIN) $(TEST_JOBS)
	$(if $(SANITIZE),,$(MAKE) python-test)

# The samples of every op compiled for the targets `make test` leaves out (it takes the host and
# sm_90a): the sm_80 fallbacks, datacenter and consumer Blackwell (sm_100a, sm_120a: no wgmma, so
# the fallbacks again, which NVRTC must accept for them), HIP gfx90a and gfx1030 (RDNA in wave64
# mode); the suites' plan cases alone. RLK_TEST_TARGETS=all for every target.
TEST_TARGETS_OTHER := sm_80,sm_100a,sm_120a,gfx90a,gfx1030
test-targets: deps
	$(MAKE) -j$(TEST_JOBS) tests
	RLK_TEST_TARGETS=$(or $(RLK_TEST_TARGETS),$(TEST_TARGETS_OTHER)) CK_RUN_CASE=plan RLK_TEST_BIN_DIR=$(abspath $(BUILD)/bin) \
	  tools/build/run_checks.sh $(TEST_BIN) $(TEST_JOBS)

# The Python package (python/rlk) against the library just built: numpy on the host backend;
# torch and GPU cases skip with a reason where torch or a device is missing. With pytest-xdist
# the files spread over TEST_JOBS workers.
PYTEST_JOBS ?= $(shell python3 -c 'import xdist' >/dev/null 2>&1 && echo "-n $(TEST_JOBS) --dist loadfile")
python-test: lib
	PYTHONPATH=python RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) python3 -m pytest -q $(PYTEST_JOBS) python/tests

# Conformance with the trainers: installs torch and the pinned verl, TRL and OpenRLHF (their
# loss and advantage modules, --no-deps) into a virtual environment, then runs their functions
# unchanged beside rlk (python/conformance). Needs PyPI; about 6 GB and 10 minutes the first time.
CONF_VENV ?= $(BUILD)/conformance-venv

# The four test venvs below each hold torch with its CUDA libraries and triton (about 5 GB of the
# same files); after each install the identical large files among them become hard links
# (util-linux's hardlink; pip replaces files, never edits them in place): about 9 GB for the four
# rather than 24, on CI machines whose disk is shared.
define share_venv_files
	@venvs=$$(for d in $(CONF_VENV) $(TRAINER_VENV) $(OPENRLHF_VENV) $(VLLM_VENV); do \
	  test -d $$d && echo $$d; done); \
	if command -v hardlink >/dev/null; then hardlink -t -q -s 256K $$venvs; \
	else echo "hardlink (util-linux) not found: each venv keeps its own copy of torch"; fi
endef

CONF_REPORT ?= python/conformance/RESULTS.md
conformance-venv:
	@test -x $(CONF_VENV)/bin/python || python3 -m venv $(CONF_VENV)
	$(CONF_VENV)/bin/pip install -q -r python/conformance/requirements-deps.txt
	$(share_venv_files)

conformance: lib conformance-venv
	$(CONF_VENV)/bin/pip install -q --no-deps -r python/conformance/requirements.txt
	RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) RLK_CONFORMANCE_REPORT=$(abspath $(CONF_REPORT)) \
	  $(CONF_VENV)/bin/python -m pytest -q -c python/conformance/pytest.ini python/conformance

# The trainers running with rlk patched in (python/trainers): TRL's GRPOTrainer on a tiny random
# Qwen2 model (5 steps, beside TRL's own: plain, gradient accumulation, two DDP processes, LoRA,
# gradient checkpointing, an f32 head; with prefix sharing beside one row per completion), verl's
# fused forward (and its remove-padding row with prefix sharing), a local Ray cluster's workers.
# Installs the pinned trainers and what they need into TRAINER_VENV; a few minutes on two cores.
TRAINER_VENV ?= $(BUILD)/trainer-venv
trainer-test: lib
	@test -x $(TRAINER_VENV)/bin/python || python3 -m venv $(TRAINER_VENV)
	$(TRAINER_VENV)/bin/pip install -q -r python/trainers/requirements.txt
	$(TRAINER_VENV)/bin/pip install -q --no-deps -r python/trainers/requirements-nodeps.txt
	$(share_venv_files)
	RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) \
	  $(TRAINER_VENV)/bin/python -m pytest -q -c python/trainers/pytest.ini python/trainers \
	  --ignore=python/trainers/openrlhf_actor

# OpenRLHF's actor with rlk's fused head, beside its own (python/trainers/openrlhf_actor): its own
# venv, as OpenRLHF pins transformers 5.15.0 (the other trainers need < 5.11); flash_attn, which
# needs CUDA, is answered by an import stand-in for its padding helpers (standin/README.md).
OPENRLHF_VENV ?= $(BUILD)/openrlhf-venv
trainer-test-openrlhf: lib
	@test -x $(OPENRLHF_VENV)/bin/python || python3 -m venv $(OPENRLHF_VENV)
	$(OPENRLHF_VENV)/bin/pip install -q -r python/trainers/openrlhf_actor/requirements.txt
	$(OPENRLHF_VENV)/bin/pip install -q --no-deps -r python/trainers/openrlhf_actor/requirements-nodeps.txt
	$(share_venv_files)
	RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) \
	  $(OPENRLHF_VENV)/bin/python -m pytest -q -c python/trainers/openrlhf_actor/pytest.ini \
	  python/trainers/openrlhf_actor

# vLLM's sampling hook (rlk.integrations.vllm) on vLLM's own input batch, sampling metadata and
# logits processors, on the CPU (python/tests/test_vllm_sampler.py): vLLM installed with --no-deps
# into VLLM_VENV beside torch and what those modules import. The engine itself needs a GPU.
VLLM_VENV ?= $(BUILD)/vllm-venv
vllm-test: lib
	@test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -r python/tests/requirements-vllm.txt
	$(VLLM_VENV)/bin/pip install -q --no-deps -r python/tests/requirements-vllm-nodeps.txt
	$(share_venv_files)
	PYTHONPATH=python RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) \
	  $(VLLM_VENV)/bin/python -m pytest -q python/tests/test_vllm_sampler.py

# The Python tests again with torch (the conformance environment's): the torch CPU cases, the
# torch.library ops (opcheck, torch.compile with fullgraph=True) and the nn / sampling front-ends.
python-test-torch: lib conformance-venv
	PYTHONPATH=python RLK_LIBRARY=$(abspath $(BUILD)/lib/$(SONAME)) $(CONF_VENV)/bin/python -m pytest -q python/tests

# ---- the Python package ------------------------------------------------------------
# wheel: rlk-<version>-py3-none-manylinux_2_<glibc>_<arch>.whl, librlk.so.0 and every subpackage
# inside; sdist: the package and the C sources it builds librlk from. Both under $(DIST).
# package-test installs each into a fresh virtual environment away from the source tree and
# runs the examples against it (tools/build/package_test.sh).
DIST ?= $(BUILD)/dist
PKG_VENV := $(BUILD)/pkg-venv
wheel: lib
	rm -rf $(DIST)/rlk-*.whl python/build  # setuptools' staging keeps modules since removed
	python3 -m pip wheel -q --no-deps -w $(DIST) ./python

$(PKG_VENV)/bin/pyproject-build:
	python3 -m venv $(PKG_VENV)
	$(PKG_VENV)/bin/pip install -q build

sdist: $(PKG_VENV)/bin/pyproject-build
	rm -f $(DIST)/rlk-*.tar.gz
	$(PKG_VENV)/bin/pyproject-build -q --sdist --outdir $(DIST) python

package-test: wheel sdist conformance-venv
	tools/build/package_test.sh $(DIST) $(CONF_VENV)

# The GPU cases compile about 600 kernels; tests/gpu-kernels.conf lists their configurations
# (recorded with RLK_JIT_RECORD over a run of these cases), so they are compiled first with every
# CPU (GPU_ARCH: the device's target) into a read-only tree the suites read, then the suites run
# side by side. A configuration missing from the list is compiled when a case needs it.
GPU_ARCH ?= sm_90a
GPU_TEST_CACHE := $(BUILD)/test-gpu-cache
test-gpu: deps
	$(MAKE) -j$(TEST_JOBS) tests
	rm -rf $(GPU_TEST_CACHE)
	$(BUILD)/bin/rlk-precompile --targets $(GPU_ARCH) --config tests/gpu-kernels.conf --out $(GPU_TEST_CACHE)
	RLK_TEST_GPU=1 RLK_TEST_RO_CACHE=$(abspath $(GPU_TEST_CACHE)) RLK_TEST_BIN_DIR=$(abspath $(BUILD)/bin) \
	  tools/build/run_checks.sh $(TEST_BIN) $(TEST_JOBS)

sanitize:
	$(MAKE) BUILD=build-asan OPT=-O1 SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

# ---- fuzzing ---------------------------------------------------------------------
# The library under the sanitizers and libFuzzer's coverage, each tests/fuzz/fuzz_<name>.c linked
# with it into build-fuzz/fuzz/fuzz_<name>. tests/fuzz/run.sh replays each target over its kept
# inputs (tests/fuzz/corpus/<name>, tests/fuzz/crashes/<name>), then fuzzes it for FUZZ_SECONDS;
# any crash, sanitizer report, leak or hang fails. fuzz-corpus adds the inputs of a run that
# reach new code to the kept corpus.
FUZZ_BUILD := build-fuzz
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_BINS := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz/fuzz_%)
# The descriptor target's kernels live in a cache named after the compiler wrapper that built them.
FUZZ_KERNEL_CC_ID := $(shell cksum < tests/fuzz/kernel-cc | cut -d' ' -f1)

fuzz:
	@FUZZ_CC=$(FUZZ_CC) tools/build/deps.sh fuzz
	$(MAKE) fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT=-O1 \
	  SANITIZE="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" $(FUZZ_BUILD)/lib/librlk.a
	$(MAKE) $(FUZZ_BINS)

$(FUZZ_BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h tests/fuzz/kernel-cc $(wildcard tools/*.h) \
                           $(FUZZ_BUILD)/lib/librlk.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) -Itools -std=c11 -O1 -g $(WARN) $(FUZZ_SAN) -fsanitize=fuzzer \
	  -DRLK_FUZZ_KERNEL_CC='"$(abspath tests/fuzz/kernel-cc)"' \
	  -DRLK_FUZZ_CACHE_DIR='"$(abspath $(FUZZ_BUILD)/cache)/$(FUZZ_KERNEL_CC_ID)"' \
	  -o $@ $< $(FUZZ_BUILD)/lib/librlk.a -pthread $(LDLIBS)

fuzz-corpus:
	$(MAKE) fuzz-build
	for t in $(FUZZ_TARGETS); do mkdir -p tests/fuzz/corpus/$$t $(FUZZ_BUILD)/corpus/$$t && \
	  $(FUZZ_BUILD)/fuzz/fuzz_$$t -merge=1 tests/fuzz/corpus/$$t $(FUZZ_BUILD)/corpus/$$t || exit 1; done

bench: tools
	$(BUILD)/bin/rlk-bench --json $(BUILD)/bench.json

PRECOMPILE_TARGETS ?= sm_80 sm_90a
precompile: tools
	$(BUILD)/bin/rlk-precompile --out cache/precompiled --targets "$(PRECOMPILE_TARGETS)" --config tools/precompile.conf

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0644 include/rlk.h $(DESTDIR)$(PREFIX)/include/rlk.h
	install -m 0755 $(SHLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf librlk.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/librlk.so
	install -m 0644 $(STLIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' tools/build/rlk.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/rlk.pc

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

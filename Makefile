# onnxtrain: the commands a person and CI use. Everything goes through the project's own scripts.
PYTHON     ?= /usr/bin/python3
BUILD_DIR  ?= build
JOBS       ?= $(shell nproc)
export PYTHONPATH := $(CURDIR)/$(BUILD_DIR)/python:$(PYTHONPATH)

.PHONY: web web-demo test-web bench-web minimal-baseline setup deps build test kill-test fuzz fuzz-build fuzz-smoke test-cuda-build test-torch2-lane test-hf-lanes test-cpp test-python conformance demo demo-inference bench sanitize sanitize-python clean minimal demo-minimal cross-aarch64

setup: deps build

deps:
	./scripts/install_deps.sh

# ccache (installed by scripts/install_deps.sh) makes rebuilds and other checkouts of the tree cheap;
# base_dir lets checkouts in different directories share its entries.
CCACHE     := $(shell command -v ccache 2>/dev/null)
export CCACHE_BASEDIR ?= $(abspath $(CURDIR)/..)
LAUNCHER   := $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DPython3_EXECUTABLE=$(PYTHON) $(LAUNCHER)

build: $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The whole suite: C++ unit tests (full and minimal build), Python tests, then the ONNX node
# conformance run. The minimal build's digits tests run when `make demo` has written the artifacts. The Python
# tests install the peers they compare against (scripts/setup_peers.sh: ONNX Runtime 1.31, ONNX Runtime
# training 1.19.2 and PyTorch 2.x in venvs under ~/.cache/onnxtrain/peers) and the real-model corpus.
test: setup minimal
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory fuzz-smoke
	cd $(MINIMAL_DIR) && ctest --output-on-failure -j $(JOBS)
	ONNXTRAIN_TORCH_LANE=debian $(PYTHON) -m pytest -q tests/python --ignore-glob='*/test_hf_*.py'
	$(MAKE) --no-print-directory test-torch2-lane
	$(MAKE) --no-print-directory test-hf-lanes
	$(MAKE) --no-print-directory test-cuda-build
	$(PYTHON) tests/conformance/run_node_tests.py
	$(MAKE) --no-print-directory test-web

# TrainModule's (and ORTTrainer's) second lane: their tests again under PyTorch 2.x from PyPI, in the torch2 peer's venv
# (scripts/setup_peers.sh torch2; same Python 3.11, so the extension loads there). The first lane is
# the Debian torch 1.13 run above; test_train_module_torch_versions.py fails a lane on the wrong torch.
TRAIN_MODULE_TESTS := $(addprefix tests/python/,test_train_module.py test_train_module_distributed.py \
  test_train_module_mem_grad.py test_train_module_torch_versions.py test_torch_checkpoint.py \
  test_mixed_precision_torch.py test_compute_optimizer.py test_memory_optimizer.py test_sparsity.py \
  test_orttrainer.py)
test-torch2-lane: build
	./scripts/setup_peers.sh torch2
	py=$$($(PYTHON) -c 'import sys; sys.path.insert(0, "bench"); import peers; print(peers.python("torch2"))') && \
	  ONNXTRAIN_TORCH_LANE=torch2 "$$py" -m pytest -q $(TRAIN_MODULE_TESTS)

# The Hugging Face tests (tests/python/test_hf_*.py: transformers models, Trainer, PEFT) in both torch
# lanes: transformers 4.47 on Debian's torch 1.13 (the hf113 peer) and transformers 5 on PyTorch 2.x
# (the torch2 peer). Debian's own Python has no transformers, so the first lane runs them in hf113.
# One process per file: torch 1.13's TorchScript exporter keeps state between exports that makes
# test_hf_peft.py's exports fail after the model tests' in one process ("Unable to cast from
# non-held to held instance" in _jit_pass_onnx_lint; each file passes alone).
HF_TESTS := $(wildcard tests/python/test_hf_*.py)
test-hf-lanes: build
ifneq ($(HF_TESTS),)
	./scripts/setup_peers.sh hf113 torch2
	for peer in hf113 torch2; do \
	  lane=$$([ $$peer = torch2 ] && echo torch2 || echo debian); \
	  py=$$($(PYTHON) -c 'import sys; sys.path.insert(0, "bench"); import peers; print(peers.python(sys.argv[1]))' $$peer) && \
	  for f in $(HF_TESTS); do ONNXTRAIN_TORCH_LANE=$$lane "$$py" -m pytest -q $$f || exit 1; done; \
	done
endif

# Crash consistency (tests/crash/kill_test.py): KILLS SIGKILLs per front end (Python API, C++ API,
# `onnxtrain train`) at random instants, each followed by checks of the checkpoint, the exported
# model and the training log, and by a resume that must end equal to an uninterrupted run. `make
# test` runs 15 per front end (tests/python/test_kill_checkpoints.py).
KILLS ?= 200
kill-test: build
	$(PYTHON) tests/crash/kill_test.py --kills $(KILLS)

# The CUDA backend built beside the CPU build (-DONNXTRAIN_CUDA=ON into build-cuda/), when the CUDA
# toolkit is installed: only the files with CUDA kernels compile anew, the rest are ccache hits of
# the CPU build's. No GPU here: the GPU tests skip, naming the reason, and the device tests check
# what a CUDA build says without one. scripts/gpu_check.sh runs the GPU tests on a lent GPU.
CUDA_DIR   ?= build-cuda
NVCC       ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
test-cuda-build: build
ifneq ($(NVCC),)
	cmake -S . -B $(CUDA_DIR) -G Ninja -DONNXTRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) -DONNXTRAIN_BUILD_PYTHON=OFF \
	  -DONNXTRAIN_BUILD_EXAMPLES=OFF $(LAUNCHER) $(if $(CCACHE),-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
	cmake --build $(CUDA_DIR) -j $(JOBS) --target onnxtrain_cuda_tests onnxtrain_tests cuda_kernels_bench
	$(CUDA_DIR)/onnxtrain_cuda_tests
	$(CUDA_DIR)/onnxtrain_tests --gtest_filter='Device.*:HostDeviceTest.*:DeviceModuleTest.*'
else
	@echo "test-cuda-build: skipped: no nvcc (the CUDA toolkit is not installed)"
endif

test-cpp: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

test-python: build
	$(PYTHON) -m pytest -q tests/python

conformance: build
	$(PYTHON) tests/conformance/run_node_tests.py

# Trains a small CNN on sklearn's digits with the on-device training API; exits non-zero below 97%.
# Trains a CNN on sklearn's digits from Python, then trains the same artifacts again from C++
# (examples/cpp/train_digits.cc, no Python involved).
demo: setup
	$(PYTHON) examples/demo.py
	$(BUILD_DIR)/examples/train_digits examples/out/digits_artifacts examples/out/digits.npz examples/out/cpp 0.97

# The minimal training runtime (cmake/minimal.cmake): no protobuf, ONNX library, oneDNN or zlib.
# ONNXTRAIN_OPS="Conv;Relu;..." or ONNXTRAIN_OPS_FILE=ART_DIR/ops.txt keep only those ops' kernels.
MINIMAL_DIR ?= build-minimal
ONNXTRAIN_OPS ?=
ONNXTRAIN_OPS_FILE ?=
minimal:
	cmake -S . -B $(MINIMAL_DIR) -G Ninja -DONNXTRAIN_MINIMAL=ON $(LAUNCHER) \
	  -DONNXTRAIN_OPS="$(ONNXTRAIN_OPS)" -DONNXTRAIN_OPS_FILE="$(ONNXTRAIN_OPS_FILE)"
	cmake --build $(MINIMAL_DIR) -j $(JOBS)

# The minimal runtime for the compiler's baseline ISA (x86-64: SSE2, no -march=native): the same
# 4-lane vectors and GEMM tiles as WebAssembly's SIMD128, which the web tests and benchmark compare with.
MINIMAL_BASELINE_DIR ?= build-minimal-baseline
minimal-baseline:
	cmake -S . -B $(MINIMAL_BASELINE_DIR) -G Ninja -DONNXTRAIN_MINIMAL=ON -DONNXTRAIN_MARCH= $(LAUNCHER) \
	  -DONNXTRAIN_BUILD_TESTS=OFF -DONNXTRAIN_OPS_FILE="$(abspath $(WEB_OPS_FILE))"
	cmake --build $(MINIMAL_BASELINE_DIR) -j $(JOBS) --target web_native_steps startup

# The minimal runtime cross-compiled for aarch64 (g++-aarch64-linux-gnu), its tests run under
# qemu-aarch64 (qemu-user); the digits demo's artifacts trained there from C when present.
CROSS_DIR ?= build-aarch64
cross-aarch64: deps
	cmake -S . -B $(CROSS_DIR) -G Ninja -DONNXTRAIN_MINIMAL=ON $(LAUNCHER) \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
	  -DONNXTRAIN_OPS="$(ONNXTRAIN_OPS)" -DONNXTRAIN_OPS_FILE="$(ONNXTRAIN_OPS_FILE)"
	cmake --build $(CROSS_DIR) -j $(JOBS)
	cd $(CROSS_DIR) && ctest --output-on-failure -j $(JOBS)

# The WebAssembly module (cmake/web.cmake, web/): the minimal runtime built by Debian's emscripten,
# single-threaded and (WEB_THREADED=ON, the default) threaded, for the op set of WEB_OPS_FILE (default: the digits CNN's) and/or
# WEB_OPS. Configured once (again when WEB_THREADED differs from the cache's); ninja then rebuilds only what
# changed, through ccache. NODE_PATH: the Debian modules (acorn) emscripten's JS optimizer needs, which this
# Node does not search itself.
WEB_DIR      ?= build-web
WEB_OPS_FILE ?= web/ops/digits.txt
WEB_OPS      ?=
WEB_THREADED ?= ON
WEB_ENV      := NODE_PATH=/usr/share/nodejs
web: $(WEB_DIR)/build.ninja
	@grep -q '^ONNXTRAIN_WEB_THREADED:BOOL=$(WEB_THREADED)$$' $(WEB_DIR)/CMakeCache.txt || \
	  $(WEB_ENV) cmake $(WEB_DIR) -DONNXTRAIN_WEB_THREADED=$(WEB_THREADED)
	$(WEB_ENV) cmake --build $(WEB_DIR) -j $(JOBS)
$(WEB_DIR)/build.ninja:
	$(WEB_ENV) emcmake cmake -S . -B $(WEB_DIR) -G Ninja -DONNXTRAIN_MINIMAL=ON $(LAUNCHER) \
	  -DONNXTRAIN_OPS="$(WEB_OPS)" -DONNXTRAIN_OPS_FILE="$(abspath $(WEB_OPS_FILE))" -DONNXTRAIN_WEB_THREADED=$(WEB_THREADED)

# The WebAssembly module's tests: tsc checks the declarations (web/onnxtrain.d.mts) on an ORT Web
# training loop; Node runs web/tests/*.test.mjs (the API, bad input, 50 digits steps
# against the baseline-ISA native build), all again on the threaded module with 2 threads (the
# digits steps against the native build on 2), then headless chromium trains on the demo page with
# 2 threads (web/tests/test_demo_browser.py).
WEB_FIXTURES ?= $(WEB_DIR)/fixtures
test-web: web minimal-baseline build
	$(PYTHON) web/tests/make_fixtures.py $(WEB_FIXTURES) --ort
	tsc --noEmit --strict --target es2020 --module node16 --moduleResolution node16 web/tests/types_check.mts
	ONNXTRAIN_WEB_DIR=$(WEB_DIR) ONNXTRAIN_WEB_FIXTURES=$(WEB_FIXTURES) node --test web/tests/*.test.mjs
	ONNXTRAIN_WEB_DIR=$(WEB_DIR) ONNXTRAIN_WEB_FIXTURES=$(WEB_FIXTURES) ONNXTRAIN_WEB_THREADS=2 node --test web/tests/*.test.mjs
	ONNXTRAIN_WEB_DIR=$(WEB_DIR) ONNXTRAIN_WEB_FIXTURES=$(WEB_FIXTURES) $(PYTHON) -m pytest -q web/tests/test_demo_browser.py

# The demo page on http://localhost:8000/ (web/demo/): trains the digits CNN in the browser.
web-demo: web build
	$(PYTHON) web/tests/make_fixtures.py $(WEB_FIXTURES)
	$(PYTHON) web/demo/serve.py --web-build $(WEB_DIR) --fixtures $(WEB_FIXTURES)

# .wasm sizes and Node train steps against the native minimal builds (bench/bench_web.mjs), for the
# digits and the BERT-style op sets.
WEB_BERT_OPS := $(WEB_FIXTURES)/bert_artifacts/ops.txt
bench-web: web minimal minimal-baseline build
	$(PYTHON) web/tests/make_fixtures.py $(WEB_FIXTURES) --bert
	$(MAKE) --no-print-directory web WEB_DIR=build-web-bert WEB_OPS_FILE=$(WEB_BERT_OPS)
	$(MAKE) --no-print-directory minimal-baseline MINIMAL_BASELINE_DIR=build-minimal-baseline-bert WEB_OPS_FILE=$(WEB_BERT_OPS)
	node bench/bench_web.mjs

# The digits demo's artifacts trained from C++ and C on the full build and on the minimal runtime.
demo-minimal: setup minimal
	$(PYTHON) examples/demo.py
	./scripts/check_minimal_digits.sh $(BUILD_DIR) $(MINIMAL_DIR) 0.97

# Runs exported PyTorch models (MLP, CNN, BERT) through InferenceSession and checks them.
demo-inference: setup
	$(PYTHON) examples/inference_demo.py

bench: setup
	./scripts/setup_peers.sh
	$(PYTHON) bench/bench_inference.py
	OMP_WAIT_POLICY=passive $(PYTHON) bench/bench_transcendentals.py
	$(PYTHON) bench/bench_cnn.py
	$(PYTHON) bench/bench_small_models.py
	$(PYTHON) bench/cnn_train_breakdown.py
	$(PYTHON) bench/bench_training.py
	OMP_WAIT_POLICY=passive $(PYTHON) bench/bench_vs_ort_training.py
	$(PYTHON) bench/bench_train_module.py
	$(PYTHON) bench/bench_distributed.py
	$(PYTHON) bench/bench_mixed_precision.py
	$(PYTHON) bench/bench_lora.py
	$(PYTHON) bench/bench_memory.py
	$(PYTHON) bench/bench_sparsity.py
	$(PYTHON) bench/bench_compute_optimizer.py
	$(PYTHON) bench/bench_checkpoint.py
	$(BUILD_DIR)/bench/gemm_backends
	OMP_NUM_THREADS=1 $(BUILD_DIR)/bench/small_kernels
	$(PYTHON) bench/bench_minimal.py
	$(MAKE) --no-print-directory bench-web

# libFuzzer targets (tests/fuzz, docs/ROBUSTNESS.md "Fuzzing"): clang-14 with ASan + UBSan in
# $(FUZZ_DIR); each target runs FUZZ_SECONDS on its corpus under ~/.cache/onnxtrain/fuzz/<target>
# (seeded by tests/fuzz/make_seeds.py from files the tests make). A crash is minimized into
# tests/fuzz/regressions/<target>/, which the normal build's ctest replays, and fails the run.
# FUZZ_TARGETS picks targets. fuzz-smoke (part of `make test`): a few seconds each on 20 seeds.
FUZZ_DIR     ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
# Line tables name sources relative to the checkout (-fdebug-prefix-map), so ccache may leave the
# build directory out of its hash (CCACHE_NOHASHDIR) and other checkouts reuse the objects.
fuzz-build: export CCACHE_NOHASHDIR := 1
fuzz-build: deps
	cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_C_COMPILER=clang-14 \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DONNXTRAIN_FUZZ=ON -DONNXTRAIN_BUILD_PYTHON=OFF \
	  -DONNXTRAIN_BUILD_TESTS=OFF -DONNXTRAIN_BUILD_EXAMPLES=OFF -DONNXTRAIN_WITH_MPI=OFF $(LAUNCHER)
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_targets

fuzz: fuzz-build build
	$(PYTHON) tests/fuzz/make_seeds.py $(BUILD_DIR)
	./tests/fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-smoke: fuzz-build build
	$(PYTHON) tests/fuzz/make_seeds.py $(BUILD_DIR)
	FUZZ_SMOKE=1 ./tests/fuzz/run.sh $(FUZZ_DIR) 3 $(FUZZ_TARGETS)

# AddressSanitizer/UBSan build of the library and C++ tests.
sanitize: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DONNXTRAIN_SANITIZE=ON -DONNXTRAIN_BUILD_PYTHON=OFF $(LAUNCHER)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

# The Python tests under AddressSanitizer and UBSan, for the kernels only Python tests reach: an
# ASan build of the library and extension (optimised), loaded into /usr/bin/python3 with the
# sanitizer runtimes preloaded; the first error stops the run. PYTEST_ARGS picks the tests.
ASAN_PYTHON_DIR ?= build-asan-python
PYTEST_ARGS ?= tests/python
sanitize-python: deps
	cmake -S . -B $(ASAN_PYTHON_DIR) -G Ninja -DPython3_EXECUTABLE=$(PYTHON) -DONNXTRAIN_SANITIZE=ON $(LAUNCHER)
	cmake --build $(ASAN_PYTHON_DIR) -j $(JOBS)
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  PYTHONPATH=$(ASAN_PYTHON_DIR)/python $(PYTHON) -m pytest -q -x $(PYTEST_ARGS)

clean:
	rm -rf $(BUILD_DIR) build-asan $(ASAN_PYTHON_DIR) $(MINIMAL_DIR) $(CROSS_DIR) $(WEB_DIR) $(MINIMAL_BASELINE_DIR) $(FUZZ_DIR) $(CUDA_DIR)

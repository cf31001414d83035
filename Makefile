# The README's two commands: `make demo` and `make test`. Both install what they need first.
BUILD_DIR ?= build
JOBS ?= 2
# Test suites run side by side, as many as there are cores by default: the suite is CPU-bound at
# about 1.8 cores of 2 (started processes load LibTorch, Python imports torch), 1136 s against 1879
# one at a time (2026-12-02, AMD EPYC, 2 cores).
TEST_JOBS ?= $(shell nproc)

# The LibTorch to build against: the torch wheel in the project's venv (scripts/bootstrap installs
# it), or any LibTorch 2.11+ named here: `make test LIBTORCH=/opt/libtorch` (an unzipped pytorch.org
# libtorch/, or another wheel's torch.utils.cmake_prefix_path).
VENV ?= .venv
LIBTORCH ?= $(shell $(VENV)/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)

FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= idx state_dict checkpoint tfevents_round_trip tfevents_reader zip_checksum http_request model_config \
                tokenizer_json run_log bench_matrix transform_spec csv accelerate_config deepspeed_config

.PHONY: build configure demo test fuzz clean

configure:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(LIBTORCH)" -DLOCKSTEP_PYTHON="$(abspath $(VENV))/bin/python"

# Everything: the library, the CLI, the examples and the test suite.
build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The demo needs only the library and the `lockstep` binary, not the ~70 test sources.
demo:
	scripts/bootstrap
	$(MAKE) configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target lockstep_cli
	scripts/demo $(BUILD_DIR)

test:
	scripts/bootstrap --test
	$(MAKE) build
	rm -rf $(BUILD_DIR)/test-results
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error --parallel $(TEST_JOBS) --output-junit ctest-junit.xml
	scripts/check-skips $(BUILD_DIR)/test-results

# libFuzzer targets (docs/fuzzing.md): a clang-14 build of their own with ASan and UBSan, then each
# target for FUZZ_SECONDS, one after another.
fuzz:
	scripts/bootstrap --fuzz
	cmake -S . -B $(FUZZ_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DLOCKSTEP_FUZZ=ON \
	      -DCMAKE_PREFIX_PATH="$(LIBTORCH)"
	cmake --build $(FUZZ_BUILD_DIR) -j$(JOBS)
	fuzz/run $(FUZZ_BUILD_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD_DIR)

# The README's two commands: `make demo` and `make test`. Both install what they need first.
BUILD_DIR ?= build
JOBS ?= 2

.PHONY: build demo test clean

build:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD_DIR) -j$(JOBS)

demo:
	scripts/bootstrap
	$(MAKE) build
	scripts/demo $(BUILD_DIR)

test:
	scripts/bootstrap --test
	$(MAKE) build
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error

clean:
	rm -rf $(BUILD_DIR)

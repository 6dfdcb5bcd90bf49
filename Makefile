# A thin driver for CMake. `make run` builds and runs the chapter's experiment;
# `make test` builds and runs every test; `make exercises` grades the exercises in
# exercises/ (ONLY=3 grades one). Other targets: build, install, bench, clean.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local

.PHONY: all build run test exercises install bench clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/inspect_self_attention

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Builds the library and the learner's exercise files only (not the tools or tests),
# then grades them; the grader's exit status is make's.
exercises: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --target grade_exercises -j $(JOBS)
	./$(BUILD)/exercises/grade_exercises $(ONLY)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	./$(BUILD)/attn bench

clean:
	rm -rf $(BUILD)

# A thin driver for CMake. `make run` builds and runs the chapter's experiment and
# `make run-modern` chapter 21's; `make test` builds and runs every test; `make
# exercises` grades the exercises in exercises/ (ONLY=3 grades one). Other
# targets: build, install, bench, clean.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local

.PHONY: all build run run-modern learn test exercises install bench clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/inspect_self_attention

# Chapter 21's experiment (docs/modern-attention.md): RoPE, grouped-query attention,
# a sliding window and decoding through the KV cache, with its step-by-step trace.
run-modern: build
	./$(BUILD)/inspect_modern_attention --trace

# A Debug build of its own (no optimisation, full debug information), so that gdb
# steps through src/attention/sdpa_ref.c line by line; the experiment runs the
# reference kernels by default, and --trace says so.
DEBUG_BUILD ?= build-debug
learn:
	cmake -S . -B $(DEBUG_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O0 -g" $(CMAKE_FLAGS)
	cmake --build $(DEBUG_BUILD) -j $(JOBS) --target inspect_self_attention
	./$(DEBUG_BUILD)/inspect_self_attention --impl ref --trace

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

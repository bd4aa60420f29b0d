# veriloco: every target installs what it needs (idempotent, stamp files), then runs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test test-fast devnet bench headline install node clean chromium

$(BIN)/.installed: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the project's range must not pull a CUDA build.
	$(BIN)/pip install -q $(TORCH) numpy
	$(BIN)/pip install -q -e '.[test,bench,dev]'
	touch $@

# `npm install` against the committed lockfile installs exactly the locked versions. Not `npm ci`:
# js-ipfs has an optional dependency on a git tarball (electron-eval -> headless) that no registry
# serves; npm install skips it as optional, npm ci refuses the whole lockfile because of it.
node_modules/.installed: package.json package-lock.json
	npm install --no-audit --no-fund
	touch $@

# Debian's chromium, for the dashboard's screenshot test (tests/e2e/test_dashboard.py skips, saying so,
# where there is none): installed non-interactively as root or with password-less sudo, else a note.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ S=$$([ "$$(id -u)" = 0 ] && echo "" || echo "sudo -n"); \
	  { $$S apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -qq chromium; } >/dev/null 2>&1 || \
	  echo "note: could not install chromium (apt-get as root needed); the dashboard screenshot test will skip" >&2; }

install: $(BIN)/.installed node_modules/.installed

node: node_modules/.installed

# The demo's defaults (py-evm devnet + LocalStore) need no npm packages.
demo: $(BIN)/.installed
	$(BIN)/veriloco demo --report .veriloco/demo/report $(DEMO_ARGS)

test: install chromium
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the suite is missing" >&2; exit 1; fi; \
	exit $$rc

# The inner loop: the pure and unit tests alone (tests/unit, about 4 minutes on 2 cores; no npm tooling).
# `make test` runs everything, as CI does.
test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest tests/unit -q $(PYTEST_ARGS)

devnet: install
	$(BIN)/veriloco devnet $(DEVNET_ARGS)

bench: install
	$(BIN)/python benchmarks/convergence.py --preset tiny --seeds 0,1,2 --eval-rows 512 --methods allreduce,diloco,dilocox --outer-lr 0.7 --outer-momentum 0.5 --sweep-outer 1.0:0.0,1.0:0.3,1.2:0.0 --out benchmarks/results/convergence-tiny.json

# One headline results file from scratch: its convergence runs (resumable, one per method and seed),
# then their merge (benchmarks/headline.py). HEADLINE_ARGS: --dry-run, --jobs 2, --only 0, --piece 3.
# H=operating-point: examples/small.toml as a network and as the engine, one run each (about 2 hours
# here; benchmarks/operating_point.py, HEADLINE_ARGS: --trainers, --windows-s, --epochs)
headline: $(BIN)/.installed
	@test -n "$(H)" || { echo "usage: make headline H=convergence-small|operating-point [HEADLINE_ARGS='--dry-run']" >&2; exit 2; }
	@if [ "$(H)" = operating-point ]; then \
		$(BIN)/python benchmarks/operating_point.py --out benchmarks/results/operating-point.json \
			--md docs/results-operating-point.md $(HEADLINE_ARGS); \
	else $(BIN)/python benchmarks/headline.py $(H) $(HEADLINE_ARGS); fi

clean:
	rm -rf $(VENV) node_modules .pytest_cache .hypothesis

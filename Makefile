# htmqc — run `make help` for the list of targets.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.htmqc-setup-stamp
export PYTHONPATH := $(CURDIR):$(CURDIR)/src
export HTMQC_CONTRACTS ?= 1

CORE := src/htmqc/core
LINTED := $(wildcard src tests model_checks proofs spec benchmarks examples)
# pip warns about every local index folder this machine's pip.conf names; keep the rest.
QUIET_PIP := { grep -v "^WARNING: Location 'file://" || true; }
CROSSHAIR_TIMEOUT ?= 4

.PHONY: help setup test test-fast lint typecheck pytest pytest-parallel pytest-serial verify-beside crosshair proofs tlc graph-replay spec-check conformance conformance-ts formal-tests verify verify-long mutate mutate-catalogue mutants test-kafka profile bench bench-peers bench-payments bench-spark chaos-long demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q -e '.[dev]' 2>&1 | $(QUIET_PIP)
	touch $(STAMP)

# Debian packages, PostgreSQL and Redis on loopback, Apache Kafka's jars: tools/provision.py
# (idempotent; a second run only probes). Tests never install or start any of these.
setup: ## install what is missing (venv, Debian packages, Kafka and Pulsar jars, Apicurio Registry) and start the services
	$(PYTHON) tools/provision.py
	@$(MAKE) --no-print-directory $(STAMP)
	@# matplotlib builds its font cache on first use by running fc-list (there once
	@# fontconfig is installed): here, not inside a fast-tier chart test, which starts no process
	@$(PY) -c "import matplotlib.font_manager"

lint: setup ## ruff over the whole tree
	$(VENV)/bin/ruff check $(LINTED)

typecheck: setup ## mypy --strict over the core, the runtime and the sinks
	$(VENV)/bin/mypy --strict $(CORE) src/htmqc/runtime src/htmqc/sinks

# Four pytest processes share the tests a file at a time (most broker tests wait on
# brokers, JVMs and subprocesses, so four fit on two cores); the `serial` ones, whose
# deadlines or races another process's load could decide, run alone afterwards.
# A worker that dies (the OOM killer once took one at 17.8 GB) is not replaced: the
# run ends naming the test it was running, where a replacement once left xdist's
# file scheduler waiting for good.
XDIST := -n 4 --dist loadfile --max-worker-restart 0

pytest: setup ## the pytest suite, less the formal checks (those run in `verify`)
	@$(MAKE) --no-print-directory pytest-parallel
	@$(MAKE) --no-print-directory pytest-serial

pytest-parallel: setup ## the tests that share four processes (what `make test` runs beside the proof gate)
	$(PY) -m pytest -q $(XDIST) -m "not formal and not serial" --durations=25

pytest-serial: setup ## the `serial` tests, alone (exit deadlines, races another process could decide)
	$(PY) -m pytest -q -m "serial and not formal" --durations=10

# The fast tier starts no process at all: tests/conftest.py fails a test not marked
# `slow` that starts one (a subprocess, a browser, a fork).
test-fast: setup ## the fast tier for your own loop: no broker, no subprocess, no browser, no Spark, no formal checks (~2.5 min)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not formal" --durations=25

test-kafka: setup ## every broker test on Apache Kafka too (the long tier), Kafka instances only
	$(PY) -m pytest -q -m "kafka and not formal" --kafka-full

crosshair: setup ## CrossHair checks every icontract contract of the core
	$(PY) -m model_checks.crosshair_gate --per-condition-timeout $(CROSSHAIR_TIMEOUT)

proofs: setup ## Z3: every core transition keeps the invariant; mutants are refuted
	$(PY) -m proofs

spec-check: setup ## the generated diagram, table and conformance vectors are current
	$(PY) -m spec.diagram --check
	$(PY) -m spec.conformance.generate --check

graph-replay: setup ## the core replayed through every edge of the small TLA+ models' state graphs (TLC dumps cached in build/graphs)
	$(PY) -m model_checks.graph_replay --config small

conformance: setup ## replay every conformance vector through the core (one line per vector)
	$(PY) -m spec.conformance.replay

# The TypeScript port (written from spec/ and tla/ alone) must answer every vector as the
# core does: a difference between the two implementations is a spec bug.
conformance-ts: ## replay every conformance vector through the TypeScript port (ports/typescript)
	cd ports/typescript && npm ci --silent --no-audit --no-fund \
	  && node node_modules/typescript/bin/tsc -p . && node dist/replay.js ../../spec/conformance/vectors | tail -n 1

tlc: setup ## TLC: the TLA+ models of tla/manifest.json (size small), expected failures included
	$(PY) -m model_checks.tlc_cli --config small

# The small TLC gate already ran in `tlc`; its pytest twin is for `pytest -m formal` alone.
formal-tests: setup ## pytest's formal tests (Hypothesis stateful vs reference model, gates)
	$(PY) -m pytest -q -m formal \
	  --deselect tests/formal/test_tlc.py::test_small_gate_passes_with_expected_failures \
	  --deselect tests/formal/test_graph_replay.py::test_core_refines_every_edge_of_the_small_models \
	  --deselect tests/proofs/test_differential.py::test_the_code_agrees_with_the_model

# `make test` runs the proof gate beside the parallel tests, at low CPU priority (nice
# 10): those tests leave 14-23 % of the two CPUs idle (waiting on brokers, JVMs,
# timeouts; `vmstat 5` over a run: 23 % in its first 11 minutes, 14 % overall), which
# the gate takes; the parallel tests took 1135-1194 s with it beside them, 1085-1274 s
# without, in two runs each. Each prints whole when it ends; the serial tests run alone
# after both, as in `make pytest`. CrossHair's budgets are CPU time, so the gate
# explores as much as when run alone.
test: lint typecheck ## everything CI runs: lint, types, proof gate, tests
	@$(MAKE) --no-print-directory -j2 --output-sync=target verify-beside pytest-parallel
	@$(MAKE) --no-print-directory pytest-serial

verify-beside: setup
	MAKEFLAGS= nice -n 10 $(MAKE) --no-print-directory verify

# The proof gate's parts are independent: run two at a time (this box has two cores),
# the longest first, each part's output printed whole when it ends. Measured here:
# 10m15s one after another, 5m53s two at a time (6m41s with the graph cache cold).
VERIFY_PARTS := formal-tests crosshair proofs tlc graph-replay spec-check conformance conformance-ts

verify: setup ## the proof gate: CrossHair, Z3, TLC, model comparison (two parts at a time)
	$(MAKE) --no-print-directory -j2 --output-sync=target $(VERIFY_PARTS)

verify-long: setup ## longer formal runs: TLC medium models, thorough Hypothesis profile
	$(PY) -m model_checks.tlc_cli --config medium
	$(PY) -m proofs.differential --top 3
	$(MAKE) mutate mutate-catalogue
	HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -q -m formal

mutate: setup ## mutants of src/htmqc/core vs the fast checks, resuming spec/mutation-results.jsonl; fails on an unexplained survivor
	$(PY) -m model_checks.mutation run --workers 2 --resume

mutate-catalogue: setup ## named exactly-once bugs, each verification layer run separately, resuming spec/catalogue-results.jsonl
	$(PY) -m model_checks.mutation catalogue --workers 2 --resume

mutants: setup ## how many Hypothesis seeds catch each named core mutant (tests/core/mutants/table.py)
	$(PY) -m tests.core.mutants.measure
	$(PY) -m tests.core.mutants.measure --contracts 0

profile: setup ## py-spy profile of the at-least-once engine (no broker): time by part and line
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.profile_engine

bench: setup ## all benchmarks, the peers last, on Tansu and on Kafka (about 2 h); results go to benchmarks/results/
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.core_bench --contracts off
	HTMQC_CONTRACTS=1 $(PY) -m benchmarks.core_bench --contracts on
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.engine_bench
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.runtime_bench
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.runtime_bench --broker kafka
	$(MAKE) bench-payments
	PYSPARK_PYTHON=$(abspath $(PY)) SPARK_LOCAL_IP=127.0.0.1 $(PY) -m benchmarks.audit_bench --rows 10000000
	$(MAKE) bench-spark
	$(MAKE) bench-peers
	$(MAKE) bench-peers PEERS_ARGS="--broker kafka"

bench-payments: setup ## the payments workload into PostgreSQL on Kafka: a hand-written loop vs htmqc per-message vs batch
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.payments_bench --broker kafka

bench-spark: setup ## Spark's kafka source vs htmqc-kafka vs a plain confluent-kafka loop, into noop and the exactly-once sinks (one run)
	PYSPARK_PYTHON=$(abspath $(PY)) SPARK_LOCAL_IP=127.0.0.1 $(PY) -m benchmarks.spark_sources

# The peers pin their own librdkafka (quixstreams wants confluent-kafka < 2.13), so they
# get a venv of their own; htmqc and the raw loop run in it too, for a fair comparison.
PEERS_VENV := .venv-peers
$(PEERS_VENV)/.stamp: pyproject.toml
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q -e . quixstreams==3.28.1 aiokafka \
	  faust-streaming matplotlib 2>&1 | $(QUIET_PIP)
	touch $@

chaos-long: setup ## fault-injected runs: 1M msgs/8 partitions/3 consumers/24 faults, then 10M; the same on a 3-node Kafka cluster with broker faults
	$(PY) -m htmqc chaos --seed 1 --messages 1000000 --partitions 8 --consumers 3 --faults 24 \
		--produce-seconds 240 --timeout 1500 --report benchmarks/results/chaos-long.json \
		--trace-dir $${TMPDIR:-/tmp}/htmqc-chaos-long-traces
	$(PY) -m htmqc chaos --seed 2 --messages 10000000 --partitions 8 --consumers 3 --faults 30 \
		--produce-seconds 600 --timeout 3600 --report benchmarks/results/chaos-10m.json
	$(PY) -m htmqc chaos --broker kafka-cluster --sink postgresql,kafka --seed 1 --messages 1000000 \
		--partitions 8 --consumers 3 --faults 24 --produce-seconds 240 --timeout 2700 \
		--report benchmarks/results/chaos-kafka-cluster-1m.json \
		--trace-dir $${TMPDIR:-/tmp}/htmqc-chaos-cluster-traces
	$(PY) -m htmqc chaos --broker kafka-cluster --sink postgresql,kafka --seed 2 --messages 10000000 \
		--partitions 8 --consumers 3 --faults 30 --produce-seconds 2400 --timeout 9000 \
		--report benchmarks/results/chaos-kafka-cluster-10m.json

bench-peers: $(PEERS_VENV)/.stamp ## htmqc against raw confluent-kafka, aiokafka, Quix, faust
	HTMQC_CONTRACTS=0 $(PEERS_VENV)/bin/python -m benchmarks.peers --timeout 600 $(PEERS_ARGS)
# Full run by default (1M messages, 100 B and 1 KiB, 3 interleaved repeats, latency,
# SIGKILL duplicates); PEERS_ARGS=--quick for a smoke run, PEERS_ARGS="--broker kafka"
# on a single-node Apache Kafka.
PEERS_ARGS ?=

BROKER ?= bundled
demo: setup ## the main job: 1M messages exactly-once into SQLite, two SIGKILLs, an audit (BROKER=kafka: on Apache Kafka)
	HTMQC_CONTRACTS=0 $(PY) -m benchmarks.demo --broker $(BROKER)

clean: ## remove build output (not the venv)
	rm -rf build .pytest_cache .mypy_cache .ruff_cache .hypothesis .venv-peers

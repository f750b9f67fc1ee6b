#!/usr/bin/env bash
# Build the deepres images (deepres/extender, deepres/agent) without Docker or a registry, and smoke-test
# them: buildah + debootstrap (installed with apt-get when missing and run as root), a Debian bookworm
# base made from Debian's packages (cached by its inputs), deploy/Dockerfile.{extender,agent} built as
# they are with `--build-arg PYTHON_IMAGE=<that base>`, then in each image as uid 10001: `deepres
# --version`, the predictor, /healthz and /readyz on loopback, the agent reporting to the extender.
# Writes reports/images.json (`--report PATH` elsewhere). The work is in deploy/build_images.py
# (Python standard library only, run by the host's python3).
#   bash deploy/build-images.sh [--report PATH] [--no-smoke] [--rebuild-base]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 deploy/build_images.py "$@"

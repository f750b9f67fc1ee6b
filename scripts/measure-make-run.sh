#!/usr/bin/env bash
# What a newcomer meets first: `make run` from a fresh clone (of this repository's HEAD) with an empty
# pip cache. Seconds until /readyz answers 200, the size of the serving environment (.venv-serve, as
# `du` counts it once /readyz answered: the install plus the bytecode serving compiled; env_mb in MB of
# 10^6 bytes, env_mib in MiB), the load average around it (the figure depends on what else the machine
# runs). Writes reports/make-run.json (or OUT), stamped (`provenance`) by the clone's own code.
#   bash scripts/measure-make-run.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/reports/make-run.json}
work=$(mktemp -d)
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill -TERM -- "-$pid" 2>/dev/null || true
    [[ -n "$pid" ]] && wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
git clone -q "$root" "$work/deepres"
cd "$work/deepres"
export PIP_CACHE_DIR="$work/pip-cache"
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
load_before=$(cut -d' ' -f1 /proc/loadavg)
start=$(date +%s.%N)
setsid make run BIND="127.0.0.1:$port" > "$work/make-run.log" 2>&1 &
pid=$!
ready=null
for _ in $(seq 1 1200); do
    if curl -fsS "http://127.0.0.1:$port/readyz" > /dev/null 2>&1; then
        ready=$(python3 -c "import time; print(round(time.time() - $start, 1))")
        break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
env_mb=$(du -s --block-size=1000000 .venv-serve | cut -f1)
env_mib=$(du -s --block-size=1048576 .venv-serve | cut -f1)
torch=$(.venv-serve/bin/python -c "import importlib.util as u; print(str(u.find_spec('torch') is not None).lower())")
packages=$(.venv-serve/bin/python -c "import importlib.metadata as m; print(len(list(m.distributions())))")
provenance=$(.venv-serve/bin/python -c "import json; from extender.provenance import stamp; print(json.dumps(stamp('bash scripts/measure-make-run.sh')))")
mkdir -p "$(dirname "$out")"
cat > "$out" <<JSON
{
  "readyz_s": $ready,
  "env_mb": $env_mb,
  "env_mib": $env_mib,
  "env": ".venv-serve",
  "size_command": "du -s --block-size=1000000 .venv-serve (env_mb; env_mib: --block-size=1048576), after /readyz",
  "packages": $packages,
  "has_torch": $torch,
  "pip_cache": "empty",
  "load_average_before": $load_before,
  "load_average_after": $load_after,
  "cpus": $(nproc),
  "commit": "$(git rev-parse --short HEAD)",
  "provenance": $provenance
}
JSON
cat "$out"
[[ "$ready" != null ]] || { echo "measure-make-run: /readyz never answered; log:" >&2; tail -20 "$work/make-run.log" >&2; exit 1; }

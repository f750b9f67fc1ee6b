"""`make cluster-bins` on a machine without Go: the pinned toolchain is fetched from the real module proxy
(~70 MB), verified against the checksums in devtools/gotoolchain.py, unpacked into a fresh cache, and
builds a program. PATH holds no `go` here, whatever the machine has."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools import gotoolchain as gt

REPO = Path(__file__).resolve().parents[2]


def proxy_or_skip() -> str:
    proxy = gt.proxies(os.environ.get("GOPROXY"))[0]
    info = gt.zip_url(proxy, gt.module_version()).removesuffix(".zip") + ".info"
    try:
        with urllib.request.urlopen(info, timeout=10) as response:
            response.read()
    except (urllib.error.URLError, OSError) as err:
        pytest.skip(f"the Go module proxy is unreachable ({proxy}: {getattr(err, 'reason', err)})")
    return proxy


@pytest.mark.slow
def test_the_pinned_go_is_fetched_without_any_go_on_path(tmp_path: Path) -> None:
    proxy_or_skip()
    no_go = os.pathsep.join(d for d in ("/usr/bin", "/bin") if not (Path(d) / "go").exists())
    env = {**os.environ, "PATH": no_go, "DEEPRES_CLUSTER_CACHE": str(tmp_path / "cache")}
    env.pop("GOROOT", None)
    ensure = [sys.executable, "-m", "devtools.gotoolchain", "ensure"]
    fetched = subprocess.run(ensure, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert fetched.returncode == 0, fetched.stderr
    root = gt.toolchain_root(tmp_path / "cache")
    assert fetched.stdout.split() == [str(root / "bin" / "go"), gt.GO_VERSION]
    assert "verified and unpacked" in fetched.stderr

    # it builds: a module of its own, no proxy, a fresh build cache
    (tmp_path / "hello").mkdir()
    (tmp_path / "hello" / "go.mod").write_text("module hello\n\ngo 1.26\n")
    (tmp_path / "hello" / "main.go").write_text('package main\n\nfunc main() { println("built") }\n')
    go_env = {**env, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0",
              "GOCACHE": str(tmp_path / "gocache"), "GOPATH": str(tmp_path / "gopath")}
    built = subprocess.run([str(root / "bin" / "go"), "build", "-o", str(tmp_path / "hello-bin"), "."],
                           cwd=tmp_path / "hello", env=go_env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert subprocess.run([str(tmp_path / "hello-bin")], capture_output=True, text=True).stderr == "built\n"

    # cached: a second look fetches nothing (no proxy now)
    again = subprocess.run(ensure, cwd=REPO, env={**env, "GOPROXY": "off"}, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == fetched.stdout, again.stderr

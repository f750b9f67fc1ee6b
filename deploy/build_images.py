"""Build the deepres images with buildah (no Docker daemon, no registry) and smoke-test them.

Run through `deploy/build-images.sh` (or `make images`), as root on a Debian-like host:

1. buildah and debootstrap, installed with apt-get when missing. Where they cannot be installed or
   buildah cannot mount and run a container, the report says `built: false` with a one-line `skipped`
   reason and the exit code is 0 (tests/integration/test_images.py skips with that reason).
2. The base: Debian bookworm made from Debian's packages (`buildah from scratch`, `debootstrap
   --variant=minbase --include=...` into its mount, `buildah commit`), named by a hash of its inputs
   (suite, packages, what is pruned, the image config), so a later run reuses the committed image
   from buildah's storage; debootstrap's .deb files are kept under ~/.cache/deepres-images.
3. deploy/Dockerfile.extender and deploy/Dockerfile.agent built as they are, with
   `--build-arg PYTHON_IMAGE=<the base>` (`buildah bud --isolation chroot`). The host's CA bundle is
   bind-mounted into the build's RUN steps (pip reaches PyPI through the host's trust), never
   committed into an image.
4. In each image, as uid 10001 with a tmpfs on /tmp: `deepres --version`; the Python packages
   inside (torch must not be one); the extender loads the predictor (`deepres predict`) and serves
   `deepres serve --no-kube` on loopback until /healthz and /readyz answer 200; the agent (`deepres
   agent --source simulated`) reports to it until the extender counts an accepted report, and its
   own /healthz and /livez answer 200. Probes run with the image's own Python. Afterwards the
   container's writable layer must hold nothing the smoke run wrote: the processes wrote nothing
   outside /tmp (what readOnlyRootFilesystem requires).

Writes reports/images.json (`--report PATH` elsewhere). Standard library only: it runs on the
host's python3 before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What python:3.11-slim-bookworm gives the Dockerfiles: python (and `python` on PATH), venv, the CA
# bundle; groupadd/useradd (passwd) are in minbase already.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# Left out of the base: the .deb files and package lists debootstrap leaves, docs, man pages and
# message translations (about 140 MB of the 272 MB).
BASE_PRUNE = (
    "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
)
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
BASE_RECIPE = 1  # bump when the way the base is made changes in a way the inputs above do not show
IMAGES = {"extender": "deploy/Dockerfile.extender", "agent": "deploy/Dockerfile.agent"}
RUN_AS = "10001:10001"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
POD_EXAMPLE = ROOT / "deploy/examples/cnn-small.yaml"
ACCEPTED = re.compile(r'^deepres_extender_telemetry_reports_total\{outcome="accepted"\} ([0-9.e+]+)$', re.M)
SMOKE_LIMIT_S = 300  # `timeout` around each server in the image: nothing outlives a crashed run

# Run by the image's own python as uid 10001: GET each URL until it answers 200 (and its body matches
# the optional regex) or the deadline passes; prints {url: {status, body}}.
PROBE = r"""
import json, re, sys, time, urllib.error, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
pattern = re.compile(sys.argv[2], re.M) if sys.argv[2] else None
out = {}
for url in sys.argv[3:]:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                status, body = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read().decode(errors="replace")
        except OSError as err:
            status, body = 0, str(err)
        found = pattern.search(body) if pattern is not None else None
        ok = status == 200 and (pattern is None or found is not None)
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out[url] = {"status": status, "ok": ok, "body": body[-400:], "match": found.group(0) if found else None}
print(json.dumps(out))
"""

INVENTORY = r"""
import importlib.metadata as m, importlib.util as u, json, platform
print(json.dumps({
    "python": platform.python_version(),
    "torch_importable": u.find_spec("torch") is not None,
    "packages": {d.metadata["Name"]: d.version for d in m.distributions()},
}))
"""


class Skip(Exception):
    """buildah cannot run here: the report says so and nothing fails."""


class BuildError(Exception):
    """A step that should have worked did not."""


def log(message: str) -> None:
    print(f"[build-images {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def sh(cmd: Sequence[str], *, timeout: float = 600, check: bool = True, quiet: bool = False,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; BuildError with the tail of its output when it fails and `check`."""
    if not quiet:
        log("$ " + " ".join(cmd))
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        raise BuildError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''}: no answer after {timeout:.0f}s") from err
    if check and done.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:3])} ... exited {done.returncode}:\n{tail(done.stdout + done.stderr)}")
    return done


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def stream(cmd: Sequence[str], *, timeout: float) -> None:
    """Run a long step (debootstrap, buildah bud) with its output going to stderr as it comes;
    BuildError with its last lines when it fails."""
    log("$ " + " ".join(cmd))
    seen: list[str] = []
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:
        watchdog = threading.Timer(timeout, proc.kill)  # a silent hang ends too
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write("    " + line)
                seen = [*seen[-40:], line.rstrip()]
            code = proc.wait()
        finally:
            expired = not watchdog.is_alive()
            watchdog.cancel()
    if expired:
        raise BuildError(f"{' '.join(cmd[:3])} ...: killed after {timeout:.0f}s")
    if code != 0:
        raise BuildError(f"{' '.join(cmd[:3])} ... exited {code}:\n{tail(chr(10).join(seen))}")


# -- tools -------------------------------------------------------------------------------------------

def ensure_tools() -> float:
    """buildah and debootstrap on PATH (apt-get install as root when missing); seconds spent."""
    started = time.monotonic()
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        raise Skip("not root: debootstrap and buildah's mounts need root")
    if missing:
        if shutil.which("apt-get") is None:
            raise Skip(f"{' and '.join(missing)} missing and no apt-get to install them")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "buildah", "debootstrap"]):
            done = sh(cmd, timeout=900, check=False, env=env)
            if done.returncode != 0:
                raise Skip(f"`{' '.join(cmd[:2])}` failed: {last_line(done.stderr) or done.returncode}")
    done = sh(["buildah", "info"], check=False, quiet=True)
    if done.returncode != 0:
        raise Skip(f"buildah cannot run here: {last_line(done.stderr)}")
    ctr = sh(["buildah", "from", "scratch"], check=False, quiet=True)
    if ctr.returncode != 0:
        raise Skip(f"buildah cannot make a container here: {last_line(ctr.stderr)}")
    mounted = sh(["buildah", "mount", ctr.stdout.strip()], check=False, quiet=True)
    sh(["buildah", "rm", ctr.stdout.strip()], check=False, quiet=True)
    if mounted.returncode != 0:
        raise Skip(f"buildah cannot mount a container here: {last_line(mounted.stderr)}")
    return time.monotonic() - started


def buildah_version() -> str:
    return sh(["buildah", "--version"], quiet=True).stdout.strip()


# -- base --------------------------------------------------------------------------------------------

def base_key() -> str:
    inputs = {"suite": SUITE, "variant": "minbase", "packages": sorted(BASE_PACKAGES), "prune": BASE_PRUNE,
              "env": BASE_ENV, "recipe": BASE_RECIPE, "arch": platform.machine()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def image_id(name: str) -> str | None:
    done = sh(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", name], check=False, quiet=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def build_base(cache_dir: Path, mirror: str, rebuild: bool) -> dict[str, Any]:
    """The committed base image, reused from buildah's storage when its inputs have not changed."""
    name = f"localhost/deepres-base:{SUITE}-{base_key()}"
    if not rebuild and image_id(name):
        log(f"base {name}: reused")
        return {"image": name, "reused": True, "build_s": 0.0}
    started = time.monotonic()
    debs = cache_dir / "debs" / SUITE
    debs.mkdir(parents=True, exist_ok=True)
    ctr = sh(["buildah", "from", "scratch"]).stdout.strip()
    try:
        mount = Path(sh(["buildah", "mount", ctr]).stdout.strip())
        stream(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", f"--cache-dir={debs}",
                SUITE, str(mount), mirror], timeout=1800)
        for pattern in BASE_PRUNE:
            for path in glob.glob(str(mount / pattern)):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        sh(["buildah", "umount", ctr])
        config = ["buildah", "config", "--cmd", "python3", "--label", f"io.deepres.base.key={base_key()}",
                  "--label", f"io.deepres.base.packages={','.join(BASE_PACKAGES)}"]
        for key, value in BASE_ENV.items():
            config += ["--env", f"{key}={value}"]
        sh([*config, ctr])
        sh(["buildah", "commit", "--rm", ctr, name], timeout=900)
    except BaseException:
        sh(["buildah", "rm", ctr], check=False, quiet=True)
        raise
    return {"image": name, "reused": False, "build_s": round(time.monotonic() - started, 1)}


# -- images ------------------------------------------------------------------------------------------

def build_image(kind: str, base: str, tag: str) -> dict[str, Any]:
    dockerfile = IMAGES[kind]
    name = f"localhost/deepres/{kind}:{tag}"
    previous = image_id(name)
    cmd = ["buildah", "bud", "--isolation", "chroot", "--format", "docker", "--pull=never",
           "--build-arg", f"PYTHON_IMAGE={base}", "-f", dockerfile, "-t", name]
    ignore = ROOT / f"{dockerfile}.dockerignore"
    if ignore.is_file():
        cmd += ["--ignorefile", str(ignore)]
    if HOST_CA.is_file():  # the RUN steps trust what the host trusts; not committed (a build-time mount)
        cmd += ["-v", f"{HOST_CA}:{HOST_CA}:ro"]
    started = time.monotonic()
    stream([*cmd, str(ROOT)], timeout=1800)
    built_s = time.monotonic() - started
    current = image_id(name)
    if previous and previous != current:  # the old build lost its tag: drop it, not whatever else is dangling
        sh(["buildah", "rmi", previous], check=False, quiet=True)
    return {"image": name, "built": True, "build_s": round(built_s, 1), "size_mib": image_size_mib(name)}


def image_size_mib(name: str) -> float:
    """Sum of the image's layers as stored (uncompressed tar), as `buildah images` counts it."""
    inspect = json.loads(sh(["buildah", "inspect", "--type", "image", name], quiet=True).stdout)
    manifest = json.loads(inspect["Manifest"])
    return round(sum(layer["size"] for layer in manifest["layers"]) / 2**20, 1)


# -- smoke -------------------------------------------------------------------------------------------

class Container:
    """A working container of `image`; commands run in it with chroot isolation and the host's network,
    as uid 10001, with a fresh tmpfs on /tmp and `shared` mounted read-only on /smoke."""

    def __init__(self, image: str, shared: Path) -> None:
        self.image, self.shared = image, shared
        self.id = sh(["buildah", "from", "--pull=never", image], quiet=True).stdout.strip()
        merged = Path(sh(["buildah", "mount", self.id], quiet=True).stdout.strip())
        self.upper = merged.parent / "diff"  # overlay's writable layer: every write outside the mounts
        self.baseline: dict[str, tuple[int, int]] = {}

    def argv(self, *cmd: str) -> list[str]:
        return ["buildah", "run", "--isolation", "chroot", "--network", "host", "--user", RUN_AS,
                "--mount", "type=tmpfs,destination=/tmp", "-v", f"{self.shared}:/smoke:ro", self.id, "--", *cmd]

    def run(self, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return sh(self.argv(*cmd), timeout=timeout, check=False, quiet=True)

    def writes(self) -> dict[str, tuple[int, int]]:
        """Entries of the writable layer: a directory by its presence (its mtime moves when buildah
        adds and removes its own mount points in it), anything else by mtime and size."""
        found = {}
        if self.upper.is_dir():
            for path in self.upper.rglob("*"):
                with contextlib.suppress(OSError):
                    st = path.lstat()
                    is_dir = stat.S_ISDIR(st.st_mode)
                    found["/" + str(path.relative_to(self.upper))] = (0, 0) if is_dir else (st.st_mtime_ns, st.st_size)
        return found

    def mark(self) -> None:
        """What buildah itself put in the writable layer (mount points): not the smoke's writes."""
        self.run("true")
        self.baseline = self.writes()

    def new_writes(self) -> list[str]:
        return sorted(path for path, seen in self.writes().items() if self.baseline.get(path) != seen)

    def remove(self) -> None:
        sh(["buildah", "rm", self.id], check=False, quiet=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for stat_file in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(stat_file).read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat_file.split("/")[2]))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


@contextlib.contextmanager
def background(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (a `buildah run`) while the block runs; then SIGTERM it and everything it started."""
    with log_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield proc
        finally:
            pids = descendants(proc.pid)
            for pid in reversed(pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait(10)


def probe(ctr: Container, urls: list[str], deadline_s: float, pattern: str = "") -> dict[str, Any]:
    done = ctr.run("python", "/smoke/probe.py", str(deadline_s), pattern, *urls, timeout=deadline_s + 60)
    try:
        answers: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {url: {"ok": False, "status": 0, "body": last_line(done.stderr)} for url in urls}
    return answers


def check(checks: dict[str, Any], name: str, ok: bool, detail: Any) -> None:
    checks[name] = {"ok": bool(ok), "detail": detail}
    log(f"  {'ok  ' if ok else 'FAIL'} {name}: {json.dumps(detail)[:300]}")


def static_checks(ctr: Container, version: str, entry: dict[str, Any]) -> dict[str, Any]:
    """What every image must show before serving: version, packages (no torch)."""
    checks: dict[str, Any] = {}
    done = ctr.run("deepres", "--version")
    check(checks, "version", done.stdout.strip() == f"deepres {version}",
          done.stdout.strip() or last_line(done.stderr))
    done = ctr.run("python", "-c", INVENTORY)
    try:
        inventory = json.loads(done.stdout)
    except json.JSONDecodeError:
        inventory = {"packages": {}, "torch_importable": None, "python": None}
    packages = dict(sorted(inventory["packages"].items(), key=lambda kv: kv[0].lower()))
    entry["python"] = inventory["python"]
    entry["packages"] = packages
    entry["has_torch"] = bool(inventory["torch_importable"]) or any(p.lower() == "torch" for p in packages)
    summary = {"packages": len(packages), "python": inventory["python"]}
    check(checks, "inventory", done.returncode == 0 and "deepres" in packages,
          summary if done.returncode == 0 else last_line(done.stderr))
    check(checks, "no_torch", inventory["torch_importable"] is False and not entry["has_torch"],
          {"torch_importable": inventory["torch_importable"]})
    return checks


def smoke(images: dict[str, dict[str, Any]], version: str, work: Path) -> None:
    """Fills each built image's entry with `checks` and `smoke_test_passed`."""
    shared = work / "smoke"
    shared.mkdir()
    (shared / "probe.py").write_text(PROBE)
    (shared / "token").write_text("smoke-" + hashlib.sha256(os.urandom(16)).hexdigest()[:24] + "\n")
    shutil.copy(POD_EXAMPLE, shared / "pod.yaml")
    for path in [shared, *shared.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by uid 10001
    eport, aport = free_port(), free_port()
    extender_url = f"http://127.0.0.1:{eport}"
    containers: dict[str, Container] = {}
    checks: dict[str, dict[str, Any]] = {kind: {} for kind in images}
    try:
        for kind, entry in images.items():
            if entry.get("built"):
                containers[kind] = Container(entry["image"], shared)
                containers[kind].mark()
                log(f"smoke {kind} ({entry['image']})")
                checks[kind] = static_checks(containers[kind], version, entry)
        ext, agent = containers.get("extender"), containers.get("agent")
        if ext is None:
            return
        done = ext.run("deepres", "predict", "-f", "/smoke/pod.yaml", "--json")
        try:
            demand = json.loads(done.stdout)["demand"]
        except (json.JSONDecodeError, KeyError):
            demand = {}
        check(checks["extender"], "predictor", done.returncode == 0 and float(demand.get("memory_mib", 0)) > 0,
              {k: demand.get(k) for k in ("memory_mib", "memory_mib_upper", "model_version")} if demand
              else last_line(done.stderr))
        serve = ext.argv("timeout", str(SMOKE_LIMIT_S), "deepres", "serve", "--no-kube", "--bind",
                         f"127.0.0.1:{eport}", "--telemetry-token-file", "/smoke/token")
        with background(serve, work / "extender.log"):
            answers = probe(ext, [f"{extender_url}/healthz", f"{extender_url}/readyz"], 120)
            for path in ("healthz", "readyz"):
                answer = answers[f"{extender_url}/{path}"]
                check(checks["extender"], path, answer["ok"], {"status": answer["status"], "body": answer["body"]})
            if agent is not None:
                run_agent = agent.argv(
                    "timeout", str(SMOKE_LIMIT_S), "deepres", "agent", "--source", "simulated", "--no-kube",
                    "--node-name", "smoke-node", "--extender-url", extender_url, "--token-file", "/smoke/token",
                    "--listen", f"127.0.0.1:{aport}", "--interval-s", "1", "--heartbeat-s", "1")
                with background(run_agent, work / "agent.log"):
                    agent_url = f"http://127.0.0.1:{aport}"
                    answers = probe(agent, [f"{agent_url}/livez", f"{agent_url}/healthz"], 60)
                    for path in ("livez", "healthz"):
                        answer = answers[f"{agent_url}/{path}"]
                        check(checks["agent"], path, answer["ok"], {"status": answer["status"], "body": answer["body"]})
                    answer = probe(ext, [f"{extender_url}/metrics"], 60, ACCEPTED.pattern)[f"{extender_url}/metrics"]
                    match = ACCEPTED.search(answer["match"] or "")
                    accepted = float(match.group(1)) if match else 0.0
                    check(checks["agent"], "reports_accepted", answer["ok"] and accepted >= 1,
                          {"accepted_by_extender": accepted})
            for kind, log_name in (("extender", "extender.log"), ("agent", "agent.log")):
                if kind in containers and (work / log_name).exists():
                    images[kind]["log_tail"] = [
                        line[:240] for line in (work / log_name).read_text(errors="replace").splitlines()[-8:]]
    finally:
        for kind, ctr in containers.items():
            writes = ctr.new_writes()
            check(checks[kind], "writes_only_tmp", not writes, writes[:20])
            ctr.remove()
        for kind, entry in images.items():
            entry["checks"] = checks.get(kind, {})
            entry["smoke_test_passed"] = bool(entry.get("built")) and bool(entry["checks"]) and all(
                c["ok"] for c in entry["checks"].values())
            if kind == "agent" and "reports_accepted" not in entry["checks"]:
                entry["smoke_test_passed"] = False  # never reported to a running extender


# -- report ------------------------------------------------------------------------------------------

def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def empty_entry(kind: str) -> dict[str, Any]:
    return {"dockerfile": IMAGES[kind], "built": False, "smoke_test_passed": False, "has_torch": None,
            "size_mib": None, "packages": {}}


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {path}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=ROOT / "reports/images.json", help="where the JSON goes")
    parser.add_argument("--no-smoke", action="store_true", help="build only")
    parser.add_argument("--rebuild-base", action="store_true", help="make the base again even when cached")
    parser.add_argument("--mirror", default=os.environ.get("DEEPRES_DEBIAN_MIRROR", DEFAULT_MIRROR),
                        help=f"Debian mirror for debootstrap (default {DEFAULT_MIRROR}; env DEEPRES_DEBIAN_MIRROR)")
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    parser.add_argument("--cache-dir", type=Path, default=cache_home / "deepres-images",
                        help="debootstrap's .deb cache (default ~/.cache/deepres-images)")
    args = parser.parse_args(argv)
    version = project_version()
    started = time.monotonic()
    report: dict[str, Any] = {
        "generated_by": "deploy/build-images.sh", "tag": version, "skipped": None,
        "extender": empty_entry("extender"), "agent": empty_entry("agent"),
    }
    try:
        report["tools_install_s"] = round(ensure_tools(), 1)
    except Skip as skip:
        report["skipped"] = str(skip)
        log(f"skipped: {skip}")
        write_report(args.report, report)
        return 0
    report["buildah"] = buildah_version()
    failures = []
    with tempfile.TemporaryDirectory(prefix="deepres-images-") as tmp:
        try:
            base = build_base(args.cache_dir, args.mirror, args.rebuild_base)
            report["base"] = {**base, "suite": SUITE, "packages": list(BASE_PACKAGES),
                              "size_mib": image_size_mib(base["image"])}
            probe_ctr = sh(["buildah", "from", "--pull=never", base["image"]], quiet=True).stdout.strip()
            ran = sh(["buildah", "run", "--isolation", "chroot", probe_ctr, "--", "true"], check=False, quiet=True)
            sh(["buildah", "rm", probe_ctr], check=False, quiet=True)
            if ran.returncode != 0:
                raise Skip(f"buildah cannot run a container here (chroot isolation): {last_line(ran.stderr)}")
        except Skip as skip:
            report["skipped"] = str(skip)
            log(f"skipped: {skip}")
            write_report(args.report, report)
            return 0
        except BuildError as err:
            report["error"] = f"base: {err}"
            write_report(args.report, report)
            log(f"FAILED: base: {err}")
            return 1
        for kind in IMAGES:
            try:
                report[kind].update(build_image(kind, base["image"], version))
            except BuildError as err:
                report[kind]["error"] = str(err)
                failures.append(f"{kind}: build failed")
                log(f"FAILED: {kind}: {err}")
        report["build_s"] = round(time.monotonic() - started, 1)
        if not args.no_smoke:
            smoke_started = time.monotonic()
            smoke({kind: report[kind] for kind in IMAGES}, version, Path(tmp))
            report["smoke_s"] = round(time.monotonic() - smoke_started, 1)
            failures += [f"{kind}: smoke test failed" for kind in IMAGES
                         if report[kind]["built"] and not report[kind]["smoke_test_passed"]]
    report["total_s"] = round(time.monotonic() - started, 1)
    write_report(args.report, report)
    for failure in failures:
        log(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

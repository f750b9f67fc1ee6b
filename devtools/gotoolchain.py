"""The Go toolchain the local control plane is built with (devtools/localcluster.py), fetched when the
machine has none.

The control plane (etcd, kube-apiserver, kube-scheduler, kwok, ...) is built from the Go module in
cluster/ with Go 1.26 (1.27's default jsonv2 experiment makes kube-apiserver's /openapi/v2 malformed).
A `go` on PATH of that minor version is used as it is. Otherwise (no Go, or another version) the
pinned release GO_VERSION is fetched the way `GOTOOLCHAIN` fetches one: the Go module proxy serves
every release as the module golang.org/toolchain, version v0.0.1-go1.26.8.linux-amd64. The module's
zip is downloaded with urllib from the first proxy of GOPROXY (default https://proxy.golang.org; no
`go` needed), refused unless both its sha256 and its h1: hash (the go.sum hash, as sum.golang.org
records it) are the ones CHECKSUMS records for the pin, and unpacked into the cluster cache
(~/.cache/deepres-cluster/toolchain/go1.26.8.linux-amd64, whose bin/go is then used).

`python -m devtools.gotoolchain ensure` prints the `go` binary a build would use (fetching it if need
be); `python -m devtools.gotoolchain pin [VERSION]` downloads VERSION for every platform of
PLATFORMS and prints its CHECKSUMS entries, after comparing each h1: hash with sum.golang.org's
lookup (through the proxy, over TLS: the tree note's signature and the inclusion proof are not checked).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import os
import platform as _platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

#: the release fetched when the machine has no Go 1.26 (the machine's own Go, where it is 1.26, is used instead)
GO_VERSION = "go1.26.8"
MODULE = "golang.org/toolchain"
DEFAULT_PROXY = "https://proxy.golang.org"
#: the platforms `pin` records
PLATFORMS = ("linux-amd64", "linux-arm64")
#: module version -> (sha256 of its zip, its h1: hash): `python -m devtools.gotoolchain pin VERSION` prints these
CHECKSUMS: dict[str, tuple[str, str]] = {
    "v0.0.1-go1.26.8.linux-amd64": ("30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7",
                                    "h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM="),
    "v0.0.1-go1.26.8.linux-arm64": ("02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99",
                                    "h1:sYL/O6MqS68ML0kjsQ36WoYIpJqkw60TxizWUYUKQMc="),
}
_VERSION = re.compile(r"\bgo(\d+)\.(\d+)(?:\.(\d+))?\b")
_CHUNK = 1 << 20

Log = Callable[[str], None] | None


class ToolchainError(RuntimeError):
    """No usable Go: the message says why and what to do."""


# ----------------------------------------------------------------------------------------------
# the pure parts


def parse_go_version(text: str) -> tuple[int, int, int]:
    """(1, 26, 8) from `go1.26.8`, `go version go1.26.8 linux/amd64` or `go1.26` (patch 0)."""
    match = _VERSION.search(text)
    if match is None:
        raise ToolchainError(f"not a Go version: {text.strip()!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def accepted(version: str, pinned: str = GO_VERSION) -> bool:
    """Whether a Go of `version` builds the control plane: the pin's minor release, any patch."""
    try:
        return parse_go_version(version)[:2] == parse_go_version(pinned)[:2]
    except ToolchainError:
        return False


def host_platform(system: str | None = None, machine: str | None = None) -> str:
    """GOOS-GOARCH of this machine (`linux-amd64`)."""
    system = (system or sys.platform).lower()
    machine = (machine or _platform.machine()).lower()
    goos = {"linux": "linux", "darwin": "darwin"}.get(system)
    goarch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if goos is None or goarch is None:
        raise ToolchainError(f"no Go toolchain is fetched for {system}/{machine}: install Go "
                             f"{'.'.join(map(str, parse_go_version(GO_VERSION)[:2]))} and put it on PATH")
    return f"{goos}-{goarch}"


def module_version(go_version: str = GO_VERSION, plat: str | None = None) -> str:
    """The toolchain module's version: v0.0.1-go1.26.8.linux-amd64."""
    parse_go_version(go_version)
    return f"v0.0.1-{go_version}.{plat or host_platform()}"


def escape(path: str) -> str:
    """A module path or version as the proxy protocol spells it: each capital letter as `!` + lower case."""
    return re.sub(r"[A-Z]", lambda m: "!" + m[0].lower(), path)


def proxies(goproxy: str | None) -> list[str]:
    """The proxy URLs of a GOPROXY value, in order (`direct` and `off` skipped; unset or empty: the default)."""
    if not goproxy:
        return [DEFAULT_PROXY]
    found = [entry.strip().rstrip("/") for entry in re.split(r"[,|]", goproxy)]
    urls = [url for url in found if url and url not in ("direct", "off")]
    if not urls:
        raise ToolchainError(f"GOPROXY={goproxy!r} names no proxy: the Go toolchain is fetched from a module proxy "
                             f"(unset GOPROXY for {DEFAULT_PROXY}), or install Go and put it on PATH")
    return urls


def zip_url(proxy: str, version: str) -> str:
    """The proxy's URL of the toolchain module's zip for `version` (a module version)."""
    return f"{proxy.rstrip('/')}/{escape(MODULE)}/@v/{escape(version)}.zip"


def h1_hash(zip_path: Path) -> str:
    """The go.sum hash of a module zip (golang.org/x/mod/sumdb/dirhash.HashZip, Hash1): the sha256 of
    the lines `SHA256HEX  NAME` of its files, sorted by name, in base64."""
    summary = hashlib.sha256()
    with zipfile.ZipFile(zip_path) as archive:
        for name in sorted(info.filename for info in archive.infolist()):
            if "\n" in name:
                raise ToolchainError(f"{zip_path}: a file name with a newline")
            digest = hashlib.sha256()
            with archive.open(name) as member:
                for chunk in iter(lambda: member.read(_CHUNK), b""):
                    digest.update(chunk)
            summary.update(f"{digest.hexdigest()}  {name}\n".encode())
    return "h1:" + base64.b64encode(summary.digest()).decode()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unrecorded(version: str) -> str:
    return (f"no checksum is recorded for {MODULE}@{version} (devtools/gotoolchain.py CHECKSUMS; "
            "`python -m devtools.gotoolchain pin VERSION` prints them): refusing to fetch it; install Go 1.26 "
            "and put it on PATH instead")


def verify(zip_path: Path, version: str, checksums: Mapping[str, tuple[str, str]] = CHECKSUMS) -> None:
    """Refuse (ToolchainError) a zip whose sha256 or h1: hash is not the one recorded for `version`."""
    if version not in checksums:
        raise ToolchainError(_unrecorded(version))
    want_sha, want_h1 = checksums[version]
    got_sha = sha256_file(zip_path)
    if got_sha != want_sha:
        raise ToolchainError(f"{MODULE}@{version}: the download's sha256 is {got_sha}, the recorded one {want_sha}: "
                             "refusing it")
    try:
        got_h1 = h1_hash(zip_path)
    except zipfile.BadZipFile as err:
        raise ToolchainError(f"{MODULE}@{version}: not a zip ({err})") from err
    if got_h1 != want_h1:
        raise ToolchainError(f"{MODULE}@{version}: the download's h1 hash is {got_h1}, the recorded one {want_h1}: "
                             "refusing it")


def unpack(zip_path: Path, dest: Path, version: str) -> None:
    """The zip's files, less their `golang.org/toolchain@VERSION/` prefix, into `dest`; bin/ and
    pkg/tool/ executable (as the go command marks them). Refuses a name outside the prefix."""
    prefix = f"{MODULE}@{version}/"
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            name = info.filename
            relative = PurePosixPath(name[len(prefix):]) if name.startswith(prefix) else None
            if relative is None or relative.is_absolute() or ".." in relative.parts or not relative.parts:
                raise ToolchainError(f"{zip_path}: {name!r} is not a file of {MODULE}@{version}")
            if name.endswith("/"):
                continue
            target = dest.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out, _CHUNK)
            mode = (info.external_attr >> 16) & 0o777 or 0o644
            if relative.parts[0] == "bin" or relative.parts[:2] == ("pkg", "tool"):
                mode |= 0o755
            target.chmod(mode & ~0o022 | stat.S_IRUSR)


# ----------------------------------------------------------------------------------------------
# the machine's Go, or the fetched one


def version_of(go: str) -> str:
    """`go1.26.8`: the GOVERSION of the `go` binary at `go` (GOTOOLCHAIN=local: it must not switch itself)."""
    result = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GOTOOLCHAIN": "local"})
    if result.returncode != 0:
        raise ToolchainError(f"{go} env GOVERSION failed: {result.stderr.strip()[-500:]}")
    return result.stdout.strip()


def toolchain_root(cache: Path, go_version: str = GO_VERSION, plat: str | None = None) -> Path:
    """Where the fetched toolchain lives in the cache (its GOROOT)."""
    return cache / "toolchain" / f"{go_version}.{plat or host_platform()}"


def local_go() -> tuple[str, str] | None:
    """(path, version) of the `go` on PATH when it builds the control plane; None when there is none or
    it is another minor release."""
    go = shutil.which("go")
    if go is None:
        return None
    try:
        version = version_of(go)
    except (ToolchainError, OSError, subprocess.SubprocessError):
        return None
    return (go, version) if accepted(version) else None


def choose(cache: Path) -> tuple[Path | None, str]:
    """(the `go` to build with, its version), without fetching anything: the machine's `go` when it is
    Go 1.26; else the pinned release, its bin/go when it was fetched already and None when not yet
    (`ensure_toolchain` fetches it when a build needs it: cached binaries need no Go at all)."""
    found = local_go()
    if found is not None:
        return Path(found[0]), found[1]
    fetched = toolchain_root(cache) / "bin" / "go"
    return (fetched if fetched.is_file() else None), GO_VERSION


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; a second caller reuses the first's
        yield


def download(url: str, dest: Path, log: Log = None, timeout_s: float = 60.0) -> None:
    """`url` into `dest` (urllib: no `go`, no curl); ToolchainError with the reason when it fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, dest.open("wb") as out:
            size = int(response.headers.get("Content-Length") or 0)
            if log:
                log(f"downloading {url}" + (f" ({size / 1e6:.0f} MB)" if size else ""))
            shutil.copyfileobj(response, out, _CHUNK)
    except urllib.error.HTTPError as err:
        raise ToolchainError(f"{url}: HTTP {err.code}") from err
    except (urllib.error.URLError, OSError) as err:
        raise ToolchainError(f"{url}: {getattr(err, 'reason', err)}") from err


def ensure_toolchain(cache: Path, log: Log = None, *, go_version: str = GO_VERSION,
                     checksums: Mapping[str, tuple[str, str]] = CHECKSUMS, goproxy: str | None = None) -> Path:
    """The fetched toolchain's bin/go, downloaded, verified and unpacked into the cache unless it is there."""
    plat = host_platform()
    root = toolchain_root(cache, go_version, plat)
    go = root / "bin" / "go"
    if go.is_file():
        return go
    version = module_version(go_version, plat)
    if version not in checksums:  # before any download: a pin without checksums is refused outright
        raise ToolchainError(_unrecorded(version))
    with _locked(cache / "toolchain.lock"):
        if go.is_file():
            return go
        errors = []
        for proxy in proxies(os.environ.get("GOPROXY") if goproxy is None else goproxy):
            work = Path(tempfile.mkdtemp(prefix="toolchain-", dir=cache))
            try:
                archive = work / "toolchain.zip"
                download(zip_url(proxy, version), archive, log)
                verify(archive, version, checksums)
                unpack(archive, work / "go", version)
                archive.unlink()
                root.parent.mkdir(parents=True, exist_ok=True)
                (work / "go").rename(root)
            except ToolchainError as err:
                errors.append(str(err))
                continue
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if log:
                log(f"Go {go_version} ({plat}) verified and unpacked into {root}")
            return go
        raise ToolchainError(f"could not fetch Go {go_version} ({'; '.join(errors)}); "
                             "install Go 1.26 and put it on PATH, or set GOPROXY to a reachable module proxy")


def ensure(cache: Path, log: Log = None) -> tuple[Path, str]:
    """(the `go` to build with, its version): the machine's Go 1.26, else the pinned one, fetched now if need be."""
    go, version = choose(cache)
    if go is None:
        if log:
            log(f"no Go {'.'.join(map(str, parse_go_version(GO_VERSION)[:2]))} on PATH: fetching {GO_VERSION}")
        go = ensure_toolchain(cache, log)
    return go, version


# ----------------------------------------------------------------------------------------------
# the command line


def _pin(go_version: str) -> int:
    """Download `go_version` for PLATFORMS, print their CHECKSUMS entries (h1 compared with sum.golang.org's)."""
    proxy = proxies(os.environ.get("GOPROXY"))[0]
    with tempfile.TemporaryDirectory() as tmp:
        for plat in PLATFORMS:
            version = module_version(go_version, plat)
            archive = Path(tmp) / f"{plat}.zip"
            download(zip_url(proxy, version), archive, lambda m: print(m, file=sys.stderr))
            sha, h1 = sha256_file(archive), h1_hash(archive)
            lookup = f"{proxy}/sumdb/sum.golang.org/lookup/{escape(MODULE)}@{escape(version)}"
            with urllib.request.urlopen(lookup, timeout=60) as response:
                record = response.read().decode()
            if f"{MODULE} {version} {h1}\n" not in record:
                print(f"{version}: h1 {h1} is not sum.golang.org's:\n{record}", file=sys.stderr)
                return 1
            print(f'    "{version}": ("{sha}",\n        "{h1}"),')
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gotoolchain", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("ensure", "pin"))
    parser.add_argument("version", nargs="?", default=GO_VERSION, help="pin: the Go release (default %(default)s)")
    parser.add_argument("--cache", help="ensure: the cluster cache (default DEEPRES_CLUSTER_CACHE or "
                                        "~/.cache/deepres-cluster)")
    args = parser.parse_args(argv)
    if args.action == "pin":
        return _pin(args.version)
    cache = Path(args.cache or os.environ.get("DEEPRES_CLUSTER_CACHE") or Path.home() / ".cache" / "deepres-cluster")
    try:
        go, version = ensure(cache, lambda m: print(f"toolchain: {m}", file=sys.stderr, flush=True))
    except ToolchainError as err:
        print(f"toolchain: {err}", file=sys.stderr)
        return 1
    print(f"{go} {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Go toolchain bootstrap of the local control plane (devtools/gotoolchain.py): its pure parts, and
the whole fetch against a module proxy on disk (file://), offline. The fetch from the real proxy is
tests/integration/test_gotoolchain_fetch.py (slow)."""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
from pathlib import Path

import pytest

from devtools import gotoolchain as gt
from devtools import localcluster

#: names and contents of a module zip, and its h1: hash as Go itself computes it (`go mod download
#: -json` of this zip served by a file:// GOPROXY printed "Sum")
VECTOR = {"example.com/vector@v1.0.0/go.mod": b"module example.com/vector\n\ngo 1.26\n",
          "example.com/vector@v1.0.0/bin/tool": b"#!/bin/sh\necho hi\n",
          "example.com/vector@v1.0.0/README": b"deepres h1 vector\n"}
VECTOR_H1 = "h1:Q1EkJFuvcY9m68CZqR3nhrfovvW7i7uLs9Vgh3Nbwos="
FAKE_GO = "go1.26.99"


def write_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100644 << 16  # bin/ made executable by unpack, as the go command does
            archive.writestr(info, content)
    return path


def test_parse_go_version() -> None:
    assert gt.parse_go_version("go1.26.8") == (1, 26, 8)
    assert gt.parse_go_version("go version go1.26.12 linux/amd64\n") == (1, 26, 12)
    assert gt.parse_go_version("go1.26") == (1, 26, 0)
    for bad in ("", "1.26.8", "devel", "gox.y"):
        with pytest.raises(gt.ToolchainError):
            gt.parse_go_version(bad)


def test_only_the_pinned_minor_release_is_accepted() -> None:
    assert gt.accepted("go1.26.0") and gt.accepted("go1.26.31") and gt.accepted(gt.GO_VERSION)
    assert not gt.accepted("go1.27.0") and not gt.accepted("go1.25.9") and not gt.accepted("devel +abc")


def test_platform_and_urls() -> None:
    assert gt.host_platform("linux", "x86_64") == "linux-amd64"
    assert gt.host_platform("linux", "aarch64") == "linux-arm64"
    assert gt.host_platform("darwin", "arm64") == "darwin-arm64"
    with pytest.raises(gt.ToolchainError, match="install Go"):
        gt.host_platform("win32", "AMD64")
    assert gt.module_version("go1.26.8", "linux-amd64") == "v0.0.1-go1.26.8.linux-amd64"
    assert gt.escape("github.com/BurntSushi/toml") == "github.com/!burnt!sushi/toml"
    assert (gt.zip_url("https://proxy.golang.org/", "v0.0.1-go1.26.8.linux-amd64")
            == "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go1.26.8.linux-amd64.zip")


def test_goproxy_is_read_as_the_go_command_reads_it() -> None:
    assert gt.proxies(None) == gt.proxies("") == ["https://proxy.golang.org"]
    assert gt.proxies("https://a.example/,direct") == ["https://a.example"]
    assert gt.proxies("https://a.example|https://b.example,off") == ["https://a.example", "https://b.example"]
    for none in ("off", "direct", "direct,off"):
        with pytest.raises(gt.ToolchainError, match="names no proxy"):
            gt.proxies(none)


def test_h1_hash_is_gos(tmp_path: Path) -> None:
    assert gt.h1_hash(write_zip(tmp_path / "m.zip", VECTOR)) == VECTOR_H1
    changed = {**VECTOR, "example.com/vector@v1.0.0/README": b"x\n"}
    assert gt.h1_hash(write_zip(tmp_path / "n.zip", changed)) != VECTOR_H1


def test_every_pinned_platform_has_both_checksums() -> None:
    for plat in gt.PLATFORMS:
        sha, h1 = gt.CHECKSUMS[gt.module_version(gt.GO_VERSION, plat)]
        assert len(bytes.fromhex(sha)) == 32 and h1.startswith("h1:") and len(h1) == 47


def test_a_tampered_or_unrecorded_zip_is_refused(tmp_path: Path) -> None:
    good = write_zip(tmp_path / "good.zip", VECTOR)
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    recorded = {"v1.0.0": (sha, VECTOR_H1)}
    gt.verify(good, "v1.0.0", recorded)
    tampered = tmp_path / "tampered.zip"
    data = bytearray(good.read_bytes())
    data[data.index(b"echo hi")] ^= 0x20  # one byte of bin/tool
    tampered.write_bytes(bytes(data))
    with pytest.raises(gt.ToolchainError, match=r"sha256 .* refusing"):
        gt.verify(tampered, "v1.0.0", recorded)
    # a recorded sha256 that matches but an h1 that does not (a wrong pin) is refused too
    with pytest.raises(gt.ToolchainError, match=r"h1 hash .* refusing"):
        gt.verify(good, "v1.0.0", {"v1.0.0": (sha, "h1:" + "A" * 43 + "=")})
    with pytest.raises(gt.ToolchainError, match="no checksum is recorded"):
        gt.verify(good, "v2.0.0", recorded)


def test_unpack_strips_the_prefix_marks_bin_executable_and_refuses_escapes(tmp_path: Path) -> None:
    version = "v0.0.1-go1.26.8.linux-amd64"
    prefix = f"golang.org/toolchain@{version}/"
    archive = write_zip(tmp_path / "m.zip", {prefix + "bin/go": b"#!/bin/sh\n", prefix + "src/a/b.go": b"package b\n"})
    gt.unpack(archive, tmp_path / "out", version)
    assert (tmp_path / "out/src/a/b.go").read_bytes() == b"package b\n"
    assert (tmp_path / "out/bin/go").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "out/src/a/b.go").stat().st_mode & 0o777 == 0o644
    for evil in (prefix + "../../escape", "golang.org/toolchain@v0.0.1-go1.26.7.linux-amd64/x", "/abs", prefix):
        bad = write_zip(tmp_path / "bad.zip", {evil: b"x"})
        with pytest.raises(gt.ToolchainError, match="is not a file of"):
            gt.unpack(bad, tmp_path / "bad", version)
        assert not (tmp_path / "escape").exists()


def fake_toolchain(proxy: Path, go_version: str, plat: str) -> tuple[str, tuple[str, str]]:
    """A toolchain module on a file:// proxy whose bin/go answers `env GOVERSION` with `go_version`."""
    version = gt.module_version(go_version, plat)
    prefix = f"golang.org/toolchain@{version}/"
    folder = proxy / "golang.org" / "toolchain" / "@v"
    folder.mkdir(parents=True, exist_ok=True)
    archive = write_zip(folder / f"{version}.zip", {
        prefix + "bin/go": f"#!/bin/sh\necho {go_version}\n".encode(),
        prefix + "pkg/tool/linux_amd64/compile": b"#!/bin/sh\n",
        prefix + "src/README": b"fake\n",
    })
    return version, (gt.sha256_file(archive), gt.h1_hash(archive))


def test_the_fetch_from_a_proxy_verifies_unpacks_and_reuses(tmp_path: Path) -> None:
    plat = gt.host_platform()
    version, sums = fake_toolchain(tmp_path / "proxy", FAKE_GO, plat)
    cache, goproxy = tmp_path / "cache", f"file://{tmp_path / 'proxy'},direct"
    go = gt.ensure_toolchain(cache, go_version=FAKE_GO, checksums={version: sums}, goproxy=goproxy)
    assert go == gt.toolchain_root(cache, FAKE_GO) / "bin" / "go"
    assert go.stat().st_mode & stat.S_IXUSR and (go.parents[1] / "pkg/tool/linux_amd64/compile").stat().st_mode & 0o111
    assert gt.version_of(str(go)) == FAKE_GO
    assert sorted(p.name for p in cache.iterdir()) == ["toolchain", "toolchain.lock"]  # no zip, no work folder left
    (tmp_path / "proxy").rename(tmp_path / "gone")  # cached: no proxy needed any more
    assert gt.ensure_toolchain(cache, go_version=FAKE_GO, checksums={version: sums}, goproxy=goproxy) == go


def test_a_tampered_proxy_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    plat = gt.host_platform()
    version, (sha, h1) = fake_toolchain(tmp_path / "proxy", FAKE_GO, plat)
    archive = tmp_path / "proxy" / "golang.org" / "toolchain" / "@v" / f"{version}.zip"
    write_zip(archive, {f"golang.org/toolchain@{version}/bin/go": b"#!/bin/sh\necho evil\n"})
    cache = tmp_path / "cache"
    with pytest.raises(gt.ToolchainError, match=r"sha256 .* refusing"):
        gt.ensure_toolchain(cache, go_version=FAKE_GO, checksums={version: (sha, h1)},
                            goproxy=f"file://{tmp_path / 'proxy'}")
    assert not gt.toolchain_root(cache, FAKE_GO).exists()
    assert [p.name for p in cache.iterdir()] == ["toolchain.lock"]
    # a version without recorded checksums is refused before anything is downloaded
    with pytest.raises(gt.ToolchainError, match="no checksum is recorded"):
        gt.ensure_toolchain(cache, go_version=FAKE_GO, checksums={}, goproxy="https://unreachable.invalid")


def path_with_go(tmp_path: Path, version: str | None) -> str:
    """A PATH of /usr/bin and /bin (no Go there on the machines this runs on) and, with `version`, a `go`
    that reports it."""
    folders = [d for d in ("/usr/bin", "/bin") if not (Path(d) / "go").exists()]
    if version is not None:
        fake = tmp_path / "fakego"
        fake.mkdir()
        (fake / "go").write_text(f"#!/bin/sh\necho {version}\n")
        (fake / "go").chmod(0o755)
        folders.insert(0, str(fake))
    return os.pathsep.join(folders)


@pytest.mark.parametrize("machine_go", [None, "go1.27.1", "go1.25.9"])
def test_without_go_1_26_the_pinned_version_keys_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           machine_go: str | None) -> None:
    monkeypatch.setenv("PATH", path_with_go(tmp_path, machine_go))
    monkeypatch.setenv("DEEPRES_CLUSTER_CACHE", str(tmp_path / "cache"))
    assert gt.choose(tmp_path / "cache") == (None, gt.GO_VERSION)  # nothing fetched yet, nothing fetched by asking
    # the same key as a build with the machine's Go of the pinned version: its cached binaries are reused
    assert localcluster.go_version() == gt.GO_VERSION
    assert not (tmp_path / "cache").exists()


def test_the_machines_go_1_26_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", path_with_go(tmp_path, "go1.26.3"))
    assert gt.choose(tmp_path / "cache") == (tmp_path / "fakego" / "go", "go1.26.3")
    monkeypatch.setenv("DEEPRES_CLUSTER_CACHE", str(tmp_path / "cache"))
    assert localcluster.go_version() == "go1.26.3"

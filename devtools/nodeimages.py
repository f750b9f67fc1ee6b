"""Container images for the local cluster's real node, made without any registry.

Why: the real node's containerd pulls nothing (the machines reach package registries only), so every
image a pod there runs is made here and imported into containerd's `k8s.io` namespace, where the
kubelet finds it (`imagePullPolicy: IfNotPresent`, or any policy but Always for a tag other than
`latest`):

- the pause image (the pod sandbox): a static C program compiled with the host's gcc;
- `localhost/deepres-test/busybox:1`: Debian's busybox-static with its applets linked, a shell for
  test pods;
- the project's own images (`deepres/agent`, `deepres/extender` at the chart's appVersion), built by
  deploy/build-images.sh with buildah, then `buildah push ... oci-archive:` and imported under the
  names the chart uses (`docker.io/deepres/agent:0.1.0`, which is what `deepres/agent:0.1.0` means).

The first two are OCI image layouts written by hand (one uncompressed layer, config, manifest,
index) into a tar, cached under ~/.cache/deepres-cluster/images by their inputs. An image is
imported only when containerd lacks it or holds another build (the label `deepres.io/source`).
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devtools.localcluster import REPO, cache_dir

PAUSE_IMAGE = "localhost/deepres/pause:3.10"
BUSYBOX_IMAGE = "localhost/deepres-test/busybox:1"
SOURCE_LABEL = "deepres.io/source"
BUSYBOX = Path("/bin/busybox")
#: the project images as deploy/build_images.py tags them in buildah's storage ({tag}: pyproject's version)
PROJECT_IMAGES = {"agent": "localhost/deepres/{kind}:{tag}", "extender": "localhost/deepres/{kind}:{tag}"}

# The sandbox's one process: sleeps until told to stop, reaps the zombies of its PID namespace
# (as Kubernetes' own pause.c does).
PAUSE_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) { puts("deepres pause 3.10"); return 0; }
    if (getpid() != 1) fprintf(stderr, "pause: not PID 1\n");
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = stop;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    act.sa_handler = reap;
    act.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &act, NULL);
    for (;;) pause();
    return 1;
}
"""


class ImageError(RuntimeError):
    """An image could not be made or imported; the message says which and why."""


class ImagesUnavailable(ImageError):
    """The project's images cannot be built on this machine (no root, buildah cannot run); one line why."""


def go_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def images_cache() -> Path:
    path = cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------
# OCI archives by hand


@dataclass(frozen=True)
class Entry:
    """One member of a layer: a regular file (data, mode), a folder, or a symlink (target)."""

    path: str
    data: bytes | None = None
    mode: int = 0o755
    link: str = ""


def _layer(entries: Iterable[Entry]) -> bytes:
    """A reproducible uncompressed layer tar (owner root, mtime 0, entries in order)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mtime, info.uid, info.gid, info.mode = 0, 0, 0, entry.mode
            if entry.link:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest, len(data)


def write_oci_archive(path: Path, name: str, entries: list[Entry], config: dict[str, object],
                      source: str) -> str:
    """An OCI image layout tar at `path` holding one single-layer image named `name` (a full
    reference, e.g. localhost/x/y:1); `config` is the image config's `config` part. Returns the
    manifest digest."""
    blobs: dict[str, bytes] = {}
    layer_digest, layer_size = _blob(blobs, _layer(entries))
    image_config = {
        "architecture": go_arch(), "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": f"devtools/nodeimages.py ({source})"}],
    }
    config_digest, config_size = _blob(blobs, json.dumps(image_config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                    "size": layer_size}],
    }
    manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                       "size": manifest_size, "platform": {"architecture": go_arch(), "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
    }
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps(index, sort_keys=True).encode()}
    files.update({f"blobs/sha256/{digest.split(':', 1)[1]}": data for digest, data in blobs.items()})
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(path)
    return manifest_digest


def _inputs_key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def pause_archive() -> tuple[Path, str]:
    """The pause image's archive (built now unless cached) and its source key."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ImageError("gcc not found: the pause image is compiled here (apt-get install gcc libc6-dev)")
    gcc_version = subprocess.run([gcc, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    key = _inputs_key(PAUSE_C.encode(), gcc_version.encode(), go_arch().encode(), b"recipe 1")
    archive = images_cache() / f"pause-{key}.tar"
    if archive.is_file():
        return archive, key
    with tempfile.TemporaryDirectory(prefix="pause-") as tmp:
        source, binary = Path(tmp) / "pause.c", Path(tmp) / "pause"
        source.write_text(PAUSE_C)
        built = subprocess.run([gcc, "-Os", "-static", "-s", "-Wall", "-o", str(binary), str(source)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise ImageError(f"compiling pause (gcc -static) failed: {built.stderr.strip()[-500:]} "
                             "(apt-get install libc6-dev)")
        write_oci_archive(archive, PAUSE_IMAGE, [Entry("pause", binary.read_bytes())],
                          {"Entrypoint": ["/pause"], "User": "65535:65535"}, f"pause {key}")
    return archive, key


def busybox_archive() -> tuple[Path, str]:
    """The test image: /bin/busybox from Debian's busybox-static, every applet linked in /bin."""
    if not BUSYBOX.is_file():
        raise ImageError(f"{BUSYBOX} not found: apt-get install busybox-static")
    binary = BUSYBOX.read_bytes()
    key = _inputs_key(binary, b"recipe 1")
    archive = images_cache() / f"busybox-{key}.tar"
    if archive.is_file():
        return archive, key
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    entries = [Entry("bin", None), Entry("bin/busybox", binary), Entry("etc", None), Entry("tmp", None, 0o1777),
               Entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644),
               Entry("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)]
    entries += [Entry(f"bin/{applet}", link="busybox") for applet in sorted(set(applets)) if applet != "busybox"]
    write_oci_archive(archive, BUSYBOX_IMAGE, entries,
                      {"Cmd": ["sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
                      f"busybox {key}")
    return archive, key


# ----------------------------------------------------------------------------------------------
# containerd


@dataclass(frozen=True)
class Containerd:
    """`ctr` against one containerd (its socket), in the kubelet's namespace."""

    address: Path
    namespace: str = "k8s.io"

    def ctr(self, *args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.address), "--namespace", self.namespace, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise ImageError(f"{' '.join(argv[5:])} failed: {done.stderr.strip()[-800:]}")
        return done

    def image_labels(self) -> dict[str, dict[str, str]]:
        """Every image's name -> its labels."""
        out: dict[str, dict[str, str]] = {}
        lines = self.ctr("images", "list").stdout.splitlines()
        for line in lines[1:]:
            fields = line.split()
            if not fields:
                continue
            labels = {}
            if "=" in fields[-1]:
                for pair in fields[-1].split(","):
                    key, _, value = pair.partition("=")
                    labels[key] = value
            out[fields[0]] = labels
        return out

    def has(self, name: str, source: str) -> bool:
        return self.image_labels().get(name, {}).get(SOURCE_LABEL) == source

    def import_archive(self, archive: Path, names: list[str], source: str) -> None:
        """Import `archive` (whose image is named names[0], by its io.containerd.image.name annotation
        or its org.opencontainers.image.ref.name); tag it also as names[1:]; label all `source`."""
        self.ctr("images", "import", "--base-name", names[0].rsplit(":", 1)[0], str(archive))
        for alias in names[1:]:
            self.ctr("images", "rm", alias, check=False)
            self.ctr("images", "tag", names[0], alias)
        for name in names:
            self.ctr("images", "label", name, f"{SOURCE_LABEL}={source}")


def import_node_images(containerd: Containerd, log: Callable[[str], None] | None = None) -> list[str]:
    """The pause and busybox images into containerd (built or taken from the cache; imported only
    when containerd lacks that build). Returns their names."""
    names = []
    for make, name in ((pause_archive, PAUSE_IMAGE), (busybox_archive, BUSYBOX_IMAGE)):
        archive, key = make()
        if not containerd.has(name, key):
            containerd.import_archive(archive, [name], key)
            if log:
                log(f"imported {name}")
        names.append(name)
    return names


# ----------------------------------------------------------------------------------------------
# the project's images


def project_tag() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def chart_image_refs(tag: str | None = None) -> dict[str, str]:
    """kind -> the reference the chart's pods use (helm/deepres/values.yaml: `deepres/<kind>`, tag the
    chart's appVersion), normalised as containerd stores it."""
    tag = tag or project_tag()
    return {kind: f"docker.io/deepres/{kind}:{tag}" for kind in PROJECT_IMAGES}


def project_source_key() -> str:
    """A hash of what the images are built from: deploy/Dockerfile.* and their ignore files,
    deploy/build_images.py and the build context (pyproject.toml, constraints.txt, README.md,
    extender/, predictor/ as git sees them, tracked or not)."""
    inputs = ["pyproject.toml", "constraints.txt", "README.md", "extender", "predictor", "deploy/Dockerfile.agent",
              "deploy/Dockerfile.extender", "deploy/Dockerfile.agent.dockerignore",
              "deploy/Dockerfile.extender.dockerignore", "deploy/build_images.py"]
    done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", *inputs], cwd=REPO,
                          capture_output=True)
    if done.returncode == 0:
        listed = done.stdout.decode().split("\0")
    else:  # not a git checkout: every file
        listed = [str(p.relative_to(REPO)) for name in inputs for p in [REPO / name, *(REPO / name).rglob("*")]]
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, listed))):
        path = REPO / name
        if "__pycache__" in path.parts or name.endswith(".pyc") or not path.is_file():
            continue
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _buildah_image_id(name: str) -> str | None:
    done = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
                          capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def build_project_images(log: Callable[[str], None] | None = None, *, timeout_s: float = 3600) -> Path:
    """deploy/build-images.sh --no-smoke (buildah; minutes when the base or the sources changed),
    its report written under the cache, never over reports/images.json. Returns the report's path."""
    report = images_cache() / "build-report.json"
    if log:
        log("building the deepres images with deploy/build-images.sh --no-smoke (minutes the first time)")
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "deploy" / "build-images.sh"), "--no-smoke", "--report", str(report)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ImageError(f"deploy/build-images.sh failed: {(done.stdout + done.stderr).strip()[-1500:]}")
    result = json.loads(report.read_text())
    if result.get("skipped"):
        raise ImagesUnavailable(f"deploy/build-images.sh built nothing: {result['skipped']}")
    for kind in PROJECT_IMAGES:
        if not result[kind].get("built"):
            raise ImageError(f"deploy/build-images.sh did not build {kind}: {result[kind].get('error')}")
    if log:
        log(f"built the deepres images in {time.monotonic() - started:.0f}s")
    return report


def import_project_images(containerd: Containerd, log: Callable[[str], None] | None = None, *,
                          build: bool = True) -> dict[str, str]:
    """The chart's own images (`deepres/agent`, `deepres/extender` at the project's version) into the
    real node's containerd, so the chart's pods start there without a pull. Built first with
    deploy/build-images.sh when the sources changed since the images containerd holds (`build=False`:
    take whatever buildah holds, and fail when it holds none). Cached: when containerd already holds
    images built from the same sources, this returns in about a second. Returns kind -> the reference
    imported (`docker.io/deepres/agent:0.1.0`; also tagged `localhost/deepres/agent:0.1.0`)."""
    tag = project_tag()
    refs = chart_image_refs(tag)
    key = project_source_key()
    if all(containerd.has(ref, key) for ref in refs.values()):
        return refs
    if shutil.which("buildah") is None and not build:
        raise ImagesUnavailable("buildah not found: `make images` (deploy/build-images.sh) builds the deepres images")
    # build_images.py rebuilds both images on every run: build only when buildah's images are not
    # the ones these sources make (recorded in a stamp next to the cache)
    stamp = images_cache() / "project-images.json"
    built_from = json.loads(stamp.read_text()) if stamp.is_file() else {}
    local = {kind: PROJECT_IMAGES[kind].format(kind=kind, tag=tag) for kind in PROJECT_IMAGES}
    ids = {kind: (_buildah_image_id(name) if shutil.which("buildah") else None) for kind, name in local.items()}
    if build and (built_from.get("key") != key or built_from.get("ids") != ids or not all(ids.values())):
        build_project_images(log)
        ids = {kind: _buildah_image_id(name) for kind, name in local.items()}
        stamp.write_text(json.dumps({"key": key, "ids": ids}))
    missing = [name for kind, name in local.items() if not ids.get(kind)]
    if missing:
        raise ImageError(f"buildah holds no {', '.join(missing)}: `make images` builds them")
    for kind, name in local.items():
        import_buildah_image(containerd, name, [refs[kind]], key)
        if log:
            log(f"imported {refs[kind]} (and {name})")
    return refs


def import_buildah_image(containerd: Containerd, name: str, aliases: list[str], source: str) -> None:
    """Image `name` (NAME:TAG) from buildah's storage into containerd: `buildah push` to an OCI archive,
    `ctr images import`, tagged also as each of `aliases`, all labelled `source`."""
    tag = name.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory(prefix="deepres-oci-", dir=images_cache()) as tmp:
        archive = Path(tmp) / "image.tar"
        # uncompressed: nothing gzips a layer that containerd unpacks again at once
        pushed = subprocess.run(["buildah", "push", "--quiet", "--disable-compression", name,
                                 f"oci-archive:{archive}:{tag}"], capture_output=True, text=True, timeout=900)
        if pushed.returncode != 0:
            raise ImageError(f"buildah push {name} failed: {pushed.stderr.strip()[-800:]}")
        containerd.ctr("images", "rm", name, *aliases, check=False)
        containerd.import_archive(archive, [name, *aliases], source)

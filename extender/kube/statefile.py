"""The local-mode state file (`--no-kube --state-file`): the only record of what is bound there.

In local mode no API server keeps the pods' Bindings, so this file is what a restarted extender
rebuilds its reservations from. Hence four rules:

- Written atomically: the whole file is written to a temporary file in the same directory, flushed
  and fsync'ed, renamed over the old one, and the directory fsync'ed. A crash or a full disk leaves
  the old file or the new one, never a mix; `write` raises OSError when any step fails, and the
  caller (a bind) then fails instead of reporting success.
- Checked when read: the file carries its format, a version and the sha256 of its canonical payload
  (`{"format": "deepres-bound-pods", "version": 2, "sha256": ..., "pods": [...]}`); every pod is
  checked for the fields a restart needs. A file that is truncated, altered, malformed, unreadable
  or not a file raises `StateFileDamaged` with the reason: never an empty start.
- Never silently replaced: a damaged file is copied aside (`keep_aside`, content-addressed so a
  crash loop does not fill the disk) and left in place; only the admin's `state_file_reset` moves it
  aside (`move_aside`) so that the extender starts empty.
- Never through a link: a state file that is a symbolic link is refused at start (a write replaces
  the link with a file and the target keeps none of the binds); temporaries are created with O_EXCL
  (and O_NOFOLLOW), so a link planted at their name is never followed; temporaries a killed write left
  are removed at start (`remove_temporaries`). The version is an integer (`true` is not 1).

Version 1 files (`{"pods": [...]}`, before the checksum) are read when every pod checks out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from extender.protocol import ProtocolError, parse_pod

FORMAT = "deepres-bound-pods"
VERSION = 2
#: The file name a damaged state file is copied or moved to: `<name>.damaged-<what>`.
DAMAGED_SUFFIX = ".damaged-"


class StateFileDamaged(Exception):
    """The state file exists and cannot be used; `reason` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"state file {path}: {reason}")


def canonical(pods: Sequence[Mapping[str, Any]]) -> bytes:
    """The checksummed payload: the pods as JSON with sorted keys and no spaces."""
    return json.dumps(list(pods), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode(pods: Sequence[Mapping[str, Any]]) -> bytes:
    payload = canonical(pods)
    digest = hashlib.sha256(payload).hexdigest()
    head = json.dumps({"format": FORMAT, "version": VERSION, "sha256": digest})
    # the pods' canonical bytes go in verbatim, so the checksum is over exactly what is on disk
    return head[:-1].encode() + b', "pods": ' + payload + b"}\n"


def decode(path: Path, data: bytes) -> list[dict[str, Any]]:
    """The bound pods in `data` (the file at `path`); raises StateFileDamaged."""
    try:
        saved = json.loads(data)
    except (UnicodeDecodeError, ValueError) as err:
        size = len(data)
        raise StateFileDamaged(path, f"not valid JSON ({err}; {size} bytes: truncated or overwritten?)") from None
    if not isinstance(saved, dict):
        raise StateFileDamaged(path, f"must be a JSON object, got {type(saved).__name__}")
    pods = saved.get("pods")
    if not isinstance(pods, list):
        raise StateFileDamaged(path, f"'pods' must be a list, got {type(pods).__name__}")
    version = saved.get("version", 1)
    if type(version) is not int:  # not isinstance: `true` is a bool, and a bool is an int
        raise StateFileDamaged(path, f"'version' must be an integer (1 or {VERSION}), got {json.dumps(version)[:40]}")
    if version == VERSION:
        if saved.get("format") != FORMAT:
            raise StateFileDamaged(path, f"'format' must be {FORMAT!r}, got {saved.get('format')!r}")
        digest = hashlib.sha256(canonical(pods)).hexdigest()
        if saved.get("sha256") != digest:
            raise StateFileDamaged(path, f"checksum mismatch (recorded {str(saved.get('sha256'))[:16]!r}, "
                                         f"content {digest[:16]!r}): the file was altered or partly written")
    elif version != 1:
        raise StateFileDamaged(path, f"format version {version!r} is not one this extender reads (1, {VERSION})")
    seen: set[tuple[str, str]] = set()
    for i, pod in enumerate(pods):
        problem = pod_problem(pod)
        if problem:
            raise StateFileDamaged(path, f"pods[{i}]: {problem}")
        try:  # the parser the restart reads it with: a pod it refused would be skipped, its GPUs freed
            parse_pod(pod, f"pods[{i}]")
        except ProtocolError as err:
            raise StateFileDamaged(path, str(err)) from None
        meta = pod["metadata"]
        key = (str(meta.get("namespace") or "default"), meta["name"])
        if key in seen:
            raise StateFileDamaged(path, f"pods[{i}]: pod {key[0]}/{key[1]} is listed twice")
        seen.add(key)
    return pods


def pod_problem(pod: Any) -> str:
    """What makes `pod` unusable as a bound pod of the state file ("" when nothing)."""
    if not isinstance(pod, dict):
        return f"must be an object, got {type(pod).__name__}"
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return f"metadata must be an object, got {type(meta).__name__}"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return f"metadata.name must be a non-empty string, got {name!r}"[:200]
    for key in ("namespace", "uid"):
        if key in meta and not isinstance(meta[key], str):
            return f"metadata.{key} must be a string, got {type(meta[key]).__name__}"
    annotations = meta.get("annotations", {})
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        return "metadata.annotations must be an object of strings"
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return f"spec must be an object, got {type(spec).__name__}"
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return f"spec.nodeName must be a non-empty string (a bound pod), got {node!r}"[:200]
    status = pod.get("status", {})
    if not isinstance(status, dict):
        return f"status must be an object, got {type(status).__name__}"
    return ""


def read(path: Path) -> list[dict[str, Any]] | None:
    """The bound pods in the file; None when there is no file (a first start). Raises StateFileDamaged
    for anything else that is not a good state file (a directory, unreadable, damaged)."""
    if path.is_symlink():
        to = "to nothing (" if not path.exists() else "(to "
        raise StateFileDamaged(path, f"is a symbolic link {to}{os.readlink(path)}): each write replaces the file, "
                                     "which would turn the link into a file and leave its target behind; give "
                                     "--state-file the real path")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise StateFileDamaged(path, "is a directory, not a file") from None
    except OSError as err:
        raise StateFileDamaged(path, f"cannot be read ({err.strerror or err})") from None
    return decode(path, data)


def write(path: Path, pods: Sequence[Mapping[str, Any]]) -> int:
    """Replace the file with `pods`, atomically and durably; its size in bytes. Raises OSError (nothing
    replaced)."""
    data = encode(pods)
    write_atomically(path, data)
    return len(data)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a temporary file beside it, fsync'ed, renamed over it, the folder
    fsync'ed. Raises OSError (nothing replaced, no temporary file left)."""
    directory = path.parent
    # mkstemp opens with O_CREAT | O_EXCL (a link planted at the name fails the open, never is followed)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (the new name is in the directory's own blocks)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keep_aside(path: Path) -> Path | None:
    """Copy a damaged file to `<path>.damaged-<sha256 prefix>` (once per content: a crash loop does not
    fill the disk) and leave it in place; None when there is nothing to copy (a directory). Raises
    OSError when the copy fails."""
    if not path.is_file():
        return None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    copy = path.with_name(path.name + DAMAGED_SUFFIX + digest)
    if not copy.exists():
        tmp = copy.with_name("." + copy.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a stale one, or a link planted there: unlink removes the name, never its target
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(path.read_bytes())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, copy)
    return copy


def remove_temporaries(path: Path) -> list[Path]:
    """Delete what a killed write left beside `path` (`.<name>.*.tmp`, from `write` and `keep_aside`); the
    names removed. Links are removed as names, never followed. Raises nothing: what cannot be removed stays."""
    removed = []
    for tmp in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        try:
            os.unlink(tmp)
        except OSError:
            continue
        removed.append(tmp)
    return removed


def glob_escape(name: str) -> str:
    """`name` with the glob metacharacters escaped."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def move_aside(path: Path, now: datetime | None = None) -> Path:
    """Rename a damaged file (or directory) to `<path>.damaged-<UTC time>` so a new one can be
    written; never over an existing name. Raises OSError."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(path.name + DAMAGED_SUFFIX + stamp)
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{n}")
    os.rename(path, target)
    fsync_directory(path.parent)
    return target

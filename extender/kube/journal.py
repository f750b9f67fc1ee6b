"""The state file's journal (`<state file>.journal`): a bind costs one appended line, not the whole file.

Rewriting the whole state file at each bind (extender/kube/statefile.py) cost about 1 s per bind at
100,000 bound pods. Each change is now one line appended to the journal and fsync'ed before the bind
answers (`Journal.append`); the file is rewritten only when the journal has grown past the file's own
size (or `COMPACT_MIN_BYTES`), so a write costs the change, amortised. The rules of the state file hold:

- Durable before done: `append` raises OSError when the line is not on disk, and cuts the journal back
  to what it was (or, when even that fails, marks it `broken`: the next change rewrites the file).
- A torn last line (a crash in the middle of an append, never answered done) is ignored; any other
  line that is not a well-formed record with its own sha256 makes the state file damaged.
- Order-safe compaction: the file is rewritten first, the journal emptied second. A crash between
  them replays the old journal over a file that already holds it, which changes nothing: each record
  sets a pod to its full value or removes it, so replaying records over a state that already ends
  with them gives that state again.
- Never through a link: the journal is opened with O_NOFOLLOW; a journal that is a link is refused.

A line is `{"op": "put", "pod": {...}, "sha256": ...}` or `{"op": "del", "key": [namespace, name],
"sha256": ...}`, the sha256 over the record's canonical JSON without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.kube.statefile import StateFileDamaged, fsync_directory, pod_problem
from extender.protocol import ProtocolError, parse_pod

SUFFIX = ".journal"
#: The journal is folded into the state file once it is larger than the file or than this.
COMPACT_MIN_BYTES = 1 << 20


def path_of(state: Path) -> Path:
    return state.with_name(state.name + SUFFIX)


def key_of(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod["metadata"]
    return str(meta.get("namespace") or "default"), str(meta["name"])


def record(pod: Mapping[str, Any] | None, key: tuple[str, str]) -> bytes:
    """The journal line setting `key` to `pod` (None: removing it)."""
    body: dict[str, Any] = {"op": "put", "pod": pod} if pod is not None else {"op": "del", "key": list(key)}
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    return _canonical({**body, "sha256": digest}) + b"\n"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def replay(state: Path, pods: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """(`pods` with the journal beside `state` applied, the journal's size in bytes); raises
    StateFileDamaged naming the journal and the line."""
    path = path_of(state)
    if path.is_symlink():
        raise StateFileDamaged(path, f"is a symbolic link (to {os.readlink(path)}); the journal is never "
                                     "read or written through a link")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return pods, 0
    except OSError as err:
        raise StateFileDamaged(path, f"cannot be read ({err.strerror or err})") from None
    by_key = {key_of(p): p for p in pods}
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        last = i >= len(lines) - 2 and not any(lines[i + 1:])  # nothing but a torn write after it
        try:
            key, pod = _parse(line)
        except ValueError as err:
            if last:
                break  # a crash in the middle of this append: it was never answered done
            raise StateFileDamaged(path, f"journal {path.name} line {i + 1}: {err}") from None
        if pod is None:
            by_key.pop(key, None)
        else:
            by_key[key] = pod
    return list(by_key.values()), len(data)


def _parse(line: bytes) -> tuple[tuple[str, str], dict[str, Any] | None]:
    try:
        saved = json.loads(line)
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not a JSON record") from None
    if not isinstance(saved, dict):
        raise ValueError("not a JSON object")
    digest = saved.pop("sha256", None)
    if digest != hashlib.sha256(_canonical(saved)).hexdigest():
        raise ValueError("checksum mismatch: the journal was altered or partly written")
    op = saved.get("op")
    if op == "put":
        pod = saved.get("pod")
        problem = pod_problem(pod)
        if problem or not isinstance(pod, dict):
            raise ValueError(f"pod: {problem}")
        try:
            parse_pod(pod, "pod")
        except ProtocolError as err:
            raise ValueError(str(err)) from None
        return key_of(pod), pod
    key = saved.get("key")
    if op == "del" and isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key):
        return (key[0], key[1]), None
    raise ValueError("not a put or del record")


class Journal:
    """Appends to the journal beside a state file; `size` is what is on disk now."""

    def __init__(self, state: Path, size: int) -> None:
        self.path = path_of(state)
        self.size = size
        self.broken = False  # a failed append could not be cut back: the next change rewrites the file

    def append(self, line: bytes) -> None:
        """Append `line` durably; raises OSError with the journal as it was (or `broken`)."""
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                if created:
                    fsync_directory(self.path.parent)
            except OSError:
                try:
                    os.ftruncate(fd, self.size)
                    os.fsync(fd)
                except OSError:
                    self.broken = True
                raise
            self.size += len(line)
        finally:
            os.close(fd)

    def emptied(self) -> None:
        """After the state file was rewritten with every pod: empty the journal (best effort: a journal
        left as it was replays to the same state, see the module's rules)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            self.size, self.broken = 0, False
            return
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.fsync(fd)
            self.size, self.broken = 0, False
        os.close(fd)

    def wants_compaction(self, state_bytes: int) -> bool:
        return self.broken or self.size > max(COMPACT_MIN_BYTES, state_bytes)


def fold(state: Path) -> list[dict[str, Any]]:
    """Fold the journal into the state file (the file rewritten with every pod, the journal emptied), as
    an extender does once the journal outgrows the file; the pods. Raises StateFileDamaged or OSError."""
    from extender.kube import statefile

    pods, size = replay(state, statefile.read(state) or [])
    statefile.write(state, pods)
    Journal(state, size).emptied()
    return pods

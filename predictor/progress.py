"""Progress and the time left for long work (dataset, train, evaluate, profile, simulate, the benches).

One wrapper around tqdm (a well-kept library, pure Python: fine in the serving install): a bar with an
estimate of the time left on stderr when stderr is a terminal; nothing at all when it is not (a log file,
CI, a pipe) or when the command was asked for `--json` (`deepres` calls `silence()` then), so machine
output stays machine output. Lives in the predictor, which imports nothing from the extender, so that
every command can use it.

Log lines go through `say()`: above the bars while any is drawn (tqdm.write), plain stderr lines
otherwise (a log file keeps every line). Work in other processes sends its lines to the parent, which
says them (a child's own write to stderr would tear the bar).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

_silenced = False
_open = 0  # bars drawn now in this process


def say(line: str, stream: TextIO | None = None) -> None:
    """One log line on stderr (or `stream`: stdout for a command's output), above the bars while any is drawn."""
    out = stream or sys.stderr
    if _open:
        from tqdm import tqdm

        tqdm.write(line, file=out)
        out.flush()
    else:
        print(line, file=out, flush=True)


def silence(value: bool = True) -> None:
    """No bars from now on (set once by `deepres` for `--json`)."""
    global _silenced
    _silenced = value


def shown() -> bool:
    """Whether a bar would be drawn now: not silenced, and stderr is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not _silenced and bool(isatty and isatty())


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """items, one by one, with a bar and the time left on a terminal; just items otherwise."""
    if not shown():
        yield from items
        return
    from tqdm import tqdm

    global _open
    if total is None and isinstance(items, Sized):
        total = len(items)
    _open += 1
    try:
        with tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr, dynamic_ncols=True,
                  leave=False) as bar:
            yield from bar
    finally:
        _open -= 1


class Bar:
    """A bar advanced by hand (for work reported through a callback): `with Bar(total, desc) as bar:
    bar.advance(note="loss 0.12")`; draws nothing where `progress` would draw nothing."""

    def __init__(self, total: int, desc: str, unit: str = "it") -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self._bar: Any = None

    def __enter__(self) -> Bar:
        return self.open()

    def open(self) -> Bar:
        """Start drawing (where a bar is shown); `close()` ends it (or use `with`)."""
        global _open
        if shown() and self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, file=sys.stderr,
                             dynamic_ncols=True, leave=False)
            _open += 1
        return self

    def advance(self, steps: int = 1, note: str = "") -> None:
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(steps)

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def close(self) -> None:
        global _open
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            _open -= 1

    def __exit__(self, *exc: object) -> None:
        self.close()

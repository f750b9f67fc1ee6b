"""The one reader of numbers that users write (pod annotations, `/v1/predict`, the state file's pods).

Python's `float()` and `int()` take far more than an annotation should mean: `int("²")` passes
`str.isdigit()` and then raises, `float("٣")` is 3.0, `float("1_0")` is 10.0, `float("1e400")` is
inf, and `int()` of 5,000 digits raises past the interpreter's digit limit. Each of those once
reached a path that only caught the parser's own error (a 500 on `/v1/predict`, an "internal error"
on `/filter`, a restore after a restart that never finished). Every numeric annotation value goes
through `read_number` / `read_whole` here, which raise `ValueError` for anything but a short,
finite, plain ASCII decimal; the callers turn that into an error naming the key, the value and
what is accepted.
"""

from __future__ import annotations

import math
import re

#: The longest numeric value read (characters, after trimming blanks). Every accepted number fits in
#: far fewer (`0.000001`, `20000000`, `3e-4`); longer values are typos or attacks.
NUMBER_MAX_CHARS = 32
#: Said after "a number" / "a whole number" in the errors.
SPELLING = f"plain ASCII decimal, e.g. 32, 67.9 or 3e-4, at most {NUMBER_MAX_CHARS} characters"

_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)
_BLANKS = " \t\r\n"


def read_number(text: str) -> float:
    """`text` as a finite float: optional sign, ASCII digits, optional fraction and exponent, at most
    NUMBER_MAX_CHARS characters once leading and trailing ASCII blanks are cut. Raises ValueError
    (non-ASCII digits, underscores, `nan`, `inf`, an overflow such as `1e400`, too long)."""
    if not isinstance(text, str):
        raise ValueError(f"not a string: {type(text).__name__}")
    value = text.strip(_BLANKS)
    if len(value) > NUMBER_MAX_CHARS or not _NUMBER.fullmatch(value):
        raise ValueError(f"not a plain decimal number: {value[:NUMBER_MAX_CHARS]!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def read_whole(text: str) -> int:
    """`text` as an int: a `read_number` with no fractional part (`32`, `32.0` and `3.2e1` are 32)."""
    number = read_number(text)
    if number != math.floor(number):
        raise ValueError(f"not a whole number: {text.strip(_BLANKS)!r}")
    return int(number)


def ascii_digits(text: str, max_chars: int = 19) -> bool:
    """True when `text` is 1..max_chars ASCII digits and nothing else: the check for a header value or
    a port before `int()` (`str.isdigit()` alone passes "²", on which `int()` then raises)."""
    return 0 < len(text) <= max_chars and text.isascii() and text.isdigit()

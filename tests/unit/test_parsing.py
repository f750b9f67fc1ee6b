"""predictor/parsing.py: the strict readers every user-written number goes through."""

from __future__ import annotations

import pytest

from predictor.parsing import ascii_digits, read_number, read_whole


@pytest.mark.parametrize("text", ["\u00b2", "\u2460", "\u0663", "1_0", "nan", "inf", "1e400", "9" * 5000, "", " "])
def test_unicode_digits_and_unbounded_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        read_number(text)


@pytest.mark.parametrize(("text", "value"), [("32", 32), ("32.0", 32), ("3.2e1", 32), (" 7 ", 7)])
def test_plain_decimals_are_read(text: str, value: int) -> None:
    assert read_whole(text) == value


@pytest.mark.parametrize(("text", "ok"), [("8888", True), ("\u00b2", False), ("\u0663", False), ("", False),
                                          ("9" * 20, False), ("-1", False), ("12a", False)])
def test_ascii_digits_is_what_int_can_read(text: str, ok: bool) -> None:
    assert ascii_digits(text) is ok
    if ok:
        int(text)

"""extender/server/connections.py: the connection cap follows the open-files limit."""

from __future__ import annotations

import resource

import pytest

from extender.server import connections


def test_the_soft_limit_is_raised_toward_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"soft": 1024, "hard": 524_288}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits["soft"], limits["hard"]))

    def setrlimit(which: int, values: tuple[int, int]) -> None:
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert connections.connection_cap(8192) == 8192
    assert limits["soft"] == 8192 + connections.FD_RESERVE  # containerd 2's soft 1,024 is not enough


def test_the_cap_is_lowered_to_what_the_hard_limit_allows(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 2048))
    monkeypatch.setattr(resource, "setrlimit", lambda which, values: None)
    assert connections.connection_cap(8192) == 2048 - connections.FD_RESERVE
    assert "max_connections=8192 lowered" in caplog.text

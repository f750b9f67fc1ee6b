"""The plain-WSGI layer in front of Flask: body reading, method and size rules, bugs contained."""

from __future__ import annotations

import io
import logging
from typing import Any

import orjson
import pytest

from extender.kube.local import InMemoryCluster
from extender.server.app import create_app, extender_of
from extender.server.wsgi_verbs import BadRequest, BodyTooLarge, read_body
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, extender_args, node, pod, report

TOKEN = "t0ken"


class Chunks(io.RawIOBase):
    """A request stream that hands out a body in small pieces, as a chunked upload arrives."""

    def __init__(self, data: bytes, piece: int = 7) -> None:
        self.data, self.piece = data, piece

    def read(self, size: int = -1) -> bytes:
        n = self.piece if size < 0 else min(size, self.piece)
        out, self.data = self.data[:n], self.data[n:]
        return out


def call(app: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         *, chunked: bool = False) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "REMOTE_ADDR": "127.0.0.1", "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO(),
        "wsgi.input": Chunks(body) if chunked else io.BytesIO(body), "CONTENT_TYPE": "application/json",
    }
    if chunked:
        environ["wsgi.input_terminated"] = True
    else:
        environ["CONTENT_LENGTH"] = str(len(body))
    for key, value in (headers or {}).items():
        environ["HTTP_" + key.upper().replace("-", "_")] = value
    seen: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"], seen["headers"] = status, dict(response_headers)

    data = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], data


@pytest.fixture()
def app() -> Any:
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    settings.server.max_body_bytes = 8_000
    settings.telemetry.telemetry_max_bytes = 1_500
    return create_app(settings, predictor=FormulaPredictor(), clock=lambda: 1_800_000_000.0,
                      cluster=InMemoryCluster())


def test_read_body_declared_chunked_and_unterminated() -> None:
    assert read_body({"CONTENT_LENGTH": "5", "wsgi.input": io.BytesIO(b"hello+more")}, 10) == b"hello"
    assert read_body({"CONTENT_LENGTH": "0", "wsgi.input": io.BytesIO(b"x")}, 10) == b""
    with pytest.raises(BodyTooLarge, match="larger than 10 bytes"):
        read_body({"CONTENT_LENGTH": "11", "wsgi.input": io.BytesIO(b"")}, 10)  # refused before reading
    with pytest.raises(BadRequest, match="not a number"):
        read_body({"CONTENT_LENGTH": "ten", "wsgi.input": io.BytesIO(b"")}, 10)
    chunked = {"wsgi.input": Chunks(b"x" * 30), "wsgi.input_terminated": True}
    assert read_body(chunked, 30) == b"x" * 30
    with pytest.raises(BodyTooLarge):
        read_body({"wsgi.input": Chunks(b"x" * 31), "wsgi.input_terminated": True}, 30)
    # no length and no end marker: reading could block for ever, so the body is empty (as in werkzeug)
    assert read_body({"wsgi.input": io.BytesIO(b"{}")}, 30) == b""


def test_chunked_filter_is_answered(app: Any) -> None:
    sent = orjson.dumps(report("n1", 1, 1_800_000_000.0, [(16000.0, 0.0)]))
    status, _, _ = call(app, "POST", "/v1/telemetry", sent, {"Authorization": f"Bearer {TOKEN}"}, chunked=True)
    assert status.startswith("200")
    body = orjson.dumps(extender_args(pod("p", CNN_ANNOTATIONS), ["n1", "n2"]))
    status, headers, data = call(app, "POST", "/filter", body, chunked=True)
    out = orjson.loads(data)
    assert status.startswith("200") and headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == str(len(data))
    assert out["NodeNames"] == ["n1"] and out["FailedAndUnresolvableNodes"] == {}  # a node fits: no reasons
    status, _, data = call(app, "POST", "/filter", orjson.dumps(extender_args(pod("p", CNN_ANNOTATIONS), ["n2"])),
                           chunked=True)
    assert orjson.loads(data)["FailedAndUnresolvableNodes"] == {"n2": "no agent report"}


def test_full_node_objects_and_limits(app: Any) -> None:
    body = orjson.dumps(extender_args(pod("p", CNN_ANNOTATIONS), None, nodes=[node("n1")]))
    status, _, data = call(app, "POST", "/filter", body)
    assert status.startswith("200") and orjson.loads(data)["Nodes"] is not None
    status, _, data = call(app, "POST", "/filter", b" " * 8_001)
    assert status.startswith("413") and orjson.loads(data)["error"] == "request body larger than 8000 bytes"
    status, _, data = call(app, "POST", "/v1/telemetry", b" " * 1_501, {"Authorization": f"Bearer {TOKEN}"})
    assert status.startswith("413") and "1500 bytes" in orjson.loads(data)["error"]


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt", "/v1/telemetry"])
def test_wrong_method_is_405_with_allow(app: Any, path: str) -> None:
    status, headers, data = call(app, "GET", path)
    assert status.startswith("405") and headers["Allow"] == "POST"
    assert "use POST" in orjson.loads(data)["error"]


def test_other_routes_still_reach_flask(app: Any) -> None:
    status, _, data = call(app, "GET", "/healthz")
    assert status.startswith("200") and orjson.loads(data) == {"ok": True}
    status, _, _ = call(app, "GET", "/nope")
    assert status.startswith("404")


def test_a_bug_in_a_verb_is_contained_logged_and_counted(app: Any, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    ext = extender_of(app)

    def broken(*_: Any) -> Any:
        raise KeyError("oops")

    monkeypatch.setattr(ext.planner, "plan", broken)  # every verb plans through the planner
    body = orjson.dumps(extender_args(pod("p", CNN_ANNOTATIONS), ["n1"]))
    with caplog.at_level(logging.ERROR):
        status, _, data = call(app, "POST", "/filter", body)
    out = orjson.loads(data)
    assert status.startswith("200") and out["Error"].startswith("internal error (KeyError)")
    assert "Traceback" not in data.decode() and "unexpected error on POST /filter" in caplog.text
    status, _, data = call(app, "POST", "/prioritize", body)
    assert status.startswith("200") and orjson.loads(data) == []
    errors = ext.metrics.requests.labels("filter", "error")._value.get()
    assert errors == 1.0


def test_a_bug_in_telemetry_is_500_without_traceback(app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ext = extender_of(app)

    def broken(*_: Any) -> Any:
        raise RuntimeError("oops")

    monkeypatch.setattr(ext.state, "apply_report", broken)
    body = orjson.dumps(report("n1", 1, 1_800_000_000.0, [(16000.0, 0.0)]))
    status, _, data = call(app, "POST", "/v1/telemetry", body, {"Authorization": f"Bearer {TOKEN}"})
    assert status.startswith("500") and "Traceback" not in data.decode()
    assert orjson.loads(data)["error"].startswith("internal error (RuntimeError)")
    status, headers, _ = call(app, "POST", "/v1/telemetry", body)
    assert status.startswith("401") and headers["WWW-Authenticate"].startswith("Bearer")


def _verb_environ(remote: str, body: bytes, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"REQUEST_METHOD": "POST", "PATH_INFO": "/filter", "REMOTE_ADDR": remote, "SERVER_NAME": "test",
            "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
            "wsgi.errors": io.StringIO(), "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json", **(extra or {})}


def test_the_verb_caller_is_checked_once_and_cannot_be_marked_by_a_header(
        app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import extender.server.wsgi_verbs as wsgi_verbs

    checks: list[str] = []
    real = wsgi_verbs.verb_caller_refused

    def counting(environ: dict[str, Any], access: str) -> str:
        checks.append(str(environ.get("REMOTE_ADDR")))
        return real(environ, access)

    monkeypatch.setattr(wsgi_verbs, "verb_caller_refused", counting)
    routes = app.wsgi_app
    body = orjson.dumps(extender_args(pod("p", CNN_ANNOTATIONS), names=["gpu-a"]))
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen.append(status)

    # the RSGI bridge's way: refusal() before the body, then the app: one check
    environ = _verb_environ("127.0.0.1", body)
    assert routes.refusal(environ) is None
    b"".join(app(environ, start_response))
    assert seen[-1].startswith("200") and checks == ["127.0.0.1"]
    # gunicorn's way (no refusal() first): the app checks; a header named like the mark changes nothing
    checks.clear()
    environ = _verb_environ("10.1.2.3", body, {"HTTP_DEEPRES.CALLER_ADMITTED": "1"})
    b"".join(app(environ, start_response))
    assert seen[-1].startswith("403") and checks == ["10.1.2.3"]
    # refused by refusal(): nothing is marked, so the app refuses too
    environ = _verb_environ("10.1.2.3", body)
    assert routes.refusal(environ) is not None
    b"".join(app(environ, start_response))
    assert seen[-1].startswith("403")

"""The extender's Flask application: kube-scheduler's verbs, agent telemetry, predictions, probes.

`Extender` wires the verbs' glue, one module per concern under `extender.server` (each a `parts.Part`):
`planner` turns a pod into a PodRequest (annotations + prediction + observed peaks), `placing` answers
filter and prioritize, `binding` binds, `preemption` answers /preempt and evicts for pods that fit
nowhere, `intake` takes telemetry and the cluster's pod and node events, `readiness` says what the
verbs wait for after a start.
Each verb decodes, makes one call over the ledger (`extender.ledger`, the one home of learned state) and
the policy (`extender.policy`, pure rules), and encodes. The API server (`extender.kube.cluster`) is the
only truth about pods; a background worker (`extender.server.worker`) evicts and nudges off the request
path. The HTTP layers only move bytes: `wsgi_verbs.VerbRoutes` for the verbs and telemetry (all of the
traffic), the Flask routes in `create_app` for the rest. Bad input never yields a 5xx or a traceback:
the verbs answer HTTP 200 with `Error` set (what kube-scheduler expects), the other endpoints a 4xx.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from extender import annotations as ann
from extender.allocations import AllocationGate
from extender.annotations import AnnotationError
from extender.calibration_store import CalibrationStore
from extender.kube.cluster import Cluster, ClusterHandlers, KubeCluster, pod_meta
from extender.kube.local import InMemoryCluster
from extender.ledger import Ledger
from extender.policy import PodRequest
from extender.policy.columnar import Scores
from extender.policy.fragmentation import DemandMix
from extender.protocol import PodInfo
from extender.server.allocate import Allocator
from extender.server.auth import TelemetryAuth
from extender.server.binding import Binder
from extender.server.events import PodEvents
from extender.server.gpu_demand import CalibrationCollector, calibration_file, calibration_keeper
from extender.server.intake import Intake
from extender.server.metrics import CachedExposition, ExtenderMetrics, StateFileCollector
from extender.server.mutate import NotAReview, review_answer
from extender.server.openapi import openapi_document
from extender.server.parts import Parts
from extender.server.placing import Placer
from extender.server.planner import Plan, Planner, PredictorUnavailable
from extender.server.preemption import Preemptor
from extender.server.readiness import Readiness
from extender.server.worker import Worker
from extender.server.wsgi_verbs import (
    BadRequest,
    BodyTooLarge,
    VerbRoutes,
    decode_json,
    encode_json,
    read_body,
    stop_reading,
)
from extender.settings import Settings, describe, load_settings
from predictor.spec import DemandPredictor

log = logging.getLogger(__name__)
#: Longest GPU model name /v1/predict takes (NVML names are ~30 characters).
MAX_GPU_NAME = 256


def settle_heap() -> None:
    """Keep the cyclic garbage collector off the request path.

    A nodes-mode request parses ~0.4 MB of JSON into ~20,000 objects that live until the answer is
    sent, so with CPython's default thresholds (700, 10, 10) they are scanned and promoted several
    times per request, and full collections walk everything loaded at start (torch, the predictor):
    measured, the median nodes-mode pod took 11.7 ms in-process, 4.9 ms with the start-up heap
    frozen and 4.2 ms with higher thresholds as well (4.1 ms with no collector at all). The
    extender makes little cyclic garbage, so collecting it less often costs little memory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class Extender:
    """The verbs, wired: decoded requests in, policy calls over the ledger, API calls out.

    Two clocks: `clock` (wall, Unix seconds) for deadlines and priorities, `mono` (monotonic) for
    everything measured between two moments of this process (telemetry age, warm-ups, grace periods),
    so a wall clock step never makes a silent node look fresh.
    """

    def __init__(
        self,
        settings: Settings,
        predictor: DemandPredictor | None,
        cluster: Cluster,
        clock: Callable[[], float],
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self.params = settings.policy.params()
        self.ledger = Ledger(self.params, settings.policy.peak_store_size,
                             CalibrationStore(calibration_file(settings), monotonic,
                                              calibration_keeper(settings, cluster),
                                              settle_s=settings.policy.calibration_settle_s))
        self.state = self.ledger  # the name older callers use
        self.cluster = cluster
        self.clock = clock
        # an injected wall clock (tests) drives both, so tests move time with one hand
        self.mono = monotonic or (time.monotonic if clock is time.time else clock)
        self.merits = self.ledger.merits
        self.metrics = ExtenderMetrics(self.ledger, self.mono, self.merits)
        self.metrics.registry.register(StateFileCollector(cluster))
        self.metrics.registry.register(CalibrationCollector(self.ledger))
        self.local = settings.kube.no_kube
        self.token = settings.telemetry_token_value()
        k = settings.kube
        self.auth = TelemetryAuth(local=self.local, shared_token=self.token, reviewer=cluster,
                                  audience=k.token_audience, allowed_accounts=k.agent_service_accounts,
                                  cache_s=k.token_cache_s)
        self.worker = Worker()
        self.pod_events = PodEvents(cluster)
        self.events = self.pod_events.worker
        self.planner = Planner(settings, self.ledger, self.metrics)
        self.planner.predictor = predictor
        self.ready = Readiness(settings, self.planner, cluster, self.ledger, self.mono)
        self.gate = AllocationGate(self.mono)
        parts = Parts(settings, self.planner, self.ledger, cluster, self.metrics, self.ready, self.pod_events,
                      self.worker, clock, self.mono, self.gate)
        self.intake, self.preemptor, self.binder = Intake(parts), Preemptor(parts), Binder(parts)
        self.placer = Placer(parts, self.preemptor, self.intake)
        self.allocate = Allocator(parts).allocate  # the device plugin's handshake (/v1/allocate)
        # the verbs and intake: one call each into their module
        self.filter, self.prioritize, self.bind = self.placer.filter, self.placer.prioritize, self.binder.bind
        self.preempt, self.telemetry = self.preemptor.preempt, self.intake.telemetry
        self.on_pod_changed, self.on_pods_listed = self.intake.on_pod_changed, self.intake.on_pods_listed
        self.on_nodes_listed = self.intake.on_nodes_listed
        self.plan: Callable[[PodInfo, float], Plan] = self.planner.plan
        self.scores: Callable[[PodRequest, tuple[str, ...]], Scores] = self.planner.scores
        self._packing_mix: Callable[[PodRequest], DemandMix | None] = self.planner.packing_mix
        self._preempting: OrderedDict[str, float] = self.preemptor.preempting
        self.readiness: Callable[[], list[str]] = self.ready.waiting
        if self.local and not self.token:
            log.warning("no telemetry token configured: /v1/telemetry refuses every report "
                        "(set --telemetry-token-file or DEEPRES_TELEMETRY_TOKEN)")

    # ---- start-up ----
    def start(self) -> None:
        """Load the predictor (in the background unless given), then start the cluster watches: the
        first sync rebuilds reservations with the pods' priorities, which need the predictor."""
        self.ledger.calibration.start()  # its learner (off the request path) and its flush at shutdown
        if self.planner.predictor is not None:
            self.start_cluster()
        else:
            threading.Thread(target=self._load_predictor, name="deepres-predictor-load", daemon=True).start()

    def _load_predictor(self) -> None:
        try:
            factory = self.settings.predictor_factory
            if factory:
                module_name, _, attr = factory.partition(":")
                loaded = getattr(importlib.import_module(module_name), attr)()
            else:
                runtime: Any = importlib.import_module("predictor.runtime")
                loaded = runtime.Predictor.load(self.settings.predictor_path or None)
        except Exception as err:  # shown by /readyz; the verbs answer with Error meanwhile
            self.planner.predictor_error = f"{type(err).__name__}: {err}"
            log.error("predictor failed to load: %s", self.planner.predictor_error)
            return
        self.planner.predictor = loaded
        log.info("predictor loaded version=%s", getattr(loaded, "version", "?"))
        settle_heap()
        self.start_cluster()

    def start_cluster(self) -> None:
        self.cluster.start(ClusterHandlers(
            pod_changed=self.on_pod_changed, pods_listed=self.on_pods_listed,
            node_deleted=self.ledger.forget_node, nodes_listed=self.on_nodes_listed,
            node_added=self.ledger.node_added,
        ))

    @property
    def predictor_version(self) -> str:
        return self.planner.predictor_version

    def predict(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, {"error": "body must be a JSON object: a Pod, {\"annotations\": {...}} or JobSpec keys"}
        gpu, software = body.get("gpu"), body.get("software")
        if gpu is not None or software is not None:  # the GPU model to answer for (docs/calibration.md)
            body = {k: v for k, v in body.items() if k not in ("gpu", "software")}
            if gpu is not None and (not isinstance(gpu, str) or not 0 < len(gpu) <= MAX_GPU_NAME):
                return 400, {"error": f"gpu must be the GPU model's NVML name (1-{MAX_GPU_NAME} characters, e.g. "
                                      f"\"NVIDIA A100-SXM4-40GB\"), got {str(gpu)[:80]!r}"}
            if software is not None and (not isinstance(software, str) or len(software) > MAX_GPU_NAME):
                return 400, {"error": "software must be the node software as \"driver/CUDA\" (a string), "
                                      f"got {str(software)[:80]!r}"}
        is_pod = isinstance(body.get("metadata"), dict)
        if is_pod:
            raw_annotations = body["metadata"].get("annotations") or {}
        elif "annotations" in body:
            raw_annotations = body["annotations"]
        else:
            raw_annotations = body
        if not isinstance(raw_annotations, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in raw_annotations.items()):
            return 400, {"error": "annotations must be an object of strings"}
        too_many = predict_annotations_refused(raw_annotations, self.settings.server.predict_max_annotations)
        if too_many:
            return 400, {"error": too_many}
        # a Pod is read as the extender reads it (other tools' annotations ignored); JobSpec keys may omit the prefix
        annotations = raw_annotations if is_pod else {
            k if k.startswith(ann.PREFIX) else ann.PREFIX + k: v for k, v in raw_annotations.items()}
        now = self.clock()
        pod = PodInfo(name="predict", namespace="default", uid="", annotations=annotations)
        try:
            plan = self.planner.plan(pod, now)
        except AnnotationError as err:
            return 400, {"error": str(err)}
        except PredictorUnavailable as err:
            return 409, {"error": f"predictor unavailable: {err}"}
        answer: dict[str, Any] = {}
        if isinstance(gpu, str):
            model = self.planner.on_named_model(plan, gpu, software)
            answer["on_gpu"] = model.to_dict() if model is not None else None
        return 200, {
            **answer,
            "gpu_job": plan.request.gpu_job,
            "gpus": plan.request.gpus,
            "demand": plan.demand.to_dict() if plan.demand else None,
            "admission_memory_mib": answer["on_gpu"]["admission_mib"] if answer.get("on_gpu") else
            plan.request.admission_mib,
            "admission_source": plan.source,
            "priority": plan.request.priority,
            "criticality": plan.job.criticality,
            "predictor_version": self.predictor_version,
        }


#: Longest annotation key /v1/predict takes: Kubernetes' own bound (a 253-character DNS prefix, "/",
#: a 63-character name).
MAX_ANNOTATION_KEY_CHARS = 253 + 1 + 63
#: Longest value of a deepres.io/ annotation /v1/predict takes (the longest real one, a job's
#: description, is a few hundred characters); other tools' annotations are not read.
MAX_ANNOTATION_VALUE_CHARS = 4096


def predict_annotations_refused(annotations: dict[str, str], max_count: int) -> str:
    """Why this annotation map is refused by /v1/predict (too many keys, a key or a deepres.io/ value
    too long), naming the field; "" when it is taken. Checked before any value is parsed."""
    if len(annotations) > max_count:
        return (f"annotations: {len(annotations)} keys, at most {max_count} are taken "
                f"(server.predict_max_annotations)")
    for key, value in annotations.items():
        if len(key) > MAX_ANNOTATION_KEY_CHARS:
            return f"annotations: key {key[:40]!r}... is {len(key)} characters, at most {MAX_ANNOTATION_KEY_CHARS}"
        if len(value) > MAX_ANNOTATION_VALUE_CHARS and (key.startswith(ann.PREFIX) or "/" not in key):
            return (f"annotations.{key[:80]}: the value is {len(value)} characters, "
                    f"at most {MAX_ANNOTATION_VALUE_CHARS}")
    return ""


# ---------------------------------------------------------------------------------------------
# HTTP

def create_app(
    settings: Settings | None = None,
    predictor: DemandPredictor | None = None,
    clock: Callable[[], float] = time.time,
    cluster: Cluster | None = None,
    monotonic: Callable[[], float] | None = None,
) -> Flask:
    """The WSGI app. `settings` default to defaults + `DEEPRES_*` env; `predictor` defaults to the
    shipped `predictor.runtime.Predictor.load()` (loaded in the background; /readyz waits for it);
    `cluster` to the real API server, or an in-memory one in local mode (`kube.no_kube`)."""
    settings = settings if settings is not None else load_settings()
    problems = settings.validate()
    if problems:
        from extender.settings import SettingsError

        raise SettingsError(problems)
    if cluster is None and settings.kube.no_kube:
        cluster = InMemoryCluster(state_file=settings.kube.state_file, learned_max=settings.recent_pods,
                                  state_file_reset=settings.kube.state_file_reset)
    elif cluster is None:
        cluster = KubeCluster(settings.kube.scheduler_name, settings.kube.resync_s, settings.kube.token_cache_s,
                              api_timeout_s=settings.kube.api_timeout_s, callers=settings.server.threads)
    ext = Extender(settings, predictor, cluster, clock, monotonic)
    log.info("deepres extender settings: %s", describe(settings))
    ext.start()

    app = Flask("deepres-extender")
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes
    app.extensions["deepres"] = ext
    metrics = ext.metrics

    def respond(payload: Any, status: int = 200, close: bool = False) -> Response:
        answer = Response(encode_json(payload), status=status, mimetype="application/json")
        if close:  # the rest of the body is not read: the connection cannot carry another request
            stop_reading(request.environ)
            answer.headers["Connection"] = "close"
        return answer

    @app.post("/v1/predict")
    def predict_route() -> Response:
        started = time.perf_counter()
        try:
            try:
                body = decode_json(read_body(request.environ, min(settings.server.predict_max_bytes,
                                                                  settings.server.max_body_bytes)))
            except BadRequest as err:
                return respond({"error": str(err)}, 400)
            except BodyTooLarge as err:
                return respond({"error": str(err)}, 413, close=True)
            status, payload = ext.predict(body)
            return respond(payload, status)
        finally:
            metrics.latency.labels("predict").observe(time.perf_counter() - started)

    wiring_resource = settings.kube.device_resource if settings.kube.mutation_wiring == "device-plugin" else ""

    @app.post("/v1/mutate")
    def mutate_route() -> Response:  # the mutating admission webhook (extender/server/mutate.py)
        started = time.perf_counter()
        try:
            try:
                review = decode_json(read_body(request.environ, settings.server.max_body_bytes))
                return respond(review_answer(review, scheduler_name=settings.kube.scheduler_name,
                                             resource=wiring_resource))
            except (BadRequest, NotAReview) as err:
                return respond({"error": str(err)}, 400)
            except BodyTooLarge as err:
                return respond({"error": str(err)}, 413, close=True)
        finally:
            metrics.latency.labels("mutate").observe(time.perf_counter() - started)

    @app.get("/healthz")
    def healthz() -> Response:
        return respond({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        waiting = ext.readiness()
        write_error = getattr(ext.cluster, "state_write_error", "")  # binds fail until a write succeeds again
        if write_error:
            waiting = [*waiting, write_error]
        return respond({"ready": not waiting, "waiting_for": waiting}, 200 if not waiting else 503)

    exposition = CachedExposition(metrics.registry, share=settings.server.metrics_render_share)

    @app.get("/metrics")
    def metrics_route() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(exposition.render(), mimetype=CONTENT_TYPE_LATEST.split(";")[0],
                        headers={"Content-Type": CONTENT_TYPE_LATEST})

    @app.get("/openapi.json")
    def openapi_route() -> Response:
        return respond(openapi_document())

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        code = err.code or 400
        if code == 413:
            return respond({"error": f"request body larger than {settings.server.max_body_bytes} bytes"}, 413)
        answer = respond({"error": f"{err.name}: {err.description}"}, code)
        allowed = getattr(err, "valid_methods", None)  # a 405 names what the route takes (RFC 9110 15.5.6)
        if allowed:
            answer.headers["Allow"] = ", ".join(allowed)
        return answer

    @app.errorhandler(Exception)
    def unexpected(err: Exception) -> Response:  # a bug: log it, never leak a traceback
        log.exception("unexpected error on %s %s", request.method, request.path)
        return respond({"error": f"internal error ({type(err).__name__}); see the extender's log"}, 500)

    # the verbs and telemetry, all of the extender's traffic, skip Flask's per-request machinery
    app.wsgi_app = VerbRoutes(ext, app.wsgi_app)  # type: ignore[method-assign]
    return app


def extender_of(app: Flask) -> Extender:
    """The Extender behind an app made by create_app (tests, the bench)."""
    ext: Extender = app.extensions["deepres"]
    return ext


__all__ = ["Extender", "PredictorUnavailable", "create_app", "extender_of", "pod_meta"]


"""The only module that talks to the Kubernetes API: watches, pod reads, Bindings (with the
pod's annotations), Node annotation patches, evictions, Events and TokenReviews, behind the small `Cluster` interface.

`KubeCluster` (the production default) uses the official `kubernetes` client; `InMemoryCluster`
(extender/kube/local.py) serves local mode (`--no-kube`) and tests with the same behaviour and no API
server. Pods travel
as plain dicts in Kubernetes' JSON casing (the API server's own JSON for lists and watches, which
`ApiClient().sanitize_for_serialization` of a model matches), so the extender parses a watched pod
and a pod sent by kube-scheduler with one parser.

Why the JSON and not the client's models: the client turns every object into models and the
extender turned them back into dicts; measured, that cost about 1-2 ms of CPU per watch event and
per API answer, several per scheduled pod, more than the extender's own filter. Lists, watch events
and pod reads are read with `_preload_content=False` and orjson; answers nobody reads are drained
unparsed. The pod watch and list keep only the fields the extender reads (extender/kube/watched.py).
"""

from __future__ import annotations

import importlib
import logging
import random
import threading
import urllib.parse
import uuid as uuid_module
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from extender.kube.watched import decode_pod_event, decode_pod_list

log = logging.getLogger(__name__)

#: TokenReview's extra key carrying the node a projected ServiceAccount token is bound to.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Watch restarts back off exponentially from the first to the last figure (with jitter).
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
#: Local mode: pods learned from requests and not bound yet, at most this many (least recent dropped).
LEARNED_MAX = 10_000
#: API connections kept besides one per request thread: the pod and node watches, the worker, the
#: events worker, and a few to spare.
POOL_SPARE = 8
#: The User-Agent of the extender's API requests (followed by its version).
USER_AGENT = "deepres-extender"
#: The Node list and watch ask for the nodes' metadata only (PartialObjectMetadata, as client-go's
#: metadata informers do): the extender needs their names, and a Node's status (conditions, images,
#: a heartbeat from every kubelet) is most of its bytes. Plain JSON is the second choice, for an API
#: server that cannot serve the first (it then sends whole Nodes, which carry the same metadata).
NODE_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
NODE_WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"


def backoff_s(failures: int, rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after `failures` consecutive watch failures: 1, 2, 4... up to 60, +-20%."""
    base = min(BACKOFF_FIRST_S * 2.0 ** max(failures - 1, 0), BACKOFF_MAX_S)
    return float(base * (0.8 + 0.4 * rng()))


class WatchExpired(RuntimeError):
    """The API server ended a watch with an ERROR event (410 Gone: the resourceVersion is too old)."""


class ConflictError(RuntimeError):
    """An update refused for a stale resourceVersion (HTTP 409): read again, merge, retry."""


class ClusterError(RuntimeError):
    """An API call that failed; the message says which call and why."""


@dataclass(frozen=True)
class TokenIdentity:
    """Who a bearer token belongs to, per TokenReview."""

    username: str
    node_name: str = ""  # the node a bound ServiceAccount token was issued for
    audiences: tuple[str, ...] = ()


@dataclass
class ClusterHandlers:
    """What the cluster tells the extender. `pods_listed` gets the full list after every (re)list so
    reservations of pods deleted while the watch was down are released."""

    pod_changed: Callable[[dict[str, Any], bool], None]  # (pod, deleted)
    pods_listed: Callable[[list[dict[str, Any]]], None]
    node_deleted: Callable[[str], None]
    nodes_listed: Callable[[list[str]], None] = field(default=lambda names: None)
    node_added: Callable[[str], None] = field(default=lambda name: None)


class Cluster(Protocol):
    """The extender's view of the API server."""

    def start(self, handlers: ClusterHandlers) -> None:
        """List pods of our scheduler and nodes (calling the handlers), then keep watching."""

    def synced(self) -> bool:
        """True once the first list of pods has been handed to the handlers."""

    def stop(self) -> None: ...

    def watched_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod of this scheduler as the pod watch last saw it (the API server's own copy, never
        a request's; read-only), or None when the watch has not seen it. Bind trusts it only to
        confirm what the Binding then enforces again (extender.server.app `confirmed_pod`)."""

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API server has it now (no cache): what bind and eviction check against.
        None when it does not exist; raises ClusterError when the API cannot say."""

    def learn_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod kube-scheduler sent: local mode keeps the first one seen per pod (there is no API
        server to ask); a real cluster ignores it (the API server is the only truth)."""

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str]) -> None:
        """Set annotations on a Node (a Node update is a cluster event: kube-scheduler retries
        the pods it could not place); raises ClusterError."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str] | None = None) -> None:
        """Create the pod's Binding to `node` with its uid as a precondition; the API server
        refuses it for a pod that is already bound, being deleted or another pod of the same
        name, and writes `annotations` onto the pod in the same update; raises ClusterError."""

    def event(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Record an Event on the pod; never raises (events are best effort)."""

    def review_token(self, token: str, audience: str) -> TokenIdentity | None:
        """The token's identity when the API server authenticates it for `audience`, else None."""

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """Evict a pod through the Eviction API (PodDisruptionBudgets apply); raises ClusterError."""


def pod_meta(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of a pod dict."""
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or "")


class KubeCluster:
    """The real API server through the official client: in-cluster config, else ~/.kube/config."""

    def __init__(self, scheduler_name: str, resync_s: float, token_cache_s: float, api_client: Any = None,
                 api_timeout_s: float = 10.0, callers: int = 0) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        if api_client is None:
            config: Any = importlib.import_module("kubernetes.config")
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient(self.pool_configuration(client.Configuration.get_default_copy(), callers))
            # who is asking, in the API server's audit log and request logs (the client's default names no one)
            api_client.user_agent = f"{USER_AGENT}/{importlib.import_module('extender').__version__}"
        self._client = client
        self._api: Any = api_client
        self._core: Any = client.CoreV1Api(self._api)
        self._auth: Any = client.AuthenticationV1Api(self._api)
        self.scheduler_name = scheduler_name
        self.resync_s = resync_s
        self.token_cache_s = token_cache_s
        self.api_timeout_s = api_timeout_s
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._threads: list[threading.Thread] = []
        self._urllib3: Any = importlib.import_module("urllib3")
        self._host_pool: Any = None  # the API server's connection pool (see `_pool`)

    @staticmethod
    def pool_configuration(configuration: Any, callers: int) -> Any:
        """`configuration` with a connection pool for `callers` threads calling the API at once (the
        server's request threads: binds, token reviews) besides the watches and the workers.

        The client's default pool keeps 5 connections per CPU (10 on 2 cores); a call beyond them
        opens a new TLS connection and the pool drops it after: measured in `deepres bench cluster`,
        ~15 binds in flight at 100 pods/s, and TLS handshakes took a sixth of the bind's CPU time,
        besides the API server's side of each."""
        if callers > 0:
            configuration.connection_pool_maxsize = max(int(configuration.connection_pool_maxsize or 0),
                                                        callers + POOL_SPARE)
        return configuration

    # ---- watches ----
    def start(self, handlers: ClusterHandlers) -> None:
        for target, name in ((self._watch_pods, "deepres-watch-pods"), (self._watch_nodes, "deepres-watch-nodes")):
            thread = threading.Thread(target=target, args=(handlers,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def synced(self) -> bool:
        return self._synced.is_set()

    def stop(self) -> None:
        self._stop.set()

    def _watch_timeouts(self) -> dict[str, Any]:
        """A watch ends on the server after resync_s and is resumed where it stopped; a silent one
        (dead connection, stuck proxy) is cut by the client's read timeout a little later, and then
        relisted like any failure. Bookmarks keep the place to resume from recent when the watched
        objects are quiet (else it could fall out of the API server's window: 410, a relist)."""
        return {"timeout_seconds": int(self.resync_s), "allow_watch_bookmarks": True,
                "_request_timeout": (self.api_timeout_s, self.resync_s + self.api_timeout_s)}

    def _rewatch(self, what: str, err: Exception, failures: int) -> int:
        """After a failed list or watch: 410 Gone relists at once, anything else backs off."""
        if getattr(err, "status", None) == 410 or isinstance(err, WatchExpired):
            log.info("%s watch expired (410 Gone): relisting", what)
            return 0
        failures += 1
        delay = backoff_s(failures)
        log.warning("%s watch failed (%d in a row), relisting in %.1f s: %s", what, failures, delay, _api_reason(err))
        self._stop.wait(delay)
        return failures

    def _watch_pods(self, handlers: ClusterHandlers) -> None:
        """List the pods of this scheduler, then watch them. A watch that ends as asked (after
        resync_s) is resumed from the last version it showed, as client-go's reflectors do: a
        relist every resync_s sent every pod of the scheduler again (a full JSON list for the API
        server, a parse of each for the extender) for nothing a continued watch does not give. Any
        failure (410 Gone, an error, a silent watch cut) relists."""
        selector = f"spec.schedulerName={self.scheduler_name}"
        failures = 0
        version: str | None = None  # where the next watch starts; None: list first
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self._list(self._core.list_pod_for_all_namespaces, decode=decode_pod_list,
                                        field_selector=selector)
                    pods = [p for p in listed.get("items") or () if isinstance(p, dict)]
                    with self._lock:
                        self._pods = {pod_meta(p)[:2]: p for p in pods}
                    handlers.pods_listed(pods)
                    self._synced.set()
                    failures = 0
                    version = _resource_version(listed)
                for kind, pod in self._events(self._core.list_pod_for_all_namespaces, decode=decode_pod_event,
                                              field_selector=selector,
                                              resource_version=version):
                    if self._stop.is_set():
                        return
                    version = _object_version(pod) or version
                    if kind == "BOOKMARK":
                        continue
                    deleted = kind == "DELETED"
                    with self._lock:
                        if deleted:
                            self._pods.pop(pod_meta(pod)[:2], None)
                        else:
                            self._pods[pod_meta(pod)[:2]] = pod
                    handlers.pod_changed(pod, deleted)
            except Exception as err:  # the watch must outlive any API hiccup: log, back off, relist
                version = None
                failures = self._rewatch("pod", err, failures)

    def _watch_nodes(self, handlers: ClusterHandlers) -> None:
        """List the nodes' names, then watch them; resumed and relisted as `_watch_pods` is."""
        failures = 0
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self._list(self._core.list_node, _headers={"Accept": NODE_LIST_ACCEPT})
                    handlers.nodes_listed([name for n in listed.get("items") or () if (name := _name(n))])
                    failures = 0
                    version = _resource_version(listed)
                for kind, node in self._events(self._core.list_node, _headers={"Accept": NODE_WATCH_ACCEPT},
                                               resource_version=version):
                    if self._stop.is_set():
                        return
                    version = _object_version(node) or version
                    if kind == "BOOKMARK":
                        continue
                    name = _name(node)
                    if not name:
                        continue
                    if kind == "DELETED":
                        handlers.node_deleted(name)
                    elif kind == "ADDED":
                        handlers.node_added(name)
            except Exception as err:
                version = None
                failures = self._rewatch("node", err, failures)

    def _list(self, call: Callable[..., Any], decode: Callable[[bytes], dict[str, Any] | None] | None = None,
              **kwargs: Any) -> dict[str, Any]:
        """A list call's JSON as plain dicts (Kubernetes' casing), read with orjson.

        The client's model deserialiser and `sanitize_for_serialization` back to dicts cost ~2 ms
        per Pod (measured: 2.0 ms against 0.02 ms for one 3 KB Pod event); at a few watch events per
        scheduled pod, and a Node event per node heartbeat, that was most of the extender's CPU.
        `decode`: a typed decoding of the body (the pod list's), None where it does not take it."""
        response = call(_preload_content=False, _request_timeout=self.api_timeout_s, **kwargs)
        try:
            if not 200 <= int(response.status) <= 299:
                self._api.response_deserialize(response, {})  # raises the client's ApiException
            listed = (decode(response.data) if decode is not None else None) or orjson.loads(response.data)
        finally:
            response.release_conn()
        if not isinstance(listed, dict):
            raise ValueError(f"list answered {type(listed).__name__}, not an object")
        return listed

    def _events(self, call: Callable[..., Any], decode: Callable[[bytes], dict[str, Any] | None] | None = None,
                **kwargs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """A watch's (type, object) events from its JSON lines (see `_list` for why not the client's
        Watch, which deserialises each object into models). An ERROR event ends the watch
        (WatchExpired: 410 Gone relists at once); BOOKMARKs are given (their version is where to
        resume); anything unreadable is skipped. `decode`: a typed decoding of a line (the pod watch's,
        extender/kube/watched.py), None for a line it does not take, which is then decoded whole."""
        response = call(watch=True, _preload_content=False, **kwargs, **self._watch_timeouts())
        try:
            if not 200 <= int(response.status) <= 299:
                self._api.response_deserialize(response, {})
            for line in watch_lines(response.stream(amt=None, decode_content=False)):
                typed = decode(line) if decode is not None else None
                try:
                    event = typed if typed is not None else orjson.loads(line)
                except orjson.JSONDecodeError:
                    try:  # not UTF-8 (orjson reads bytes strictly): as the client did, with U+FFFD for the bad bytes
                        event = orjson.loads(line.decode("utf-8", errors="replace"))
                    except orjson.JSONDecodeError:
                        log.info("skipping an unreadable watch line (%d bytes)", len(line))
                        continue
                if not isinstance(event, dict):
                    continue
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":
                    raise WatchExpired(str(obj))
                if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") and isinstance(obj, dict):
                    yield kind, obj
        finally:
            response.close()
            response.release_conn()

    # ---- calls ----
    def watched_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def _read(self, what: str, namespace: str, name: str, call: Any) -> Any:
        """One object read raw (no client models): its decoded JSON, None when there is none (404)."""
        try:
            return _json(call(name, namespace, _preload_content=False, _request_timeout=self.api_timeout_s))
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return None
            raise ClusterError(f"read {what} {namespace}/{name}: {_api_reason(err)}") from None

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self._read("pod", namespace, name, self._core.read_namespaced_pod)
        if pod is None:
            return None
        if not isinstance(pod, dict):
            raise ClusterError(f"read pod {namespace}/{name}: the answer is not an object")
        return pod

    def learn_pod(self, pod: Mapping[str, Any]) -> None:
        return None  # the API server is the only truth about pods

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str]) -> None:
        try:
            _drain(self._core.patch_node(node, {"metadata": {"annotations": dict(annotations)}},
                                         _preload_content=False, _request_timeout=self.api_timeout_s))
        except Exception as err:
            raise ClusterError(f"patch annotations of node {node}: {_api_reason(err)}") from None

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str] | None = None) -> None:
        ns, name, uid = pod_meta(pod)
        meta: dict[str, Any] = {"name": name, "namespace": ns}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # pods/NAME/binding, the subresource the chart's RBAC grants (not the legacy `bindings`)
        self._post(f"bind pod {ns}/{name} to {node}", "/api/v1/namespaces/{namespace}/pods/{name}/binding",
                   {"namespace": ns, "name": name}, body)

    def event(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        ns, name, uid = pod_meta(pod)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{uuid_module.uuid4().hex[:12]}", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": uid},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "deepres-extender"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._post(f"event {reason} on pod {ns}/{name}", "/api/v1/namespaces/{namespace}/events",
                       {"namespace": ns}, body)
        except ClusterError as err:
            log.info("pod=%s/%s event %s not recorded: %s", ns, name, reason, err)

    def _post(self, what: str, path: str, path_params: Mapping[str, str], body: dict[str, Any]) -> None:
        """POST `body` as JSON to `path` with the client's credentials, connection pool and timeout;
        raises ClusterError naming `what` and the API server's status.

        Plain JSON on the client's own urllib3 pool, not its models nor its request layers: building,
        validating and serialising a V1Binding back to JSON was a quarter of a bind's CPU, and the
        layers above the pool (`param_serialize`, `call_api`, the pool manager's URL parsing and pool
        lookup, stdlib json) another quarter of what was left (every GPU pod is bound here; measured
        against a real API server, one bind at a time: 0.94 -> 0.73 ms of CPU per POST, medians of
        4 rounds). The headers are the client's own (its default headers and, per call, its
        credentials, so a rotated token is sent as soon as the client has it; its cookie if it has one)."""
        resource = path.format(**{k: urllib.parse.quote(v, safe="") for k, v in path_params.items()})
        headers = {**self._api.default_headers, "Content-Type": "application/json", "Accept": "application/json"}
        if self._api.cookie:
            headers["Cookie"] = self._api.cookie
        try:
            self._api.update_params_for_auth(headers, [], ["BearerToken"], resource, "POST", body)
            pool, prefix = self._pool()
            resp = pool.urlopen("POST", prefix + resource, body=orjson.dumps(body), headers=headers,
                                timeout=self._urllib3.Timeout(total=self.api_timeout_s), preload_content=True)
        except Exception as err:
            raise ClusterError(f"{what}: {_api_reason(err)}") from None
        if not 200 <= int(resp.status) <= 299:
            raise ClusterError(f"{what}: HTTP {resp.status} {resp.reason}")

    def _pool(self) -> tuple[Any, str]:
        """(where to send a request, the prefix of its path): the client's connection pool for the API
        server and the configured host's own path; through a proxy, the client's proxy manager and
        the whole URL (it routes each request itself)."""
        manager = self._api.rest_client.pool_manager
        host = str(self._api.configuration.host).rstrip("/")
        if isinstance(manager, self._urllib3.ProxyManager):
            return manager, host
        pool = self._host_pool
        if pool is None or pool.pool is None:  # none yet, or closed by the pool manager: take its current one
            pool = self._host_pool = manager.connection_from_url(host)
        return pool, urllib.parse.urlsplit(host).path

    def read_config_map(self, namespace: str, name: str) -> tuple[str, dict[str, str]] | None:
        """(resourceVersion, data) of a ConfigMap; None when there is none."""
        obj = self._read("configmap", namespace, name, self._core.read_namespaced_config_map)
        if obj is None:
            return None
        data = obj.get("data") if isinstance(obj, dict) else None
        return _object_version(obj) or "", data if isinstance(data, dict) else {}

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str,
                         labels: Mapping[str, str] | None = None) -> str:
        """Create the ConfigMap (`resource_version` "") or replace it at `resource_version`; its new
        resourceVersion. Raises ConflictError when it exists already or changed since (409)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}
        try:
            if resource_version:
                resp = self._core.replace_namespaced_config_map(name, namespace, body, _preload_content=False,
                                                                _request_timeout=self.api_timeout_s)
            else:
                resp = self._core.create_namespaced_config_map(namespace, body, _preload_content=False,
                                                               _request_timeout=self.api_timeout_s)
            obj = _json(resp)
        except Exception as err:
            if getattr(err, "status", None) == 409:
                raise ConflictError(f"configmap {namespace}/{name}: {_api_reason(err)}") from None
            raise ClusterError(f"write configmap {namespace}/{name}: {_api_reason(err)}") from None
        return _object_version(obj) or ""

    def evict(self, namespace: str, name: str, uid: str) -> None:
        c: Any = self._client
        body = c.V1Eviction(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=uid) if uid else None),
        )
        try:
            _drain(self._core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False,
                                                             _request_timeout=self.api_timeout_s))
        except Exception as err:
            raise ClusterError(f"evict pod {namespace}/{name}: {_api_reason(err)}") from None

    def review_token(self, token: str, audience: str) -> TokenIdentity | None:
        """One TokenReview (extender/server/auth.py caches them and bounds how many run at once). The
        answer is read as JSON, not into the client's models: at 5,000 nodes about 45 reviews a
        second, and the models were a quarter of a review's CPU in the extender (py-spy)."""
        c: Any = self._client
        review = c.V1TokenReview(spec=c.V1TokenReviewSpec(token=token, audiences=[audience]))
        try:
            resp = self._auth.create_token_review(review, _preload_content=False, _request_timeout=self.api_timeout_s)
            if not 200 <= int(resp.status) <= 299:
                try:
                    self._api.response_deserialize(resp, {})  # raises the client's ApiException
                finally:
                    resp.release_conn()
            answer = _json(resp)
        except Exception as err:
            log.warning("TokenReview failed: %s", _api_reason(err))
            return None
        status = answer.get("status") if isinstance(answer, dict) else None
        user = status.get("user") if isinstance(status, dict) else None
        if not isinstance(status, dict) or status.get("authenticated") is not True or not isinstance(user, dict):
            return None
        extra = user.get("extra")
        nodes = extra.get(NODE_NAME_EXTRA) if isinstance(extra, dict) else None
        node = nodes[0] if isinstance(nodes, list) and nodes and isinstance(nodes[0], str) else ""
        username = user.get("username")
        audiences = status.get("audiences")
        return TokenIdentity(username if isinstance(username, str) else "", node,
                             tuple(a for a in audiences if isinstance(a, str)) if isinstance(audiences, list) else ())


def watch_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A watch's JSON lines, as bytes, from its body's chunks (each event is one line; the API server
    sends one or more per chunk, and a large one may span chunks).

    Not the client's `iter_resp_lines`: it decoded every line to a str (which orjson then encodes
    back) and copied what followed each line out of its buffer; per watch event that was about as
    much CPU as parsing the event (py-spy under `deepres bench cluster`)."""
    parts: list[bytes] = []
    for chunk in chunks:
        if b"\n" not in chunk:
            if chunk:
                parts.append(chunk)
            continue
        lines = chunk.split(b"\n")
        if parts:
            parts.append(lines[0])
            lines[0] = b"".join(parts)
            parts = []
        tail = lines.pop()
        if tail:
            parts.append(tail)
        for line in lines:
            if line:
                yield line
    if parts:  # a last line the server did not end (the watch was cut): given, and skipped if unreadable
        yield b"".join(parts)


def _drain(resp: Any) -> None:
    """Read an answer nobody parses to its end, so its connection goes back to the pool clean
    (an unread body would be taken for the next answer on that connection)."""
    if resp is None:  # test doubles
        return
    try:
        resp.data  # noqa: B018  (reading it is the point)
    finally:
        resp.release_conn()


def _json(resp: Any) -> Any:
    """The body of an answer read with `_preload_content=False`, parsed."""
    try:
        return orjson.loads(resp.data)
    finally:
        resp.release_conn()


def _resource_version(listed: Mapping[str, Any]) -> str | None:
    meta = listed.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


def _object_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _api_reason(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    return f"HTTP {status} {reason}" if status else str(err)

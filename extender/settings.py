"""The extender's settings: one dataclass tree, read from defaults < `--config` YAML < `DEEPRES_*` env.

Every leaf name is unique across the tree, so a leaf is set the same way everywhere: in YAML either
nested (`policy: {telemetry_ttl_s: 30}`) or flat (`telemetry_ttl_s: 30`), and in the environment as
`DEEPRES_<LEAF>` (`DEEPRES_TELEMETRY_TTL_S=30`). `validate()` lists every problem with its path, and
`load_settings` refuses to start on any of them. Nothing here is read at import time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from extender.policy.filtering import BOUND_BEYOND_GPUS
from extender.policy.types import CRITICALITIES, PolicyParams
from predictor.parsing import ascii_digits

#: Who may call the verbs (server.verbs_access); extender/server/auth.py enforces each.
VERBS_ACCESS = ("loopback", "mtls", "any")

ENV_PREFIX = "DEEPRES_"
#: The production WSGI servers `deepres serve` can run under (extender/server/serve.py says why granian leads).
ENGINES = ("granian", "gunicorn")


class SettingsError(ValueError):
    """Settings that cannot be used; `problems` lists each with its path."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid settings:\n  " + "\n  ".join(problems))


@dataclass
class ServerSettings:
    bind: str = "0.0.0.0:8888"
    """HOST:PORT the HTTP server listens on."""
    engine: str = "granian"
    """WSGI server: granian (HTTP in Rust, less CPU per request) or gunicorn (gthread worker)."""
    threads: int = 32
    """Request threads of the single worker process (the cluster state lives in that one process).
    Under granian they run what may wait on the API server (binds, new agent tokens), the rest runs
    on the event loop: a bind waits 70-200 ms for the API server's answer in `deepres bench
    cluster` (the Binding itself, measured at the API server), so 8 threads capped binds near 50/s."""
    timeout_s: float = 30.0
    """gunicorn: worker timeout (and the time a request thread waits for a request's headers).
    kube-scheduler's own httpTimeout is 5 s by default."""
    header_timeout_s: float = 10.0
    """granian: time from the accept, or from the end of the last answer on a kept-alive connection,
    to the end of the next request's headers; gunicorn: to the first byte of the next request (it
    waits on the poller, holding no thread: extender/server/gunicorn_worker.py). The connection is closed
    after it, so one that sends nothing, or idles between requests, holds a slot this long at most
    (extender/server/connections.py).
    kube-scheduler and the agents send their request as soon as they connect; Go's client opens a
    new connection when the server closed an idle one."""
    max_connections: int = 8192
    """Connections the worker holds at once (more wait in the kernel's listen backlog). Far
    above what legitimate callers hold, so that idle clients fill it only by opening
    max_connections / header_timeout_s new connections a second; lowered to the open-files limit."""
    predict_rate_per_s: float = 5.0
    """/v1/predict requests a second per client address (token bucket; 429 with Retry-After above it):
    one unauthenticated client must not take the worker's one Python thread. 0: no limit."""
    predict_burst: int = 20
    """/v1/predict requests a client may make at once before the rate applies."""
    predict_clients: int = 4096
    """Client addresses whose /v1/predict buckets are remembered (least recent forgotten first)."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body (413 above): 100 full Node objects take ~0.5 MiB, 5,000 names ~100 KiB."""
    predict_max_bytes: int = 64 * 1024
    """Largest /v1/predict body (413 above, refused before it is read; at most max_body_bytes): a real
    pod's annotation map is a few KiB, and a 15 MiB body of a million keys took 3.5-4.1 GB of the
    worker (issue 34)."""
    metrics_render_share: float = 0.1
    """Share of a core /metrics rendering may take (extender/server/metrics.py, CachedExposition): past it
    within a second, the page last rendered (at most a second old) is served again."""
    predict_max_annotations: int = 256
    """Most annotations a /v1/predict body may carry (400 above, before any is read)."""
    body_buffer_bytes: int = 256 * 1024 * 1024
    """Bytes of request bodies held at once, received and not yet answered (granian; 503 above): with
    `max_body_bytes` per request this bounds the memory that many concurrent senders can take."""
    body_timeout_s: float = 10.0
    """Time a client has to send a request's body once its headers are in (408 after): a client that
    stalls mid-body must not hold the server. kube-scheduler sends its body at once."""
    tls_cert: str = ""
    """PEM certificate for HTTPS (with tls_key); empty: plain HTTP."""
    tls_key: str = ""
    """PEM private key for HTTPS."""
    tls_client_ca: str = ""
    """PEM CA bundle that signs the scheduler's client certificate (verbs_access mtls)."""
    verbs_access: str = "loopback"
    """Who may call /filter, /prioritize, /preempt and /bind (extender/server/auth.py): `loopback` (sidecar
    mode: callers on 127.0.0.1/::1 only), `mtls` (a client certificate signed by tls_client_ca; needs
    scheduler_bind, or tls_cert and engine gunicorn) or `any` (no check: only behind a guard of your own)."""
    scheduler_bind: str = ""
    """HOST:PORT of the scheduler's own listener (extender/server/scheduler_listener.py): the verbs are
    then answered there only, with `verbs_access` checked at the connection (mtls: in the TLS
    handshake) and `scheduler_max_connections` no other caller can take; the main port (`bind`)
    refuses them. Empty: the verbs on the main port, as before issue 34."""
    scheduler_max_connections: int = 64
    """Connections the scheduler's listener holds at once (kube-scheduler keeps a few per replica);
    one more closes the connection idle longest, those that never completed a request first."""
    scheduler_tls_cert: str = ""
    """PEM certificate of the scheduler's listener (with scheduler_tls_key); empty: tls_cert."""
    scheduler_tls_key: str = ""
    """PEM private key for scheduler_tls_cert."""
    webhook_bind: str = ""
    """HOST:PORT of the mutating admission webhook's own TLS listener (`POST /v1/mutate`,
    extender/server/mutate.py), for clusters without the MutatingAdmissionPolicy (Kubernetes before
    1.36); the API server calls it over HTTPS with the chart's CA. Empty: no webhook listener."""
    webhook_tls_cert: str = ""
    """PEM certificate of the webhook's listener (with webhook_tls_key); required with webhook_bind."""
    webhook_tls_key: str = ""
    """PEM private key for webhook_tls_cert."""
    log_level: str = "info"
    """debug, info, warning or error."""


@dataclass
class PolicySettings:
    telemetry_ttl_s: float = 30.0
    """A node's telemetry older than this fails the filter: the agent reports every 5 s, so 30 s is six
    missed reports."""
    spread_priority: float = 20.0
    """Priority from which pods spread to the least utilised GPUs (20 = a `high` job)."""
    fragmentation_weight: float = 0.2
    """Share of the score (0..1) rewarding placements that leave fewer GPUs partly used."""
    fragmentation_aware_packing: bool = True
    """Score packing (below `spread_priority`) pods by the fragmentation-aware rule against the mix of
    recent admissions (FGD's idea in memory terms; reports/simulation.md). False: best fit only."""
    filter_shortlist: int = 1
    """When more GPU nodes than this fit a pod, the filter answers with only this many, the best by
    the prioritize score, so that kube-scheduler scores (its plugins and the extender's prioritize)
    those instead of every node: at 1,000-5,000 nodes most of a scheduling cycle. With 1 (the
    default, as HAMi's filter answers) kube-scheduler scores nothing and sends no prioritize: the
    filter's best node is the pod's, reserved by the filter until its bind (`assume_on_prioritize`).
    Not for pods with soft preferences kube-scheduler scores itself (preferred node or pod
    (anti-)affinity, spread constraints with ScheduleAnyway): they get every node that fits. 0: every
    node that fits, always."""
    usage_warmup_s: float = 120.0
    """Time after bind before a reservation follows the pod's observed peak."""
    usage_plateau_s: float = 300.0
    """A reservation goes below its admission only once the pod's observed peak has not grown for this
    long (the pod has shown its peak; docs/usage-rule.md): 5x the minute in which the growing jobs of
    issue 34 reached their admission, 60 agent reports, and minutes against jobs that run for hours."""
    usage_plateau_samples: int = 3
    """...and over at least this many observations (a silent agent shows no plateau)."""
    usage_margin: float = 1.10
    """Safety margin on observed peaks (>= 1)."""
    min_reservation_mib: float = 256.0
    """Floor of a usage-following reservation (MiB)."""
    size_scale_gpu_s: float = 1.0e6
    """Job size (GPU-seconds) that earns no size points in the priority."""
    peak_store_size: int = 10_000
    """Job signatures whose observed peaks are remembered (least recently used forgotten first)."""
    correction_min_pods: int = 3
    """Observed peaks of a job signature correct its admission once this many pods ran..."""
    correction_min_nodes: int = 2
    """...on at least this many nodes (one node's agent cannot steer the cluster alone)."""
    calibration_settle_s: float = 120.0
    """The online calibration (docs/calibration.md) learns from a pod's peak only once the pod has run
    this long since its bind (it has reached its peak: as `usage_warmup_s`); earlier readings are kept
    but are no observation yet."""
    sharing: bool = True
    """Compute is a resource (policy/sharing.py): a pod joins a GPU that runs work only when the
    interference model predicts no job there slows beyond `max_slowdown` and that beats waiting for an
    empty GPU. True (the default, issue 33): the capacity experiment (`deepres simulate --experiment
    capacity`, reports/simulation.json `capacity`, docs/capacity.md) measures it as the best of its
    policies; False, memory alone decides co-location (the `deepres-memory` ablation), an explicit
    opt-in whose measured cost docs/capacity.md states. tests/unit/test_capacity.py holds this default
    and the report together."""
    max_slowdown: float = 1.25
    """The slowdown (alone step time x this) sharing may cause any job (`policy.max_slowdown`; in the chart
    under `extender.settings`)."""
    max_slowdown_high: float = 1.10
    """The bound where a high or critical pod joins or runs."""
    slowdown_error_exponent: float = 1.0
    """The interference model's error margin in the join check: a predicted slowdown s is judged as
    s ** this (`PolicyParams.slowdown_error_exponent`; 1.0: the forecast as is)."""
    sharing_feedback: bool = False
    """Sharing's promise kept by feedback (`policy.feedback`, docs/rules.md): from the agents' per-process
    samples, a GPU whose shared jobs run slower than their bound takes no joiner, its newest joiner is
    moved (evicted) after `sharing_move_after_s`, and each job signature's forecast error widens the
    margin of its later joins. Off by default until the reports that cite the policy are made again
    with it on (docs/capacity.md, "Feedback"): False, the forecast alone decides (as before issue 46)."""
    sharing_move_after_s: float = 600.0
    """How long a GPU may stay over its slowdown bound, taking no joiner, before its newest joiner is
    moved; a negative value is refused, a very large one never moves."""
    share_memory_margin: float = 0.0
    """A pod joins a GPU that runs work only with (1 + this) x its admission free there."""
    bound_beyond_gpus: str = "whole-gpu"
    """A pod admitted by the predictor whose admission bound fits none of its candidate GPUs while its
    point estimate fits the largest (a family-path bound above a 40 GB GPU for a job that really
    peaks at 29 GiB): `whole-gpu` (the default) asks for an empty GPU of that size, reserved whole so
    nothing shares it; `point` admits it at its point estimate x `usage_margin`, sharing like any
    pod, and the usage rule follows its observed peak (more pods placed, an OOM risk where the point
    is low); `wait` refuses it with the reason `upper bound ... exceeds this node's GPUs ... while the
    prediction ... fits: it waits for a GPU that holds the bound` until such a GPU is a candidate.
    The user's `gpu-memory` is never second-guessed (docs/rules.md, whole-GPU fallback)."""
    drain: bool = False
    """The draining rule (`sharing.draining`): while a higher-priority GPU pod waits (fits nowhere), busy
    GPUs take no new sharers of lower priority. Off by default: not measured better in the capacity
    experiment (docs/capacity.md)."""
    preempt_min_gap: float = 0.0
    """A preemption victim's priority is at least this far below the preemptor's. 0 (the default): any
    strictly lower priority, as DESIGN says; the compute replay, where sharing makes waits long and
    evictions churn, runs with one criticality level (10; `simulate.compute.COMPUTE_PARAMS`)."""
    preempt_max_loss_s: float = 1800.0
    """Preemption never throws away more than this much of a victim's progress (attained service, or the
    time since its last checkpoint with `deepres.io/checkpoint-interval`)."""
    default_criticality_ceiling: str = "high"
    """Highest criticality a pod's annotation may claim in a namespace not listed below."""
    namespace_criticality_ceilings: dict[str, str] = field(default_factory=dict)
    """Per-namespace ceiling, e.g. {prod: critical, sandbox: normal}. A PriorityClass is not capped."""
    default_gpu_share_floor: float = 1.0
    """Lowest GPU duty (0..1) a pod's declared `deepres.io/gpu-share` counts for, until its job signature's
    duty is observed, in a namespace not listed below. 1.0: a declaration counts nowhere until observed
    (declared shares are priors, not passes: six pods declaring 0.01 slowed a GPU-bound job 6.45x)."""
    namespace_gpu_share_floors: dict[str, float] = field(default_factory=dict)
    """Per-namespace floor, e.g. {research: 0.0}: the namespaces whose declarations the admin trusts."""

    def params(self) -> PolicyParams:
        return PolicyParams(
            telemetry_ttl_s=self.telemetry_ttl_s,
            spread_priority=self.spread_priority,
            fragmentation_weight=self.fragmentation_weight,
            usage_warmup_s=self.usage_warmup_s,
            usage_plateau_s=self.usage_plateau_s,
            usage_plateau_samples=self.usage_plateau_samples,
            usage_margin=self.usage_margin,
            min_reservation_mib=self.min_reservation_mib,
            size_scale_gpu_s=self.size_scale_gpu_s,
            correction_min_pods=self.correction_min_pods,
            correction_min_nodes=self.correction_min_nodes,
            sharing=self.sharing,
            max_slowdown=self.max_slowdown,
            max_slowdown_high=self.max_slowdown_high,
            sharing_feedback=self.sharing_feedback, sharing_move_after_s=self.sharing_move_after_s,
            slowdown_error_exponent=self.slowdown_error_exponent,
            share_memory_margin=self.share_memory_margin,
            drain=self.drain,
            bound_beyond_gpus=self.bound_beyond_gpus,
            preempt_min_gap=self.preempt_min_gap,
            preempt_max_loss_s=self.preempt_max_loss_s,
        )

    def ceiling(self, namespace: str) -> int:
        return CRITICALITIES.index(self.namespace_criticality_ceilings.get(namespace, self.default_criticality_ceiling))

    def share_floor(self, namespace: str) -> float:
        """The lowest duty a declared gpu-share counts for in `namespace` before observation."""
        return float(self.namespace_gpu_share_floors.get(namespace, self.default_gpu_share_floor))


@dataclass
class KubeSettings:
    no_kube: bool = False
    """Local mode: no API server; pods are known from the requests, bindings stay in memory."""
    scheduler_name: str = "deepres-scheduler"
    """Pods of this scheduler are watched; their reservations rebuilt from annotations at start."""
    resync_s: float = 300.0
    """The API server ends each watch after about this long; it is resumed from the last version it
    showed (with bookmarks), not relisted (a relist only after 410 Gone)."""
    token_audience: str = "deepres-extender"
    """Audience the agents' projected ServiceAccount tokens must carry (TokenReview)."""
    token_cache_s: float = 120.0
    """How long a successful TokenReview is trusted before asking the API server again (a refused
    token: at most 5 s), less up to a quarter drawn per token so that reviews come evenly. Reviews
    are cached in a bounded LRU (extender/server/auth.py). Every node's agent token is reviewed about once
    per this time: 5,000 nodes at 60 s were ~80 reviews a second, each an API call for both the
    extender and the API server. 120 s is kube-apiserver's and the kubelet's own cache time for
    webhook token reviews (--authentication-token-webhook-cache-ttl)."""
    agent_service_accounts: list[str] = field(default_factory=list)
    """The ServiceAccounts (system:serviceaccount:NS:NAME) that may post telemetry in a cluster; empty:
    none may (the chart names its agent's)."""
    self_preemption: bool = True
    """When no node fits a GPU pod, evict (Eviction API) the fewest strictly-lower-priority pods on
    the best node: kube-scheduler's own preemption dry run cannot see GPU memory, so it never asks
    the preempt verb unless the pods also conflict on resources it models."""
    assume_on_prioritize: bool = True
    """A GPU pod's prioritize reserves the GPUs of its best-scored node for it until its bind comes (or
    its next filter, or 15 s), as kube-scheduler assumes a pod on its node before the binding cycle:
    the pods filtered meanwhile see them taken. A filter that leaves one node reserves it (kube-scheduler
    sends no prioritize then). Off: a burst of pods counts on the same free GPU while
    the first one's bind is on its way, and the later binds are refused and scheduled again."""
    placed_events: bool = False
    """Also record a `Placed` Event per bound GPU pod (its text is always in the pod's
    `deepres.io/placement` annotation, written by the Binding). Off: the Event is a second API write
    per pod (the API server's, etcd's and the extender's CPU; kube-scheduler records its own
    `Scheduled` Event either way), measured in `deepres bench cluster` (docs/benchmarks.md, "End to end")."""
    preemption_grace_s: float = 120.0
    """After evicting for a pod, wait this long for the victims to go before evicting for it again."""
    api_timeout_s: float = 10.0
    """Client timeout of every Kubernetes API call (a watch: this long beyond its own resync)."""
    telemetry_quorum: float = 0.5
    """After a restart the verbs wait until this share of the nodes holding reservations reported..."""
    telemetry_grace_s: float = 30.0
    """...or this long after the first pod list, whichever comes first."""
    state_file: str = ""
    """Local mode: a JSON file keeping the bound pods across restarts (empty: a restart forgets them).
    Each change is one fsync'ed line of `<file>.journal`, folded into the file (written atomically with a
    checksum) once the journal outgrows it; a bind whose write fails fails (extender/kube/statefile.py,
    journal.py)."""
    state_file_reset: bool = False
    """Local mode: when the state file is damaged (truncated, malformed, unreadable, a directory), move
    it aside and start with no bound pods. Off (the default): the extender stays not ready and binds
    nothing until the admin restores the file or restarts once with this set."""
    local_expiry_s: float = 3600.0
    """Local mode: a node silent this long is forgotten, and a reservation whose pod no report
    mentioned this long is released (there are no pod deletions to say so)."""
    device_resource: str = "deepres.io/gpu"
    """The extended resource the agents' device plugin advertises (the chart's devicePlugin.resourceName):
    a pod whose containers request it is bound one pod per node at a time, and its node's plugin is
    told at `Allocate` (POST /v1/allocate) which pod and GPUs it serves (the allocation handshake,
    docs/device-plugin.md)."""
    mutation_wiring: str = "device-plugin"
    """What the mutating webhook (`POST /v1/mutate`) gives a deepres job's containers: `device-plugin` (a
    request and limit of one `device_resource`; the chart's devicePlugin.enabled) or `env` (the
    NVIDIA_VISIBLE_DEVICES wiring to the deepres.io/assigned-gpus annotation). extender/policy/wiring.py."""
    allocation_wait_s: float = 4.0
    """How long a bind waits for the node's previous pod to be allocated by its kubelet before it fails
    (kube-scheduler then retries the pod); keep it below the scheduler's httpTimeout."""
    calibration_configmap: str = ""
    """With the API server: the ConfigMap (in the extender's namespace, POD_NAMESPACE) that keeps the
    online calibration's observed pods across restarts (docs/calibration.md; the chart names
    `<release>-calibration` and grants get/create/update on it). Empty: kept in memory only, relearned
    from the pods still running after a restart. Local mode keeps it next to the state file."""


@dataclass
class TelemetrySettings:
    telemetry_token_file: str = ""
    """File holding the shared bearer token agents present in local mode."""
    telemetry_token: str = ""
    """The shared token itself (prefer the file; the env var DEEPRES_TELEMETRY_TOKEN works too)."""
    telemetry_max_bytes: int = 1024 * 1024
    """Largest telemetry report body (413 above)."""


@dataclass
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    predictor_path: str = ""
    """Predictor artifact directory; empty: the shipped predictor/artifacts/."""
    predictor_factory: str = ""
    """`module:callable` returning a DemandPredictor to use instead of the shipped one (another model,
    or a stand-in for tests); empty: `predictor.runtime.Predictor.load(predictor_path)`."""
    recent_pods: int = 5_000
    """Local mode: pods learned from requests and not bound yet, at most this many (least recent
    dropped). In a cluster bind reads the pod from the API server and keeps nothing."""

    def validate(self) -> list[str]:
        """Every problem, with its path; empty when the settings can be used."""
        p: list[str] = []
        s, pol, k, t = self.server, self.policy, self.kube, self.telemetry
        host, _, port = s.bind.rpartition(":")
        if not host or not ascii_digits(port) or not 0 < int(port) < 65536:
            p.append(f"server.bind must be HOST:PORT with a port in 1..65535, got {s.bind!r}")
        _positive(p, "server.threads", s.threads)
        if s.engine not in ENGINES:
            p.append(f"server.engine must be one of {', '.join(ENGINES)}, got {s.engine!r}")
        _positive(p, "server.timeout_s", s.timeout_s)
        _positive(p, "server.body_timeout_s", s.body_timeout_s)
        _positive(p, "server.header_timeout_s", s.header_timeout_s)
        _within(p, "server.max_connections", s.max_connections, 64, 1_000_000)
        _within(p, "server.predict_rate_per_s", s.predict_rate_per_s, 0.0, math.inf)
        _within(p, "server.predict_burst", s.predict_burst, 1, math.inf)
        _within(p, "server.predict_clients", s.predict_clients, 1, 10_000_000)
        if s.body_buffer_bytes < s.max_body_bytes:
            p.append(f"server.body_buffer_bytes must be >= server.max_body_bytes ({s.max_body_bytes}), "
                     f"got {s.body_buffer_bytes}")
        _positive(p, "server.max_body_bytes", s.max_body_bytes)
        _within(p, "server.predict_max_bytes", s.predict_max_bytes, 1024, 1 << 30)
        _within(p, "server.metrics_render_share", s.metrics_render_share, 0.0001, 1.0)
        _within(p, "server.predict_max_annotations", s.predict_max_annotations, 1, 100_000)
        if s.verbs_access not in VERBS_ACCESS:
            p.append(f"server.verbs_access must be one of {', '.join(VERBS_ACCESS)}, got {s.verbs_access!r}")
        any_cert = s.tls_cert or (s.scheduler_tls_cert if s.scheduler_bind else "")
        if s.verbs_access == "mtls":
            if not (any_cert and s.tls_client_ca):
                p.append("server.verbs_access=mtls needs server.tls_client_ca and a certificate "
                         "(server.scheduler_tls_cert/scheduler_tls_key or server.tls_cert/tls_key)")
            if s.engine != "gunicorn" and not s.scheduler_bind:
                p.append("server.verbs_access=mtls needs server.scheduler_bind (the scheduler's own listener "
                         "checks the client certificate under any engine) or server.engine=gunicorn")
        if s.tls_client_ca and not any_cert:
            p.append("server.tls_client_ca needs server.tls_cert and server.tls_key (client certificates need TLS)")
        if bool(s.tls_cert) != bool(s.tls_key):
            p.append("server.tls_cert and server.tls_key must be given together")
        if s.webhook_bind and not (s.webhook_tls_cert and s.webhook_tls_key):
            p.append("server.webhook_bind needs server.webhook_tls_cert and server.webhook_tls_key (the API server "
                     "calls admission webhooks over HTTPS only)")
        if bool(s.webhook_tls_cert) != bool(s.webhook_tls_key):
            p.append("server.webhook_tls_cert and server.webhook_tls_key must be given together")
        if bool(s.scheduler_tls_cert) != bool(s.scheduler_tls_key):
            p.append("server.scheduler_tls_cert and server.scheduler_tls_key must be given together")
        if s.scheduler_bind:
            host, _, port = s.scheduler_bind.rpartition(":")
            if not host or not ascii_digits(port) or not 0 < int(port) < 65536:
                p.append(f"server.scheduler_bind must be HOST:PORT with a port in 1..65535 (or empty), "
                         f"got {s.scheduler_bind!r}")
            elif s.scheduler_bind == s.bind:
                p.append(f"server.scheduler_bind must differ from server.bind, both are {s.bind!r}")
        if s.webhook_bind:
            host, _, port = s.webhook_bind.rpartition(":")
            if not host or not ascii_digits(port) or not 0 < int(port) < 65536:
                p.append(f"server.webhook_bind must be HOST:PORT with a port in 1..65535 (or empty), "
                         f"got {s.webhook_bind!r}")
            elif s.webhook_bind in (s.bind, s.scheduler_bind):
                p.append(f"server.webhook_bind must differ from server.bind and server.scheduler_bind, "
                         f"got {s.webhook_bind!r}")
        _within(p, "server.scheduler_max_connections", s.scheduler_max_connections, 1, 65_536)
        for name in ("tls_cert", "tls_key", "tls_client_ca", "scheduler_tls_cert", "scheduler_tls_key",
                     "webhook_tls_cert", "webhook_tls_key"):
            value = getattr(s, name)
            if value and not Path(value).is_file():
                p.append(f"server.{name} must be a readable file, got {value!r}")
        if s.log_level.lower() not in ("debug", "info", "warning", "error"):
            p.append(f"server.log_level must be one of debug, info, warning, error, got {s.log_level!r}")
        _positive(p, "policy.telemetry_ttl_s", pol.telemetry_ttl_s)
        if not 0.0 <= pol.spread_priority <= 45.0:
            p.append(f"policy.spread_priority must be in [0, 45], got {pol.spread_priority}")
        if not 0.0 <= pol.fragmentation_weight <= 1.0:
            p.append(f"policy.fragmentation_weight must be in [0, 1], got {pol.fragmentation_weight}")
        if pol.filter_shortlist < 0:
            p.append(f"policy.filter_shortlist must be >= 0 (0: off), got {pol.filter_shortlist}")
        if not pol.sharing_move_after_s >= 0:  # NaN fails too
            p.append(f"policy.sharing_move_after_s must be >= 0, got {pol.sharing_move_after_s}")
        if pol.usage_warmup_s < 0:
            p.append(f"policy.usage_warmup_s must be >= 0, got {pol.usage_warmup_s}")
        if pol.usage_plateau_s < 0:
            p.append(f"policy.usage_plateau_s must be >= 0, got {pol.usage_plateau_s}")
        _positive(p, "policy.usage_plateau_samples", pol.usage_plateau_samples)
        if not 1.0 <= pol.usage_margin <= 10.0:
            p.append(f"policy.usage_margin must be in [1, 10], got {pol.usage_margin}")
        if pol.min_reservation_mib < 0:
            p.append(f"policy.min_reservation_mib must be >= 0, got {pol.min_reservation_mib}")
        _positive(p, "policy.size_scale_gpu_s", pol.size_scale_gpu_s)
        _positive(p, "policy.peak_store_size", pol.peak_store_size)
        levels = ", ".join(CRITICALITIES)
        if pol.default_criticality_ceiling not in CRITICALITIES:
            p.append(f"policy.default_criticality_ceiling must be one of {levels}, "
                     f"got {pol.default_criticality_ceiling!r}")
        for ns, level in pol.namespace_criticality_ceilings.items():
            if level not in CRITICALITIES:
                p.append(f"policy.namespace_criticality_ceilings.{ns} must be one of {levels}, got {level!r}")
        _within(p, "policy.default_gpu_share_floor", pol.default_gpu_share_floor, 0.0, 1.0)
        _within(p, "policy.slowdown_error_exponent", pol.slowdown_error_exponent, 1.0, 4.0)
        _within(p, "policy.share_memory_margin", pol.share_memory_margin, 0.0, 1.0)
        if pol.bound_beyond_gpus not in BOUND_BEYOND_GPUS:
            p.append(f"policy.bound_beyond_gpus must be whole-gpu, point or wait, got {pol.bound_beyond_gpus!r}")
        for ns, floor in pol.namespace_gpu_share_floors.items():
            _within(p, f"policy.namespace_gpu_share_floors.{ns}", floor, 0.0, 1.0)
        if not k.scheduler_name:
            p.append("kube.scheduler_name must not be empty")
        _positive(p, "kube.resync_s", k.resync_s)
        _positive(p, "kube.preemption_grace_s", k.preemption_grace_s)
        _positive(p, "kube.api_timeout_s", k.api_timeout_s)
        _positive(p, "kube.local_expiry_s", k.local_expiry_s)
        _within(p, "kube.allocation_wait_s", k.allocation_wait_s, 0.0, 60.0)
        if k.mutation_wiring not in ("device-plugin", "env"):
            p.append(f"kube.mutation_wiring must be device-plugin or env, got {k.mutation_wiring!r}")
        if not k.device_resource or "/" not in k.device_resource:
            p.append(f"kube.device_resource must be an extended resource name (domain/name), got {k.device_resource!r}")
        _within(p, "kube.telemetry_quorum", k.telemetry_quorum, 0.0, 1.0)
        _within(p, "kube.telemetry_grace_s", k.telemetry_grace_s, 0.0, math.inf)
        _within(p, "policy.calibration_settle_s", pol.calibration_settle_s, 0.0, math.inf)
        _positive(p, "policy.correction_min_pods", pol.correction_min_pods)
        _positive(p, "policy.correction_min_nodes", pol.correction_min_nodes)
        if k.token_cache_s < 0:
            p.append(f"kube.token_cache_s must be >= 0, got {k.token_cache_s}")
        if t.telemetry_token_file and not Path(t.telemetry_token_file).is_file():
            p.append(f"telemetry.telemetry_token_file must be a readable file, got {t.telemetry_token_file!r}")
        _positive(p, "telemetry.telemetry_max_bytes", t.telemetry_max_bytes)
        _positive(p, "recent_pods", self.recent_pods)
        if self.predictor_factory and ":" not in self.predictor_factory:
            p.append(f"predictor_factory must be module:callable, got {self.predictor_factory!r}")
        return p

    def telemetry_token_value(self) -> str:
        """The shared telemetry token (file wins over the inline value), stripped."""
        if self.telemetry.telemetry_token_file:
            return Path(self.telemetry.telemetry_token_file).read_text(encoding="utf-8").strip()
        return self.telemetry.telemetry_token.strip()


def leaf_paths() -> dict[str, tuple[str, ...]]:
    """Leaf name -> its path in the tree (`telemetry_ttl_s` -> ("policy", "telemetry_ttl_s"))."""
    out: dict[str, tuple[str, ...]] = {}
    for f in fields(Settings):
        section_type = _section_type(f)
        if section_type is None:
            out[f.name] = (f.name,)
        else:
            for leaf in fields(section_type):
                out[leaf.name] = (f.name, leaf.name)
    return out


def load_settings(
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """defaults < YAML file < env (`DEEPRES_<LEAF>`) < overrides (command-line flags, by leaf name).

    Raises SettingsError listing every problem (unknown keys, wrong types, invalid values).
    """
    settings = Settings()
    problems: list[str] = []
    paths = leaf_paths()
    if config_file:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise SettingsError([f"--config {config_file}: {err}"]) from None
        if not isinstance(loaded, dict):
            raise SettingsError([f"--config {config_file}: must be a mapping of settings, got {type(loaded).__name__}"])
        for key, value in loaded.items():
            section = _section_of(settings, str(key))
            if section is not None and isinstance(value, dict):
                for leaf, leaf_value in value.items():
                    path = paths.get(str(leaf))
                    if path is None or path[0] != key:
                        problems.append(f"{key}.{leaf}: unknown setting")
                        continue
                    _assign(settings, path, leaf_value, problems, from_text=False)
            elif str(key) in paths:
                _assign(settings, paths[str(key)], value, problems, from_text=False)
            else:
                problems.append(f"{key}: unknown setting (known: {', '.join(sorted(paths))})")
    for name, value in (env if env is not None else os.environ).items():
        if not name.startswith(ENV_PREFIX):
            continue
        leaf = name[len(ENV_PREFIX):].lower()
        if leaf in paths:
            _assign(settings, paths[leaf], value, problems, from_text=True, origin=name)
    for leaf, value in (overrides or {}).items():
        if value is not None:
            _assign(settings, paths[leaf], value, problems, from_text=False)
    problems.extend(settings.validate())
    if problems:
        raise SettingsError(problems)
    return settings


def describe(settings: Settings) -> str:
    """One line of the effective settings for the start-up log (the token is never printed)."""
    flat = []
    for leaf, path in sorted(leaf_paths().items()):
        value = _get(settings, path)
        if leaf == "telemetry_token":
            value = "<set>" if value else ""
        flat.append(f"{leaf}={value}")
    return " ".join(flat)


def _section_type(f: dataclasses.Field[Any]) -> type | None:
    hints = typing.get_type_hints(Settings)
    hint = hints[f.name]
    return hint if dataclasses.is_dataclass(hint) and isinstance(hint, type) else None


def _section_of(settings: Settings, key: str) -> Any:
    value = getattr(settings, key, None)
    return value if dataclasses.is_dataclass(value) else None


def _get(settings: Settings, path: tuple[str, ...]) -> Any:
    obj: Any = settings
    for part in path:
        obj = getattr(obj, part)
    return obj


def _assign(settings: Settings, path: tuple[str, ...], value: Any, problems: list[str], *, from_text: bool,
            origin: str = "") -> None:
    owner: Any = settings
    for part in path[:-1]:
        owner = getattr(owner, part)
    leaf = path[-1]
    hint = typing.get_type_hints(type(owner))[leaf]
    where = origin or ".".join(path)
    try:
        setattr(owner, leaf, _coerce(hint, value, from_text))
    except (TypeError, ValueError) as err:
        problems.append(f"{where}: {err}")


def _coerce(hint: Any, value: Any, from_text: bool) -> Any:
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.strip().lower() in ("1", "true", "yes", "on")
        raise ValueError(f"must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ValueError(f"must be a whole number, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and ascii_digits(value.strip().lstrip("-")):
            return int(value.strip())
        raise ValueError(f"must be a whole number, got {value!r}")
    if hint is float:
        if isinstance(value, bool):
            raise ValueError(f"must be a number, got {value!r}")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"must be a string, got {value!r}")
    if origin is dict or origin is list:
        if from_text and isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else ({} if origin is dict else [])
        if origin is dict and isinstance(value, dict):
            value_hint = typing.get_args(hint)[1] if typing.get_args(hint) else str
            try:  # each value as its declared type (dict[str, float]: a namespace's share floor)
                return {str(k): _coerce(value_hint, v, True) for k, v in value.items()}
            except ValueError as err:
                raise ValueError(f"must be a mapping of {value_hint.__name__}, got {value!r}: {err}") from None
        if origin is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        kind = "a mapping of strings" if origin is dict else "a list of strings"
        raise ValueError(f"must be {kind}, got {value!r}")
    if isinstance(hint, types.UnionType):  # pragma: no cover - no optional leaves today
        raise TypeError(f"unsupported setting type {hint}")
    raise TypeError(f"unsupported setting type {hint}")


def _within(problems: list[str], path: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        problems.append(f"{path} must be {bounds}, got {value}")


def _positive(problems: list[str], path: str, value: float) -> None:
    if not value > 0:
        problems.append(f"{path} must be > 0, got {value}")

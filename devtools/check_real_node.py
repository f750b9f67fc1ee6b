"""Independent check of the real node of `make cluster` (issue #44's Done-when).

Bursts of deepres pods, foreign pods and an agent restart on `deepres-real-0`; every deepres pod
that runs must see exactly its `deepres.io/assigned-gpus` under /var/run/nvidia-container-devices,
and no foreign pod may see any GPU. Written from the docs only (docs/device-plugin.md,
docs/getting-started.md "A real node in the local cluster", docs/data-scientist.md).

    KUBECONFIG=.cluster/admin.kubeconfig .venv/bin/python -m devtools.check_real_node

Findings go to reports/real-node-check.json. Every wait has a deadline; pods are deleted at the end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parent.parent
KUBECONFIG = os.environ.get("KUBECONFIG", str(ROOT / ".cluster" / "admin.kubeconfig"))
REPORT = ROOT / "reports" / "real-node-check.json"
JOBS_NS = "deepres-e2e-jobs"
FOREIGN_NS = "deepres-check-foreign"
RELEASE_NS = "deepres"
NODE = "deepres-real-0"
IMAGE = "localhost/deepres-test/busybox:1"
RES = "deepres.io/gpu"
LABEL = "deepres-check"
RUN_ID = uuid.uuid4().hex[:6]
MARK = "DEVICES-END"
DEVDIR = "/var/run/nvidia-container-devices"
# containers hold their GPUs this long then exit 0: deepres does not share a busy GPU for these jobs
# (sharing.maxSlowdown), so a burst larger than the node's 8 GPUs drains in waves
HOLD_S = 8

kube_config: Any = config
kube_config.load_kube_config(KUBECONFIG)
core: Any = client.CoreV1Api()
notes: list[str] = []


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def log(msg: str) -> None:
    print(f"[{now()}] {msg}", flush=True)


def container(gpu_limit: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": [
            "sh",
            "-c",
            f"echo DEVICES-BEGIN; ls {DEVDIR} 2>&1; echo NVD=$NVIDIA_VISIBLE_DEVICES; echo {MARK}; sleep {HOLD_S}",
        ],
    }
    if gpu_limit is not None:
        c["resources"] = {"limits": {RES: str(gpu_limit)}, "requests": {RES: str(gpu_limit)}}
    return c


PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"deepres.io/real-node": "true"},
    "tolerations": [
        {"key": "deepres.io/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ],
}


def deepres_pod(name: str, gpus: int, phase: str) -> dict[str, Any]:
    ann = {"deepres.io/gpu-memory": "4Gi"}
    if gpus > 1:
        ann["deepres.io/gpus"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": ann,
            "labels": {LABEL: RUN_ID, "phase": phase},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [container()],
            **PLACEMENT,
        },
    }


def create(ns: str, body: dict[str, Any]) -> tuple[bool, str]:
    try:
        core.create_namespaced_pod(ns, body)
        return True, ""
    except ApiException as e:
        try:
            err_body: Any = e.body
            msg = json.loads(err_body).get("message", err_body)
        except Exception:
            msg = str(e.body)
        return False, f"{e.status}: {msg}"


def parse_devices(text: str) -> list[str] | None:
    if MARK not in text or "DEVICES-BEGIN" not in text:
        return None
    body = text.split("DEVICES-BEGIN", 1)[1].split(MARK, 1)[0]
    out = []
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith("NVD="):
            continue
        if "No such file" in line or line.startswith("ls:"):
            continue
        out.extend(line.split())
    return sorted(out)


def nvd_of(text: str) -> str | None:
    m = re.search(r"^NVD=(.*)$", text, re.M)
    return m.group(1) if m else None


def assigned_of(pod: Any) -> list[str] | None:
    a = (pod.metadata.annotations or {}).get("deepres.io/assigned-gpus")
    if a is None:
        return None
    return sorted(x.strip() for x in re.split(r"[,\s]+", a) if x.strip())


def pod_state(ns: str, name: str) -> dict[str, Any]:
    """One observation: phase, reason, devices seen (once the log has the marker)."""
    try:
        p = core.read_namespaced_pod(name, ns)
    except ApiException as e:
        if e.status == 404:
            return {"name": name, "gone": True, "done": True}
        raise
    st: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "phase": p.status.phase,
        "reason": p.status.reason,
        "message": p.status.message,
        "node": p.spec.node_name,
        "scheduler": p.spec.scheduler_name,
        "assigned": assigned_of(p),
        "requests": {
            c.name: (c.resources.limits or {}).get(RES) if c.resources else None for c in p.spec.containers
        },
        "done": False,
    }
    if p.status.phase in ("Failed", "Succeeded"):
        st["done"] = True
    cs = (p.status.container_statuses or [])
    if cs and cs[0].state and cs[0].state.waiting:
        st["waiting"] = f"{cs[0].state.waiting.reason}: {cs[0].state.waiting.message}"
    if p.status.phase == "Running" or (cs and (cs[0].state.running or cs[0].state.terminated)):
        try:
            text = core.read_namespaced_pod_log(name, ns, container="main")
        except ApiException as e:
            text = ""
            st["log_error"] = f"{e.status}"
        seen = parse_devices(text)
        if seen is not None:
            st["seen"] = seen
            st["nvd"] = nvd_of(text)
            st["log"] = text.strip()[:2000]
            st["done"] = True
    return st


def wait_pods(ns: str, names: list[str], deadline_s: float) -> dict[str, dict[str, Any]]:
    end = time.monotonic() + deadline_s
    states: dict[str, dict[str, Any]] = {}
    pending = list(names)
    while pending and time.monotonic() < end:
        nxt = []
        for n in pending:
            s = pod_state(ns, n)
            states[n] = s
            if not s["done"]:
                nxt.append(n)
        pending = nxt
        if pending:
            time.sleep(1.0)  # polling interval, not proof: every outcome is an observed state
    for n in pending:
        states[n]["timed_out"] = True
    return states


def events_for(ns: str, name: str) -> list[str]:
    try:
        ev = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    except ApiException:
        return []
    return [f"{e.type} {e.reason}: {e.message}" for e in ev.items]


def classify(states: dict[str, dict[str, Any]], ns: str = JOBS_NS) -> dict[str, Any]:
    out: dict[str, Any] = {
        "created": len(states),
        "running_exact": 0,
        "running_wrong": 0,
        "failed": [],
        "not_started": [],
        "wrong": [],
        "pods": {},
    }
    for n, s in states.items():
        out["pods"][n] = {
            k: s.get(k)
            for k in ("phase", "reason", "message", "node", "assigned", "seen", "nvd", "waiting", "timed_out")
        }
        if "seen" in s:
            if s.get("assigned") is not None and s["seen"] == s["assigned"]:
                out["running_exact"] += 1
            else:
                out["running_wrong"] += 1
                out["wrong"].append({"pod": n, "assigned": s.get("assigned"), "seen": s["seen"]})
        elif s.get("phase") == "Failed" or s.get("gone"):
            out["failed"].append(
                {
                    "pod": n,
                    "reason": s.get("reason"),
                    "message": s.get("message"),
                    "assigned": s.get("assigned"),
                    "events": events_for(ns, n)[-6:],
                }
            )
        else:
            out["not_started"].append(
                {
                    "pod": n,
                    "phase": s.get("phase"),
                    "node": s.get("node"),
                    "waiting": s.get("waiting"),
                    "assigned": s.get("assigned"),
                    "events": events_for(ns, n)[-6:],
                }
            )
    return out


def node_gpus() -> list[str] | None:
    """GPU UUIDs the node's agent publishes, if any annotation names them (informational)."""
    n = core.read_node(NODE)
    ann = n.metadata.annotations or {}
    found = set()
    for v in ann.values():
        for m in re.finditer(r"GPU-[0-9a-fA-F-]{8,}", v):
            found.add(m.group(0))
    return sorted(found) or None


# --------------------------------------------------------------------------- phases


def phase_burst() -> dict[str, Any]:
    names = []
    for i in range(18):
        names.append((f"chk-{RUN_ID}-b1-{i:02d}", 1))
    for i in range(4):
        names.append((f"chk-{RUN_ID}-b2-{i:02d}", 2))
    t0 = time.monotonic()
    create_errors = {}
    for n, g in names:
        ok, err = create(JOBS_NS, deepres_pod(n, g, "burst"))
        if not ok:
            create_errors[n] = err
    log(f"burst: created {len(names) - len(create_errors)} pods ({len(create_errors)} refused)")
    states = wait_pods(JOBS_NS, [n for n, _ in names if n not in create_errors], 360)
    res = classify(states)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    res["create_refused"] = create_errors
    res["multi_gpu_sizes_ok"] = all(
        (s.get("assigned") is None) or len(s["assigned"]) == g
        for (n, g) in names
        if (s := states.get(n))
    )
    return res


def foreign_bodies(ns: str) -> list[tuple[str, dict[str, Any]]]:
    """The pods deepres did not bind, as a tenant would write them: (name, body)."""
    tolerations = {"tolerations": PLACEMENT["tolerations"]}
    kinds: list[tuple[str, dict[str, Any], int | None]] = [
        # 1. the default scheduler, a deepres.io/gpu limit and the node's placement
        ("defsched", {"schedulerName": "default-scheduler", **PLACEMENT}, 1),
        # 2. spec.nodeName with a deepres.io/gpu limit (skips every scheduler)
        ("nodename", {"nodeName": NODE, **tolerations}, 1),
        # 3. schedulerName deepres-scheduler with spec.nodeName and a limit (claims the scheduler, skips it)
        ("nodename-ds", {"schedulerName": "deepres-scheduler", "nodeName": NODE, **tolerations}, 1),
        # 4. a plain pod with no GPU request on the node (must see no device at all)
        ("plain", dict(PLACEMENT), None),
    ]
    out: list[tuple[str, dict[str, Any]]] = []
    for suffix, placement, gpus in kinds:
        name = f"chk-{RUN_ID}-f-{suffix}"
        out.append((name, {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "labels": {LABEL: RUN_ID, "phase": "foreign"}},
                           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                    "containers": [container(gpus)], **placement}}))
    return out


def phase_foreign() -> list[dict[str, Any]]:
    try:
        core.create_namespace({"metadata": {"name": FOREIGN_NS, "labels": {LABEL: RUN_ID}}})
    except ApiException as e:
        if e.status != 409:
            raise
    results = []
    # a couple of deepres pods beside them, so a foreign pod waits next to deepres pods
    side = [f"chk-{RUN_ID}-fs-{i}" for i in range(3)]
    for n in side:
        create(JOBS_NS, deepres_pod(n, 1, "foreign-side"))
    admitted: list[tuple[str, str]] = []
    for ns in (JOBS_NS, FOREIGN_NS):
        for n, body in foreign_bodies(ns):
            ok, err = create(ns, body)
            entry = {"namespace": ns, "pod": n, "admitted": ok, "refusal": err or None}
            results.append(entry)
            if ok:
                admitted.append((ns, n))
            log(f"foreign {ns}/{n}: {'admitted' if ok else 'refused ' + err[:160]}")
    # wait for each admitted foreign pod to start or fail (deadline); unscheduled ones time out
    for ns, n in admitted:
        st = wait_pods(ns, [n], 60)[n]
        entry = next(e for e in results if e["namespace"] == ns and e["pod"] == n)
        entry.update(
            {
                "phase": st.get("phase"),
                "reason": st.get("reason"),
                "message": st.get("message"),
                "node": st.get("node"),
                "seen": st.get("seen"),
                "nvd": st.get("nvd"),
                "waiting": st.get("waiting"),
                "timed_out": st.get("timed_out", False),
                "requests_gpu": any(v for v in (st.get("requests") or {}).values()),
                "saw_gpu": bool(st.get("seen")),
                "events": events_for(ns, n)[-6:],
            }
        )
    side_states = wait_pods(JOBS_NS, side, 180)
    results.append({"side_deepres_pods": classify(side_states)})
    return results


def agent_pod() -> str | None:
    pods = core.list_namespaced_pod(RELEASE_NS, label_selector="deepres.io/agent-for=real-node").items
    live = [p for p in pods if not p.metadata.deletion_timestamp]
    return live[0].metadata.name if live else None


def wait_agent_ready(old: str | None, deadline_s: float) -> tuple[str | None, float]:
    t0 = time.monotonic()
    end = t0 + deadline_s
    while time.monotonic() < end:
        for p in core.list_namespaced_pod(RELEASE_NS, label_selector="deepres.io/agent-for=real-node").items:
            if p.metadata.name == old or p.metadata.deletion_timestamp:
                continue
            conds = {c.type: c.status for c in (p.status.conditions or [])}
            if p.status.phase == "Running" and conds.get("Ready") == "True":
                return p.metadata.name, round(time.monotonic() - t0, 1)
        time.sleep(1.0)
    return None, round(time.monotonic() - t0, 1)


def wait_allocatable(deadline_s: float) -> str | None:
    end = time.monotonic() + deadline_s
    val: str | None = None
    while time.monotonic() < end:
        val = cast("str | None", (core.read_node(NODE).status.allocatable or {}).get(RES))
        if val and val != "0":
            return val
        time.sleep(1.0)
    return val


def phase_restart() -> dict[str, Any]:
    res: dict[str, Any] = {}
    old = agent_pod()
    res["old_agent"] = old
    before = [(f"chk-{RUN_ID}-r1-{i:02d}", 2 if i % 4 == 3 else 1) for i in range(8)]
    after = [(f"chk-{RUN_ID}-r2-{i:02d}", 2 if i % 4 == 3 else 1) for i in range(8)]
    for n, g in before:
        create(JOBS_NS, deepres_pod(n, g, "restart-before"))
    # mid-burst: wait until at least a couple of the first pods are bound (with a deadline), then kill
    end = time.monotonic() + 30
    while time.monotonic() < end:
        bound = sum(1 for n, _ in before if core.read_namespaced_pod(n, JOBS_NS).spec.node_name)
        if bound >= 2:
            break
        time.sleep(0.2)
    res["bound_before_delete"] = bound
    core.delete_namespaced_pod(old, RELEASE_NS, grace_period_seconds=0)
    res["agent_deleted_at"] = now()
    log(f"restart: deleted agent {old} with {bound} of {len(before)} first pods bound")
    for n, g in after:
        create(JOBS_NS, deepres_pod(n, g, "restart-after"))
    new, took = wait_agent_ready(old, 180)
    res["new_agent"] = new
    res["new_agent_ready_after_s"] = took
    res["allocatable_after"] = wait_allocatable(60)
    log(f"restart: new agent {new} ready after {took}s; allocatable {res['allocatable_after']}")
    states = wait_pods(JOBS_NS, [n for n, _ in before + after], 360)
    res["pods"] = classify(states)
    # afterwards, a new pod must run with its GPUs
    final = f"chk-{RUN_ID}-r3-final"
    create(JOBS_NS, deepres_pod(final, 1, "restart-final"))
    fs = wait_pods(JOBS_NS, [final], 180)
    res["final_pod"] = classify(fs)
    res["final_pod_ok"] = res["final_pod"]["running_exact"] == 1
    return res


def cross_check(all_states: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GPU: pods assigned it vs pods that saw it; they must be the same sets."""
    assigned_by = defaultdict(set)
    seen_by = defaultdict(set)
    for block in all_states:
        for n, p in block.items():
            if p.get("seen") is None:
                continue
            for g in p.get("assigned") or []:
                assigned_by[g].add(n)
            for g in p["seen"]:
                seen_by[g].add(n)
    mism = {}
    for g in set(assigned_by) | set(seen_by):
        if assigned_by[g] != seen_by[g]:
            mism[g] = {
                "assigned_to": sorted(assigned_by[g]),
                "seen_by": sorted(seen_by[g]),
            }
    return {
        "gpus_in_use": len(set(seen_by)),
        "pods_per_gpu_seen": {g: len(v) for g, v in sorted(seen_by.items())},
        "mismatches": mism,
    }


def cleanup() -> None:
    for ns in (JOBS_NS, FOREIGN_NS):
        try:
            core.delete_collection_namespaced_pod(
                ns, label_selector=f"{LABEL}={RUN_ID}", grace_period_seconds=0
            )
        except ApiException as e:
            if e.status != 404:
                log(f"cleanup {ns}: {e.status}")
    end = time.monotonic() + 120
    while time.monotonic() < end:
        left = len(core.list_namespaced_pod(JOBS_NS, label_selector=f"{LABEL}={RUN_ID}").items)
        with contextlib.suppress(ApiException):
            left += len(core.list_namespaced_pod(FOREIGN_NS, label_selector=f"{LABEL}={RUN_ID}").items)
        if left == 0:
            break
        time.sleep(1.0)
    else:
        notes.append(f"cleanup: {left} pods still present after 120 s")
    with contextlib.suppress(ApiException):
        core.delete_namespace(FOREIGN_NS)


def main() -> int:
    report: dict[str, Any] = {"checked_at": now(), "run_id": RUN_ID, "node": NODE, "notes": notes}
    try:
        report["node_gpus_from_annotations"] = node_gpus()
        report["node_allocatable_before"] = (core.read_node(NODE).status.allocatable or {}).get(RES)
        log("phase 1: burst")
        report["bursts"] = phase_burst()
        b = report["bursts"]
        log(f"burst: exact {b['running_exact']} wrong {b['running_wrong']} failed {len(b['failed'])} "
            f"not started {len(b['not_started'])} in {b['elapsed_s']}s")
        log("phase 2: foreign")
        report["foreign"] = phase_foreign()
        log("phase 3: agent restart")
        report["agent_restart"] = phase_restart()
        r = report["agent_restart"]
        log(f"restart: exact {r['pods']['running_exact']} wrong {r['pods']['running_wrong']} "
            f"failed {len(r['pods']['failed'])} not started {len(r['pods']['not_started'])}; "
            f"final ok {r['final_pod_ok']}")
        blocks = [report["bursts"]["pods"], report["agent_restart"]["pods"]["pods"],
                  report["agent_restart"]["final_pod"]["pods"]]
        side = next((x["side_deepres_pods"] for x in report["foreign"] if "side_deepres_pods" in x), None)
        if side:
            blocks.append(side["pods"])
        report["cross_check"] = cross_check(blocks)
        node_uuids = report.get("node_gpus_from_annotations")
        if node_uuids:
            stray = sorted({g for bl in blocks for p in bl.values() for g in (p.get("seen") or [])} - set(node_uuids))
            report["cross_check"]["seen_not_on_node"] = stray
    except Exception as e:  # keep the findings so far
        import traceback

        notes.append(f"check aborted: {e!r}")
        report["traceback"] = traceback.format_exc()
    finally:
        log("cleanup")
        cleanup()

    wrong = 0
    for key in ("bursts",):
        if key in report:
            wrong += report[key]["running_wrong"]
    ar = report.get("agent_restart")
    if ar:
        wrong += ar["pods"]["running_wrong"] + ar["final_pod"]["running_wrong"]
    foreign_served = [
        f for f in report.get("foreign", []) if f.get("pod") and f.get("saw_gpu")
    ]
    foreign_gpu_running = [
        f for f in report.get("foreign", [])
        if f.get("pod") and f.get("requests_gpu") and f.get("phase") == "Running"
    ]
    side = next((x["side_deepres_pods"] for x in report.get("foreign", []) if "side_deepres_pods" in x), None)
    if side:
        wrong += side["running_wrong"]
    holds = (
        "traceback" not in report
        and wrong == 0
        and not foreign_served
        and not foreign_gpu_running
        and not report.get("cross_check", {}).get("mismatches")
        and bool(ar and ar.get("final_pod_ok"))
    )
    # pods that neither ran nor failed within the deadline, or failed: the claim says "every deepres pod
    # started with exactly its assigned GPUs"; a failed deepres pod did not start, note it
    unstarted = len(report.get("bursts", {}).get("failed", [])) + len(report.get("bursts", {}).get("not_started", []))
    if ar:
        unstarted += len(ar["pods"]["failed"]) + len(ar["pods"]["not_started"])
    if side:
        unstarted += len(side["failed"]) + len(side["not_started"])
    if unstarted:
        notes.append(
            f"{unstarted} deepres pods did not start (failed or not started by the deadline); see failed/not_started"
        )
    if report.get("bursts") and (report["bursts"]["failed"] or report["bursts"]["not_started"]):
        holds = False
        notes.append("burst pods that did not start without an agent restart or foreign pod: the claim fails")
    report["verdict"] = "holds" if holds else "fails"
    report["finished_at"] = now()
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps(
        {
            "verdict": report["verdict"],
            "bursts": {
                k: report.get("bursts", {}).get(k)
                for k in ("created", "running_exact", "running_wrong", "elapsed_s")
            }
            | {"failed": len(report.get("bursts", {}).get("failed", [])),
               "not_started": len(report.get("bursts", {}).get("not_started", []))},
            "foreign": [
                {k: f.get(k) for k in ("namespace", "pod", "admitted", "phase", "reason", "saw_gpu")}
                | {"refusal": (f.get("refusal") or "")[:140]}
                for f in report.get("foreign", []) if f.get("pod")
            ],
            "agent_restart": ar and {
                "running_exact": ar["pods"]["running_exact"],
                "running_wrong": ar["pods"]["running_wrong"],
                "failed": [(x["pod"], x["reason"]) for x in ar["pods"]["failed"]],
                "not_started": [x["pod"] for x in ar["pods"]["not_started"]],
                "final_pod_ok": ar["final_pod_ok"],
                "new_agent_ready_after_s": ar.get("new_agent_ready_after_s"),
            },
            "cross_check_mismatches": report.get("cross_check", {}).get("mismatches"),
            "notes": notes,
        },
        indent=2,
        default=str,
    ))
    print(f"report: {REPORT}")
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())

"""The online calibration kept in a ConfigMap with the API server (extender/calibration_store.py's
`Keeper`): one key, `calibration.json`, the store's payload (the most recent observed pods).

Written by the calibration store's own thread, never by a verb. A write replaces the ConfigMap at
the resourceVersion last read or written; a 409 (another extender wrote it since, or it was created
meanwhile) reads it again, merges its pods with ours and retries, CONFLICT_RETRIES times. A payload
over MAX_BYTES drops its oldest pods until it fits (a ConfigMap holds 1 MiB). The chart grants get,
create and update on this one ConfigMap in the release namespace (helm/deepres/templates/extender/rbac.yaml).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from extender.kube.cluster import ConflictError

log = logging.getLogger(__name__)

KEY = "calibration.json"
#: Largest `calibration.json` written (the API server refuses a ConfigMap above 1 MiB).
MAX_BYTES = 900_000
CONFLICT_RETRIES = 3
LABELS = {"app.kubernetes.io/managed-by": "deepres-extender", "app.kubernetes.io/component": "calibration"}


class ConfigMapApi(Protocol):
    def read_config_map(self, namespace: str, name: str) -> tuple[str, dict[str, str]] | None: ...

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], resource_version: str,
                         labels: dict[str, str] | None = None) -> str: ...


class ConfigMapKeeper:
    """The store's payload in ConfigMap `namespace/name`."""

    def __init__(self, api: ConfigMapApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.where = f"configmap {namespace}/{name}"
        self._version = ""  # "" : not read yet or absent (create)

    def read(self) -> dict[str, Any] | None:
        found = self.api.read_config_map(self.namespace, self.name)
        if found is None:
            self._version = ""
            return None
        self._version, data = found
        text = data.get(KEY)
        if not text:
            return None
        try:
            payload: Any = json.loads(text)
        except ValueError as err:
            log.error("calibration: %s holds no JSON in %s (%s); it is overwritten at the next write",
                      self.where, KEY, err)
            return None
        return payload if isinstance(payload, dict) else None

    def write(self, payload: dict[str, Any], merge: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        for attempt in range(CONFLICT_RETRIES + 1):
            text = bounded(payload)
            try:
                self._version = self.api.write_config_map(self.namespace, self.name, {KEY: text}, self._version,
                                                          dict(LABELS))
                return
            except ConflictError:
                if attempt == CONFLICT_RETRIES:
                    raise
                log.info("calibration: %s changed since it was read; merging and retrying", self.where)
                kept = self.read()
                if kept is not None:
                    payload = merge(kept)


def bounded(payload: dict[str, Any]) -> str:
    """`payload` as JSON of at most MAX_BYTES: its oldest pods dropped until it fits."""
    pods = dict(payload.get("pods") or {})
    while True:
        text = json.dumps({**payload, "pods": pods}, separators=(",", ":"))
        if len(text.encode()) <= MAX_BYTES or not pods:
            return text
        for uid in sorted(pods, key=lambda u: pods[u].get("order", 0.0))[:max(1, len(pods) // 10)]:
            del pods[uid]

"""What a restored reservation may hold: `deepres.io/assigned-gpus` checked against the node and the pod.

After a restart the extender rebuilds its reservations from the pods' annotations
(`server/intake.py`). Only the extender's ServiceAccount may write `deepres.io/assigned-gpus` (the
chart's ValidatingAdmissionPolicy), but the restore must not trust it further than it can check: a
forged or edited list would book GPUs deepres never assigned, GPUs that do not exist, or a GPU beyond
its memory. Three rules, pure (the caller brings the node's GPUs from its telemetry):

- `claimed_gpus`: the list parses (comma-separated, each name as a telemetry GPU uuid: 1 to 256
  printable ASCII characters, no spaces), without repeats, at most `MAX_CLAIMED` names.
- `settle_restored`: once the node has reported, the booking keeps only GPUs of that node, and as many
  as the pod asked for (`deepres.io/gpus`); GPUs on which the node's agent sees the pod's processes are
  kept first and are never dropped (nor are they missing when the list left them out): the agent sees
  where the pod really runs, the annotation only says where it should.
- `overbooked`: restored bookings that together exceed a GPU's memory are taken in bind order (the
  earlier bind, then the earlier creation, wins); each later pod that pushes a GPU past its memory is
  named. The caller keeps its booking (the pod may well run there: freeing it could over-commit the
  GPU) so the GPU shows full and nothing more is admitted on it, and warns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: The most GPU names one `assigned-gpus` may list (the largest `deepres.io/gpus` a pod may ask for).
MAX_CLAIMED = 64
#: A GPU name's length at most (a telemetry GPU uuid's bound, `extender.telemetry.MAX_UUID`).
MAX_NAME = 256
#: MiB a GPU's bookings may exceed its memory by before the later pod is named (rounding of figures).
OVERBOOK_SLACK_MIB = 1.0

#: problem reasons (the metric's `reason` label)
GPU_LIST = "gpu_list"  # the list does not parse, repeats a name, or is too long
UNKNOWN_GPU = "unknown_gpu"  # a name that is no GPU of the node
GPU_COUNT = "gpu_count"  # more or fewer GPUs than the pod asked for
OVERBOOKED = "overbooked"  # the pod's booking takes a GPU past its memory


@dataclass(frozen=True, slots=True)
class Settled:
    """`settle_restored`'s answer: the GPUs to book and what was wrong, as (reason, what) pairs."""

    gpu_uuids: tuple[str, ...]
    problems: tuple[tuple[str, str], ...] = ()


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and name.isascii() and name.isprintable() and " " not in name


def claimed_gpus(text: str) -> Settled:
    """The GPU names of an `assigned-gpus` value, in order, each once; names that cannot be a GPU uuid
    and repeats are left out, the list cut at `MAX_CLAIMED`, each a GPU_LIST problem."""
    names: list[str] = []
    problems: list[tuple[str, str]] = []
    for raw in text.split(",")[:MAX_CLAIMED + 1]:
        name = raw.strip()
        if not _valid_name(name):
            problems.append((GPU_LIST, f"{name[:40]!r} is not a GPU uuid"))
        elif name in names:
            problems.append((GPU_LIST, f"names GPU {name} twice"))
        else:
            names.append(name)
    if len(names) > MAX_CLAIMED:
        problems.append((GPU_LIST, f"names more than {MAX_CLAIMED} GPUs; the first {MAX_CLAIMED} kept"))
        names = names[:MAX_CLAIMED]
    return Settled(tuple(names), tuple(problems[:4]))


def settle_restored(claimed: Sequence[str], wanted: int | None, node: str, node_gpus: Iterable[str],
                    observed: Iterable[str] = ()) -> Settled:
    """The GPUs a restored pod keeps once `node` has reported `node_gpus`: those of `claimed` on the
    node, plus those the agent sees the pod's processes on (`observed`), cut to `wanted` (the pod's
    GPU request; None: unknown, not cut) with the observed ones kept first and never cut."""
    on_node = set(node_gpus)
    seen = [u for u in dict.fromkeys(observed) if u in on_node]
    problems: list[tuple[str, str]] = []
    missing = [u for u in claimed if u not in on_node]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        problems.append((UNKNOWN_GPU, f"names {shown}, not a GPU of node {node}"))
    kept = seen + [u for u in claimed if u in on_node and u not in seen]
    if wanted is not None and len(kept) != wanted:
        cut = kept[:max(wanted, len(seen))]
        what = f"names {len(kept)} GPUs of node {node}, the pod asks for {wanted}"
        if len(cut) < len(kept):
            what += f"; booked {', '.join(cut) or 'none'}"
            if seen:
                what += " (its processes run there)"
        problems.append((GPU_COUNT, what))
        kept = cut
    return Settled(tuple(kept), tuple(problems))


def overbooked(bookings: Iterable[tuple[tuple[float, float, str], str, tuple[str, ...], float]],
               capacity_mib: Mapping[str, float], candidates: Iterable[str]) -> dict[str, tuple[str, float, float]]:
    """The `candidates` (pod uids) whose booking takes a GPU past its memory, taking all `bookings`
    (rank, pod uid, GPU uuids, MiB per GPU) in rank order (the lowest rank first: the earlier bind, then
    the earlier creation, then the uid). Returns uid -> (GPU, MiB booked before it, the GPU's MiB), the
    first GPU it overflows. GPUs without a capacity (not reported) are not judged."""
    judged = set(candidates)
    held: dict[str, float] = {}
    out: dict[str, tuple[str, float, float]] = {}
    for _rank, uid, gpus, mib in sorted(bookings):
        for uuid in gpus:
            before = held.get(uuid, 0.0)
            held[uuid] = before + mib
            cap = capacity_mib.get(uuid)
            if uid in judged and uid not in out and cap is not None and before + mib > cap + OVERBOOK_SLACK_MIB:
                out[uid] = (uuid, before, cap)
    return out

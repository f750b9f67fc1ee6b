"""The family path on held-out architecture groups: `family_path` of reports/predictor.json.

A pod that names no architecture gets the family path. This measures it where the answers are
honest: on the architecture groups a network fitted without them never saw (`deepres train --split
grouped --seed S`, one artifact per seed, the grouped split's ~30% of groups held out whole), with
the traced table read without the job's own group (`predictor.family_table`, `exclude_group`):

- `traced`: the dataset's rows of the held-out groups (at most PER_ARCH per architecture), the label
  the dataset's A100 nvidia-smi calibration of the traced peak; the jobs annotated as a user describes
  a custom model (family fields only, no `activations-millions`: `features.row_spec`);
- `h100`: the real GPU campaign's rows of those groups (NVML per-process peaks,
  predictor/data/measured/), each point read on the H100 line of traced peaks fitted on the measured
  rows of the *other* groups (per precision).

Candidates for the point: `network` (the blended learner, the family point before issue 47's), `table`
(the traced architectures of the same family and size), `blend` (their geometric mean where the table has
the family), `text_table` (the table's for the text families, the network's for the others:
`predictor.family_table.served_point`, served since it won here). The bound: `shipped` is the Demand's
own bound; `earned` multiplies the point by a factor per
(family, batch regime) taken from the held-out residuals of *other* held-out groups (leave one group
out inside the held-out side, every group weighted alike), so no job's bound saw its own group.

`python -m predictor.family_eval --artifacts /tmp/famgrp` (directories s0, s1, ... from `deepres
train --split grouped --seed S --out /tmp/famgrp/sS`) prints the figures and with `--write` merges
`family_path` into reports/predictor.json and writes the served factors (predictor/data/family_bounds.json).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from predictor.family_bounds import BOUNDS_PATH, SMALL_BATCH, regime

REPORT = Path(__file__).resolve().parents[1] / "reports" / "predictor.json"
#: Rows per held-out architecture (its grid has 54-108; a sample keeps big groups from deciding a family).
PER_ARCH = 12




def held_out_groups(seed: int, max_rows: int = 4000) -> set[str]:
    from predictor.splits import grouped_split
    from predictor.trainset import DEFAULT_DATA, load_dataset

    data = load_dataset(DEFAULT_DATA, max_rows, seed)
    split = grouped_split(data.groups, 0.3, seed)
    return set(np.asarray(data.groups)[split.test].astype(str).tolist())


def traced_rows(groups: set[str], seed: int) -> list[dict[str, str]]:
    from predictor.dataset import paths

    by_arch: dict[str, list[dict[str, str]]] = defaultdict(list)
    with gzip.open(paths.JOBS_OUT, "rt", newline="") as handle:
        for r in csv.DictReader(handle):
            if r.get("status") == "ok" and r["group"] in groups and float(r["memory_mib"] or 0) > 0:
                by_arch[r["name"]].append(r)
    rng = np.random.default_rng(seed)
    out: list[dict[str, str]] = []
    for name in sorted(by_arch):
        rows = by_arch[name]
        pick = rng.choice(len(rows), min(PER_ARCH, len(rows)), replace=False)
        out.extend(rows[int(i)] for i in sorted(pick))
    return out


def points(rows: list[dict[str, Any]], artifact: Path) -> dict[str, np.ndarray]:
    """Per row: the family (model-type), the network's point and bound, the table's point (NaN: none)."""
    from predictor import family_point, family_table, features
    from predictor.runtime import Predictor

    predictor = Predictor.load(artifact)
    predictor.family_bounds_path = None  # the previous bound: the artifact's one margin (`earned` is scored here)
    specs = [features.row_spec({k: str(v) for k, v in r.items()}) for r in rows]
    keep = [i for i, s in enumerate(specs) if s is not None]
    demands = predictor.predict_many([s for s in specs if s is not None])
    n = len(rows)
    out: dict[str, np.ndarray] = {"network": np.full(n, np.nan), "network_bound": np.full(n, np.nan),
                                  "table": np.full(n, np.nan), "text_table": np.full(n, np.nan)}
    family = np.full(n, "", dtype=object)
    for i, d in zip(keep, demands, strict=True):
        spec = specs[i]
        assert spec is not None
        family[i] = spec.model_type
        out["network"][i], out["network_bound"][i] = d.memory_mib, d.memory_mib_upper
        tp = family_table.point_of(spec, exclude_group=str(rows[i]["group"]))
        if tp is not None:
            out["table"][i] = tp.memory_mib
        served = family_table.served_point(spec, exclude_group=str(rows[i]["group"]))
        out["text_table"][i] = d.memory_mib if served is None else served.memory_mib
    design = np.zeros((n, len(family_point.NAMES)))
    for i in keep:
        spec = specs[i]
        assert spec is not None
        table = None if np.isnan(out["table"][i]) else float(out["table"][i])
        design[i] = family_point.design(spec.model_type, spec.params_millions, spec.num_layers, spec.input_dim,
                                        spec.batch_size, spec.precision, spec.optimizer, float(out["network"][i]),
                                        table)
    out["design"] = design
    fixed = np.zeros(n)
    ok = [i for i in keep]
    if ok:
        cols = features.columns_from_specs([s for s in specs if s is not None])
        fixed[ok] = features.decomposition(cols, shapes=False).fixed_mib
    out["fixed_traced"] = fixed
    out["blend"] = np.where(np.isnan(out["table"]), out["network"], np.sqrt(out["network"] * out["table"]))
    out["family"] = family.astype(str)
    return out


def earned_factors(log_ratio: np.ndarray, families: np.ndarray, regimes: np.ndarray, groups: np.ndarray,
                   level: float) -> dict[tuple[str, str], float]:
    """log factor per (family, regime) and (family, "any"): the `level` quantile of the rows' log(truth /
    point), each group weighted alike (a group of 300 jobs counts as one of 12)."""
    out: dict[tuple[str, str], float] = {}
    for f in sorted(set(families.tolist())):
        for r in ("small", "large", "any"):
            m = (families == f) & ((regimes == r) if r != "any" else True)
            if m.sum() == 0:
                continue
            out[(f, r)] = weighted_quantile(log_ratio[m], groups[m], level)
    return out


def weighted_quantile(values: np.ndarray, groups: np.ndarray, level: float) -> float:
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    order = np.argsort(values)
    cum = np.cumsum(w[order]) / w.sum()
    j = int(np.searchsorted(cum, level, side="left"))
    return float(values[order][min(j, len(values) - 1)])


#: A (family, regime) factor needs this many groups among the other held-out ones; else the family's
#: pooled regimes, else every family's.
MIN_GROUPS = 3


#: A family's served margin needs this many held-out groups across the seeds; a family with fewer (the text
#: families: 3-4 groups, the torch.nn recurrent stacks: 1) keeps the artifact's own margin.
SERVE_MIN_GROUPS = 5


def factor_for(table: dict[tuple[str, str], float], groups_of: dict[tuple[str, str], int], family: str,
               reg: str, pooled: float) -> float:
    if groups_of.get((family, reg), 0) >= MIN_GROUPS:
        return table[(family, reg)]
    if groups_of.get((family, "any"), 0) >= MIN_GROUPS:
        return table[(family, "any")]
    return pooled


def earned_bounds(point: np.ndarray, truth: np.ndarray, families: np.ndarray, regimes: np.ndarray,
                  groups: np.ndarray, level: float) -> np.ndarray:
    """Each row's bound from the other held-out groups' residuals (leave one group out)."""
    log_ratio = np.log(truth / point)
    bound = np.full(len(point), np.nan)
    for g in sorted(set(groups.tolist())):
        test, other = groups == g, groups != g
        table = earned_factors(log_ratio[other], families[other], regimes[other], groups[other], level)
        groups_of = group_counts(families[other], regimes[other], groups[other])
        pooled = weighted_quantile(log_ratio[other], groups[other], level)
        for i in np.flatnonzero(test):
            q = factor_for(table, groups_of, str(families[i]), str(regimes[i]), pooled)
            bound[i] = point[i] * math.exp(max(q, 0.0))
    return bound


def group_counts(families: np.ndarray, regimes: np.ndarray, groups: np.ndarray) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for f, r, g in zip(families.tolist(), regimes.tolist(), groups.tolist(), strict=True):
        out[(f, r)].add(g)
        out[(f, "any")].add(g)
    return {k: len(v) for k, v in out.items()}


def summary(truth: np.ndarray, point: np.ndarray, bound: np.ndarray) -> dict[str, Any]:
    rel = point / truth - 1.0
    return {"n": len(truth), "median_abs_rel_err": round(float(np.median(np.abs(rel))), 4),
            "p90_abs_rel_err": round(float(np.percentile(np.abs(rel), 90)), 4),
            "median_signed_rel_err": round(float(np.median(rel)), 4),
            "share_above_bound": round(float(np.mean(truth > bound)), 4),
            "median_bound_ratio": round(float(np.median(bound / truth)), 4)}


def h100_line(rows: list[dict[str, Any]], precision: str) -> tuple[float, float]:
    """(context, factor) of measured = context + factor x traced peak over these rows (least squares
    on the relative error, as predictor.dataset.calibration.fit_line)."""
    from predictor.dataset.calibration import fit_line

    use = [r for r in rows if _prec(r["precision"]) == precision] or rows
    line = fit_line([float(r["traced_peak_mib"]) for r in use], [float(r["nvml_process_peak_mib"]) for r in use])
    return float(line.context_mib), float(line.factor)


def _prec(p: str) -> str:
    return {"fp16": "bf16"}.get(p, p)


def evaluate_seed(seed: int, artifact: Path, level: float) -> dict[str, Any]:
    from predictor import gpucal
    from predictor.realjobs import measured

    groups = held_out_groups(seed)
    out: dict[str, Any] = {"seed": seed, "held_out_groups": len(groups)}
    # traced labels
    rows = traced_rows(groups, seed)
    p = points(rows, artifact)
    ok = p["family"] != ""
    truth = np.asarray([float(r["memory_mib"]) for r in rows])[ok]
    fam, grp = p["family"][ok], np.asarray([r["group"] for r in rows])[ok]
    reg = np.asarray([regime(float(r["batch_size"])) for r in rows])[ok]
    fixed = a100_fixed(p["fixed_traced"][ok])
    X, y = p["design"][ok], np.log(truth / p["network"][ok])
    stacked_point = p["network"][ok] * np.exp(stacked(X, y, grp, X, grp))
    out["traced"] = score_all(truth, {**{k: p[k][ok] for k in ("network", "table", "blend", "text_table")},
                                      "stacked": stacked_point}, p["network_bound"][ok], fam, reg, grp, level, fixed)
    out["_needs"] = {"family": fam, "regime": reg, "group": grp, "X": X, "y": y}
    for name, point in (("network", p["network"][ok]), ("stacked", stacked_point), ("text_table", p["text_table"][ok])):
        act = np.maximum(point - fixed, 1e-3 * point)
        out["_needs"][name] = np.log(np.maximum(truth - fixed, 1e-3 * truth) / act)
    # the real H100's peaks
    mrows = with_annotations([r for r in measured() if str(r["group"]) in groups])
    other = [r for r in measured() if str(r["group"]) not in groups]
    mp = points(mrows, artifact)
    ok = mp["family"] != ""
    truth = np.asarray([float(r["nvml_process_peak_mib"]) for r in mrows])[ok]
    fam, grp = mp["family"][ok], np.asarray([str(r["group"]) for r in mrows])[ok]
    reg = np.asarray([regime(float(r["batch_size"])) for r in mrows])[ok]
    lines = {pr: h100_line(other, pr) for pr in ("fp32", "amp", "bf16")}
    prec = np.asarray([_prec(str(r["precision"])) for r in mrows])[ok]

    def on_h100(memory: np.ndarray) -> np.ndarray:
        traced = np.asarray([gpucal.traced_equivalent(m) for m in memory])
        return np.asarray([lines[p_][0] + lines[p_][1] * t for p_, t in zip(prec, traced, strict=True)])

    def on_fixed(traced_fixed: np.ndarray) -> np.ndarray:
        return np.asarray([lines[p_][0] + lines[p_][1] * t for p_, t in zip(prec, traced_fixed, strict=True)])

    # today's served H100 bound: the Demand through the shipped family line (its own margin per precision)
    shipped = np.asarray([gpucal.on_gpu(_demand(m, b), str(r["precision"]), "NVIDIA H100 80GB HBM3", "family")
                          .memory_mib_upper for m, b, r in zip(mp["network"][ok], mp["network_bound"][ok],
                                                                [r for r, k in zip(mrows, ok, strict=True) if k],
                                                                strict=True)])
    h_stacked = mp["network"][ok] * np.exp(stacked(X, y, out["_needs"]["group"], mp["design"][ok], grp))
    out["h100"] = score_all(truth, {**{k: on_h100(mp[k][ok]) for k in ("network", "table", "blend", "text_table")},
                                    "stacked": on_h100(h_stacked)}, shipped, fam, reg, grp, level,
                            on_fixed(mp["fixed_traced"][ok]))
    return out


#: The ridge penalties the inner group folds choose among (`family_point.fit`).
LAMBDAS = (0.3, 3.0, 30.0)
INNER_FOLDS = 5


def choose_lambda(X: np.ndarray, y: np.ndarray, grp: np.ndarray) -> float:
    """The penalty with the least group-weighted median absolute log error over INNER_FOLDS folds of whole groups."""
    from predictor import family_point

    names = sorted(set(grp.tolist()))
    fold = {g: i % INNER_FOLDS for i, g in enumerate(names)}
    f = np.asarray([fold[g] for g in grp.tolist()])
    best, best_err = LAMBDAS[-1], math.inf
    for lam in LAMBDAS:
        err = np.zeros(len(y))
        for k in range(INNER_FOLDS):
            test = f == k
            if test.all() or not test.any():
                continue
            model = family_point.fit(X[~test], y[~test], grp[~test], lam)
            err[test] = np.abs(y[test] - family_point.predict(model, X[test]))
        score = weighted_quantile(err, grp, 0.5)
        if score < best_err:
            best, best_err = lam, score
    return best


def stacked(X: np.ndarray, y: np.ndarray, grp: np.ndarray, X_test: np.ndarray, grp_test: np.ndarray) -> np.ndarray:
    """log corrections of the test rows, each group's from a fit on the training rows of the *other* groups
    (its penalty chosen by inner folds of those groups): no job's correction saw its own group."""
    from predictor import family_point

    out = np.zeros(len(X_test))
    for g in sorted(set(grp_test.tolist())):
        test, train = grp_test == g, grp != g
        model = family_point.fit(X[train], y[train], grp[train], choose_lambda(X[train], y[train], grp[train]))
        out[test] = family_point.predict(model, X_test[test])
    return out


def with_annotations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured rows with their dataset row's annotation columns (model_type, iterations...)."""
    from predictor.dataset import paths

    def key(r: dict[str, Any]) -> tuple[str, int, int, str, str]:
        return (str(r["name"]), int(float(r["batch_size"])), int(float(r["input_dim"])), str(r["precision"]),
                str(r["optimizer"]))

    wanted = {key(r) for r in rows}
    with gzip.open(paths.JOBS_OUT, "rt", newline="") as handle:
        source = {key(r): r for r in csv.DictReader(handle) if r.get("status") == "ok" and key(r) in wanted}
    return [{**source[key(r)], **{k: v for k, v in r.items() if k not in source[key(r)]}}
            for r in rows if key(r) in source]


def a100_fixed(traced_fixed: np.ndarray) -> np.ndarray:
    from predictor import gpucal

    context, factor = gpucal._a100()
    return context + factor * traced_fixed


def _demand(memory: float, upper: float) -> Any:
    from predictor.spec import Demand

    return Demand(float(memory), float(upper), 0.0, 0.0, "family")


def debiased(point: np.ndarray, truth: np.ndarray, fam: np.ndarray, reg: np.ndarray, grp: np.ndarray) -> np.ndarray:
    """The point times the median log(truth / point) of the same family's *other* held-out groups
    (each group weighted alike; the family's regimes pooled)."""
    lr = np.log(truth / point)
    out = point.copy()
    for g in sorted(set(grp.tolist())):
        test = grp == g
        for f in set(fam[test].tolist()):
            m = (fam == f) & (grp != g)
            if len(set(grp[m].tolist())) >= MIN_GROUPS:
                out[test & (fam == f)] *= math.exp(weighted_quantile(lr[m], grp[m], 0.5))
    return out


def act_bounds(point: np.ndarray, fixed: np.ndarray, truth: np.ndarray, fam: np.ndarray, reg: np.ndarray,
               grp: np.ndarray, level: float) -> np.ndarray:
    """The bound on the learned term only (the fixed bytes are exact): fixed + (point - fixed) x e^q, q per
    (family, regime) from the other held-out groups' log((truth - fixed) / (point - fixed))."""
    act = np.maximum(point - fixed, 1e-3 * point)
    need = np.log(np.maximum(truth - fixed, 1e-3 * truth) / act)
    scaled: np.ndarray = earned_bounds(act, np.exp(need) * act, fam, reg, grp, level)
    out: np.ndarray = fixed + scaled
    return out


def score_all(truth: np.ndarray, candidates: dict[str, np.ndarray], shipped_bound: np.ndarray, fam: np.ndarray,
              reg: np.ndarray, grp: np.ndarray, level: float, fixed: np.ndarray | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    candidates = {**candidates, "network_debiased": debiased(candidates["network"], truth, fam, reg, grp)}
    for name, point in list(candidates.items()):
        for variant in ("", "_act") if fixed is not None else ("",):
            earned = (earned_bounds(point, truth, fam, reg, grp, level) if not variant or fixed is None
                      else act_bounds(point, fixed, truth, fam, reg, grp, level))
            entry: dict[str, Any] = {"all": summary(truth, point, earned)}
            for f in sorted(set(fam.tolist())):
                m = fam == f
                entry[f] = {**summary(truth[m], point[m], earned[m]), "groups": len(set(grp[m].tolist()))}
            if name == "network" and not variant:
                entry["shipped_bound"] = {"all": summary(truth, point, shipped_bound),
                                          **{f: summary(truth[fam == f], point[fam == f], shipped_bound[fam == f])
                                             for f in sorted(set(fam.tolist()))}}
            result[name + variant] = entry
    return result


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the docs check reads them: docs/predictor.md names them)."""
    out = argparse.ArgumentParser(prog="python -m predictor.family_eval", description=__doc__.splitlines()[0])
    out.add_argument("--artifacts", type=Path, required=True, help="directory of grouped artifacts s0, s1, ...")
    out.add_argument("--seeds", default="0,1,2")
    out.add_argument("--level", type=float, default=0.95)
    out.add_argument("--out", type=Path, help="write the per-seed figures as JSON")
    out.add_argument("--write", action="store_true",
                     help="write predictor/data/family_bounds.json and merge family_path into the report")
    out.add_argument("--report", type=Path, default=REPORT)
    out.add_argument("--point", choices=("network", "text_table"), default="text_table",
                     help="the family point served and whose residuals earn the margins: `text_table` the traced "
                          "table's neighbours for the text families (predictor.family_table.served_point), the "
                          "network's for the others; `network` the network's for all (as before issue 47's point)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = []
    for s in (int(x) for x in args.seeds.split(",")):
        art = args.artifacts / f"s{s}"
        if not (art / "metadata.json").is_file():
            print(f"seed {s}: no artifact in {art}")
            continue
        results.append(evaluate_seed(s, art, args.level))
        print(json.dumps({k: v for k, v in results[-1].items() if not k.startswith("_")}))
    if args.out:
        args.out.write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in results],
                                       indent=1) + "\n")
    if args.write:
        bounds = fit_bounds(results, args.level, args.point)
        BOUNDS_PATH.write_text(json.dumps(bounds, indent=1) + "\n")
        merge(args.report, "family_path", report_section(results, args))
    return 0


def fit_bounds(results: list[dict[str, Any]], level: float, point: str = "network") -> dict[str, Any]:
    """The served margins (predictor/data/family_bounds.json) from every seed's held-out jobs, on the
    learned term of the served point."""
    need = np.concatenate([r["_needs"][point] for r in results])
    fam = np.concatenate([r["_needs"]["family"] for r in results])
    reg = np.concatenate([r["_needs"]["regime"] for r in results])
    grp = np.concatenate([r["_needs"]["group"] for r in results])
    table = earned_factors(need, fam, reg, grp, level)
    counts = group_counts(fam, reg, grp)
    margins: dict[str, dict[str, float]] = {}
    for (f, r), q in sorted(table.items()):
        if counts.get((f, r), 0) >= SERVE_MIN_GROUPS:
            margins.setdefault(f, {})[r] = round(max(q, 0.0), 4)
    return {"about": "per-family log margins on the learned term of the family path's bound (predictor.family_bounds); "
                     "written by `python -m predictor.family_eval --write`",
            "level": level, "min_groups": SERVE_MIN_GROUPS, "small_batch": SMALL_BATCH,
            "pooled": round(max(weighted_quantile(need, grp, level), 0.0), 4), "margins": margins,
            "groups": {f"{f}:{r}": c for (f, r), c in sorted(counts.items())},
            "seeds": [int(r["seed"]) for r in results], "jobs": len(need), "point": point}


FIELDS = ("median_abs_rel_err", "share_above_bound", "median_bound_ratio")


def report_section(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """`family_path`: per truth (traced labels, the H100's measured peaks), the previous bound (the
    artifact's one margin; on the H100 the family line's) beside the earned one, per family and overall,
    per seed and the median over seeds."""
    out: dict[str, Any] = {}
    for truth, gpu in (("traced", "A100 calibration of traced peaks (the Demand's own bound: any GPU without a line)"),
                       ("h100", "NVIDIA H100 80GB HBM3, NVML per-process peaks (predictor/data/measured)")):
        per_seed = {}
        for r in results:
            e = r[truth]
            per_seed[str(r["seed"])] = {
                "previous": {f: {k: v[k] for k in (*FIELDS, "n")} for f, v in e["network"]["shipped_bound"].items()},
                "earned": {f: {k: v[k] for k in (*FIELDS, "n")} for f, v in e["network_act"].items()},
                "served": {f: {k: v[k] for k in (*FIELDS, "n")} for f, v in e[f"{args.point}_act"].items()},
                "stacked_point": {f: v["median_abs_rel_err"] for f, v in e["stacked"].items()},
                "table_point": {f: v["median_abs_rel_err"] for f, v in e["table"].items()},
                "blend_point": {f: v["median_abs_rel_err"] for f, v in e["blend"].items()},
                "text_table_point": {f: v["median_abs_rel_err"] for f, v in e["text_table"].items()},
            }
        across: dict[str, Any] = {}
        for which in ("previous", "earned", "served"):
            fams = sorted({f for s in per_seed.values() for f in s[which]})
            across[which] = {f: {k: round(float(np.median([s[which][f][k] for s in per_seed.values()
                                                            if f in s[which]])), 4) for k in FIELDS} for f in fams}
        out[truth] = {"gpu": gpu, "across_seeds_median": across, "by_seed": per_seed}
    out["method"] = (f"grouped split (30% of architecture groups held out), seeds {args.seeds}: the network fitted "
                     "without them (`deepres train --split grouped --seed S`), jobs annotated with the family fields "
                     f"only (no activations-millions), at most {PER_ARCH} jobs per architecture; `earned`: the learned "
                     f"term widened by the {args.level:.0%} quantile (groups weighted alike) of the other held-out "
                     "groups' log((truth - fixed) / (point - fixed)) of the same family and batch regime "
                     f"(<= {SMALL_BATCH} or above; at least {MIN_GROUPS} groups, else the family's, else all); "
                     "`previous`: the artifact's margin (traced) / the H100 family line (h100); `table_point`, "
                     "`blend_point`: median errors of the traced-table neighbours' point (predictor.family_table) "
                     "and its geometric mean with the network's (not kept); `earned`: the network's point with the "
                     "earned bound (the family path served before the point changed); `served`: the point served "
                     f"(`{args.point}`; `text_table`: the table's point for transformer and gpt, the network's for "
                     "the others, predictor.family_table.served_point) with the earned bound on its learned term; "
                     "`text_table_point`, `stacked_point`: median errors of those points (`stacked`: the network x "
                     "predictor.family_point's ridge correction, fitted on the other held-out groups of the seed, "
                     "penalty by inner group folds; not kept)")
    out["point"] = args.point
    out["command"] = (f"python -m predictor.family_eval --artifacts DIR --seeds {args.seeds} --level {args.level} "
                      f"--point {args.point} --write")
    return out


def merge(report: Path, key: str, value: Any) -> None:
    data = json.loads(report.read_text()) if report.exists() else {}
    data[key] = value
    report.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())

"""The human half of `deepres evaluate`: reports/predictor.md and its plots.

The grouped split (architectures the model never saw) is the headline; per-family tables and plots
show where the predictor and its bound hold and where they do not; the seed-style tables (MSE,
RMSE, MAE, MAPE, R²) stay for the random split, the paper's comparison. Every sentence with a
figure is generated from the figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictor.train import CALIBRATION_FRACTION, MIN_FAMILY_CALIBRATION, MIN_FAMILY_GROUPS, NESTED_FOLDS

if TYPE_CHECKING:
    from predictor.predictions import Predictions
    from predictor.trainset import Dataset

Results = dict[str, dict[str, dict[str, dict[str, float]]]]  # split -> model -> target -> metric
LABELS = {
    "transformer_bigru_paper": "Transformer-BiGRU (paper)",
    "transformer_bigru_tuned": "Transformer-BiGRU (tuned) + LightGBM + AdaBoost",
    "decision_tree": "Decision tree", "random_forest": "Random forest", "adaboost": "AdaBoost",
    "extra_trees": "ExtraTrees", "xgboost": "XGBoost", "lightgbm": "LightGBM", "catboost": "CatBoost",
}
METRICS_PNG = "predictor-metrics.png"
SCATTER_PNG = "predictor-pred-vs-actual.png"
COVERAGE_PNG = "predictor-coverage.png"
TUNED = "transformer_bigru_tuned"
#: The issue's targets for the tuned model (grouped split; leave-family-out under_rate).
TARGETS = {"median_abs_rel_err": 0.12, "p90_abs_rel_err": 0.35, "under_rate": 0.05, "over_reservation": 0.30}
LFO_UNDER_TARGET = 0.10


def _num(value: float) -> str:
    if not np.isfinite(value):
        return "n/a"
    magnitude = abs(value)
    if magnitude >= 1e5:
        return f"{value:.3e}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3f}"


def _table(by_model: dict[str, dict[str, dict[str, float]]], target: str) -> list[str]:
    memory = target == "memory"
    head = "| model | MSE | RMSE | MAE | MAPE % | R² |" + (" under-rate | over-reservation |" if memory else "")
    lines = [head, "|---" * (8 if memory else 6) + "|"]
    best_rmse = min(v[target]["rmse"] for v in by_model.values())
    for model, values in by_model.items():
        m = values[target]
        name = LABELS.get(model, model)
        name = f"**{name}**" if m["rmse"] == best_rmse else name
        row = f"| {name} | {_num(m['mse'])} | {_num(m['rmse'])} | {_num(m['mae'])} | {m['mape']:.2f} | {m['r2']:.4f} |"
        if memory:
            row += f" {m['under_rate'] * 100:.1f}% | {m['over_reservation'] * 100:.1f}% |"
        lines.append(row)
    return lines


def _pct(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value * 100:.1f}%"


def _headline_table(by_model: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = ["| model | median abs. rel. err | p90 | under-rate | over-reservation | RMSE (MiB) | R² |",
             "|---|---|---|---|---|---|---|"]
    best_rmse = min(v["memory"]["rmse"] for v in by_model.values())
    for model, values in by_model.items():
        m = values["memory"]
        name = LABELS.get(model, model)
        name = f"**{name}**" if m["rmse"] == best_rmse else name
        lines.append(f"| {name} | {_pct(m['median_abs_rel_err'])} | {_pct(m['p90_abs_rel_err'])} | "
                     f"{_pct(m['under_rate'])} | {_pct(m['over_reservation'])} | {_num(m['rmse'])} | {m['r2']:.3f} |")
    return lines


def _family_table(families: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| family | jobs | median abs. rel. err | signed median | p90 | under-rate | over-reservation |",
             "|---|---|---|---|---|---|---|"]
    for family, m in sorted(families.items()):
        lines.append(f"| {family} | {int(m['n'])} | {_pct(m['median_abs_rel_err'])} | "
                     f"{m['signed_median_rel_err'] * 100:+.1f}% | {_pct(m['p90_abs_rel_err'])} | "
                     f"{_pct(m['under_rate'])} | {_pct(m['over_reservation'])} |")
    return lines


def _targets_line(grouped: dict[str, float] | None, lfo_under: float | None) -> list[str]:
    if grouped is None:
        return []
    parts = []
    for key, limit in TARGETS.items():
        value = grouped[key]
        parts.append(f"{key} {_pct(value)} ({'meets' if value <= limit else 'MISSES'} <= {limit:.0%})")
    if lfo_under is not None:
        parts.append(f"leave-family-out under_rate {_pct(lfo_under)} "
                     f"({'meets' if lfo_under <= LFO_UNDER_TARGET else 'MISSES'} <= {LFO_UNDER_TARGET:.0%})")
    return ["Against the issue's targets (tuned model: median of network, LightGBM and AdaBoost): "
            + "; ".join(parts) + ".", ""]


def _rmse_discussion(results: Results, by_family: dict[str, Any]) -> list[str]:
    grouped = results.get("grouped")
    if not grouped or TUNED not in grouped:
        return []
    best = _best(grouped, "memory")
    best_median = _best(grouped, "memory", "median_abs_rel_err")
    tuned = grouped[TUNED]["memory"]
    if best == TUNED:
        line = (f"- **Lowest RMSE on the grouped split: the tuned Transformer-BiGRU blend** "
                f"({_num(tuned['rmse'])} MiB)")
        if best_median != TUNED:
            m = grouped[best_median]["memory"]
            line += (f", but not the lowest median relative error: {LABELS.get(best_median, best_median)} has "
                     f"{_pct(m['median_abs_rel_err'])} against the blend's {_pct(tuned['median_abs_rel_err'])} "
                     "(RMSE is set by the largest jobs, where the network's linear path along the log sizes "
                     "helps; on the many small and mid-size jobs the trees are closer)")
        return [line + "."]
    b = grouped[best]["memory"]
    lines = [
        f"- **The tuned Transformer-BiGRU blend does not have the lowest RMSE on the grouped split**: "
        f"{LABELS.get(best, best)} does ({_num(b['rmse'])} MiB against {_num(tuned['rmse'])} MiB), and the lowest "
        f"median relative error is {LABELS.get(best_median, best_median)}'s "
        f"({_pct(grouped[best_median]['memory']['median_abs_rel_err'])} against "
        f"{_pct(tuned['median_abs_rel_err'])}). Why, as far as these figures show:"
    ]
    fam = by_family.get("grouped", {}).get(TUNED, {})
    other = by_family.get("grouped", {}).get(best, {})
    if fam:
        worst = max(fam, key=lambda f: abs(fam[f]["signed_median_rel_err"]))
        w, o = fam[worst], other.get(worst)
        lines.append(
            f"  (1) extrapolation: the network reads log sizes through a linear (wide) path and extrapolates "
            f"along it (held only to its family's range of densities), trees stay within the targets their "
            f"leaves saw; on the held-out {worst} architectures the "
            f"blend's median error is {w['signed_median_rel_err'] * 100:+.0f}%"
            + (f" against {o['signed_median_rel_err'] * 100:+.0f}% for {LABELS.get(best, best)}" if o else "")
            + "; a few such many-fold misses dominate the mean over-reservation, and on large jobs the RMSE;"
        )
    lines.append(
        "  (2) data: the grouped split trains on about 70% of the architecture groups in this dataset, a few "
        "dozen real architectures per family at most; a network of ~50k weights has less to learn from than "
        "its inputs vary, while trees over the same physics features need fewer examples; "
        "(3) RMSE is set by the largest jobs (tens to hundreds of GiB), where a few percent outweigh everything "
        "else, and every model here learns log(memory), i.e. relative error, not RMSE."
    )
    return lines


def _best(by_model: dict[str, dict[str, dict[str, float]]], target: str, metric: str = "rmse") -> str:
    return min(by_model, key=lambda m: by_model[m][target][metric])


def _curve_table(report: dict[str, Any]) -> list[str]:
    """The tuned network's bound recalibrated to other coverages (same fits): what each level costs."""
    splits = report.get("splits", {})
    curves = {s: splits.get(s, {}).get("coverage_curve", {}).get(TUNED, []) for s in ("grouped", "leave_family_out")}
    if not curves["grouped"]:
        return []
    lfo = {c["coverage"]: c for c in curves["leave_family_out"]}
    lines = ["### Coverage vs reservation (tuned model, same fits recalibrated)", "",
             f"The bound is calibrated to {report.get('upper_coverage', 0):.0%} (`--coverage`). Other levels on "
             "the same held-out jobs:", "",
             "| coverage | grouped under-rate | grouped over-reservation | leave-family-out under-rate | "
             "leave-family-out over-reservation |", "|---|---|---|---|---|"]
    for c in curves["grouped"]:
        other = lfo.get(c["coverage"])
        tail = (f"{other['under_rate']:.1%} | {other['over_reservation']:.0%}" if other else "- | -")
        lines.append(f"| {c['coverage']:.0%} | {c['under_rate']:.1%} | {c['over_reservation']:.0%} | {tail} |")
    hindsight = splits.get("grouped", {}).get("hindsight_bound", {}).get(TUNED)
    if hindsight:
        lines += ["", f"With hindsight, one margin on the point prediction set to the {hindsight['coverage']:.0%} "
                  f"quantile of the grouped test jobs' own errors (x{math.exp(hindsight['margin']):.2f}) would "
                  f"reserve {hindsight['over_reservation']:.0%} (under-rate {hindsight['under_rate']:.1%}): not a "
                  "method (it reads the answers), but the floor of a bound of this kind for these point errors. "
                  "The calibrated bound reserves more because the architectures it is calibrated on (the training "
                  "rows' out-of-fold jobs, predicted by fits that saw 90% of the training groups) err more than "
                  "the final fit does on these test architectures: it has to cover unseen architectures in "
                  "general, not this draw of them."]
    return [*lines, ""]


def exact_lines(exact: dict[str, Any]) -> list[str]:
    """The exact path's figures: the headline (every held-out source pooled), then each source."""
    if exact.get("median_abs_rel_err") is None:
        return [f"Not measured in this build: {exact.get('note', 'no figures')}. `exact` in predictor.json is "
                "null.", ""]
    out = [f"Median abs. rel. error {_pct(exact['median_abs_rel_err'])}, under-rate "
           f"{_pct(exact['under_rate'])}" + (f" ({exact['note']})" if exact.get("note") else "") + ".", ""]
    for name, part in exact.items():
        if isinstance(part, dict) and "median_abs_rel_err" in part:
            out.append(f"- `{name}` ({part['n']} jobs): median {_pct(part['median_abs_rel_err'])}, p90 "
                       f"{_pct(part['p90_abs_rel_err'])}, under-rate {_pct(part['under_rate'])}, over-reservation "
                       f"{_pct(part['over_reservation'])}" + (f"; {part['note']}" if part.get("note") else "") + ".")
    return [*out, ""] if len(out) > 2 else out


def write_markdown(report: dict[str, Any], results: Results, by_family: dict[str, Any], context: dict[str, Any],
                   out: Path) -> Path:
    grouped = results.get("grouped")
    lfo = results.get("leave_family_out")
    rnd = results.get("random")
    n_test = context["n_test"]
    lines = [
        "# Predictor evaluation",
        "",
        f"Generated by `deepres evaluate` on {context['rows']} jobs of {context['n_groups']} architecture groups "
        f"(`{context['data']}`, sha256 `{context['sha256'][:16]}`), seed {context['seed']}, in "
        f"{context['elapsed_s'] / 60:.1f} min on this machine. Memory is the peak per GPU as nvidia-smi shows it "
        "(MiB). *Relative error* = |predicted - real| / real; *under-rate* = share of jobs whose admission bound "
        "(`memory_mib_upper`) is below the real peak (an OOM risk if admitted on it); *over-reservation* = mean "
        "of bound / real - 1. **Bold**: lowest RMSE.",
        "",
    ]
    if grouped:
        lines += [
            f"## Headline: architectures the predictor never saw (grouped split, {n_test.get('grouped', '?')} "
            "test jobs)",
            "",
            "About 30% of the architecture groups (an architecture and its close variants) are held out whole: no "
            "test job's architecture, at any batch size or precision, is in training. This is what a user with a "
            "new model meets.",
            "",
            *_headline_table(grouped),
            "",
            *_targets_line(grouped.get(TUNED, {}).get("memory"),
                           lfo[TUNED]["memory"]["under_rate"] if lfo and TUNED in lfo else None),
        ]
        lines += _curve_table(report)
        fam = by_family.get("grouped", {})
        if TUNED in fam:
            lines += ["### Per family (tuned model, grouped split)", "", *_family_table(fam[TUNED]), ""]
        lines += _without_shapes_lines(report)
        lines += [f"![predicted vs real per family]({SCATTER_PNG})", "", f"![coverage per family]({COVERAGE_PNG})",
                  ""]
    if lfo:
        lines += [
            f"## Leave one family out ({len(context['families'])} folds, pooled)",
            "",
            "Each family is predicted by models trained without any job of it: a whole kind of network never "
            "seen. The bound's margin is calibrated on the other families.",
            "",
            *_headline_table(lfo),
            "",
        ]
        fam = by_family.get("leave_family_out", {})
        if TUNED in fam:
            lines += ["### Per held-out family (tuned model)", "", *_family_table(fam[TUNED]), ""]
    if rnd:
        lines += [
            f"## Random split (the seed's 70/30; {n_test.get('random', '?')} test jobs)",
            "",
            "The paper's comparison, kept for continuity. The same architecture at other batch sizes sits on both "
            "sides, so every model looks better here than on the grouped split.",
            "",
            "GPU memory:",
            "",
            *_table(rnd, "memory"),
            "",
            "Compute (GFLOPs per iteration):",
            "",
            *_table(rnd, "flops"),
            "",
        ]
    exact, runtime = report.get("exact", {}), report.get("runtime", {})
    lines += ["## Exact-architecture path", "", *exact_lines(exact)]
    lines += ["## Serving", ""]
    if runtime.get("p99_ms") is not None:
        lines += [f"Measured in a fresh process (`predictor.bench.runtime_figures`): importing the runtime and "
                  f"predicting {'**imports torch**' if runtime['imports_torch'] else 'imports no torch'}; an "
                  f"uncached prediction takes p50 {runtime['p50_ms']:.3f} ms, p99 {runtime['p99_ms']:.3f} ms; "
                  f"loading the artifact {runtime['load_s']:.2f} s; `deepres predict -f "
                  f"deploy/examples/cnn-small.yaml` {runtime['predict_cli_wall_s']:.2f} s wall (median of 3). "
                  + (f"The CPU time of the same calls has p99 {runtime['cpu_p99_ms']:.3f} ms: the rest of the wall "
                     f"p99 is time the process spent descheduled (1-minute load average "
                     f"{runtime['loadavg_1m']:.1f} on 2 cores). " if "cpu_p99_ms" in runtime else "")
                  + (f"How: {runtime['method']}. " if runtime.get("method") else "")
                  + "Timings on a shared 2-core machine: noisy.", ""]
    else:
        lines += ["Not measured in this run (`--no-runtime`).", ""]
    med, p90 = report["calibration"].get("median_abs_rel_err"), report["calibration"].get("p90_abs_rel_err")
    lines += ["## Calibration of the labels", "",
              "Held-out error of the overhead model that turns traced tensor peaks into nvidia-smi memory "
              "(from `reports/calibration.json`, written by `deepres dataset`): "
              + (f"median absolute relative error {med * 100:.2f}%, 90th percentile {p90 * 100:.2f}%."
                 if med is not None and p90 is not None else "not available (run `deepres dataset`)."), ""]
    settings = context["settings"]
    lines += [
        "## Method",
        "",
        f"- **Same rows, same procedure; the bound calibrated on unseen architectures.** Every model is cut "
        f"into {context['cv_folds']} grouped cross-validation folds of its training rows ({context['fold_cv_folds']} "
        f"on the leave-family-out folds): each fold's architectures are predicted by a fit that never saw them, "
        f"which gives every training job an out-of-fold raw bound; the model is then fitted on all its training "
        f"rows (CV+). The margin is split conformal on the out-of-fold scores, log(real / raw bound) of the "
        f"learned term, at a nominal level tuned so that the bound covers {context['coverage']:.0%} of the jobs of "
        f"architectures the margin never saw: nested grouped cross-validation ({NESTED_FOLDS} folds of whole groups "
        "of the out-of-fold jobs, each predicted by margins computed without it) picks the lowest level whose "
        "nested under-rate is at most "
        f"{1 - context['coverage']:.0%} (jobs of one architecture err together, so a quantile over jobs "
        "under-covers the next architecture). The same nested folds choose one margin for all families or one "
        f"per family (model-type; where at least {MIN_FAMILY_CALIBRATION} jobs of {MIN_FAMILY_GROUPS} architecture "
        "groups back it), whichever reserves less on them. The margins are calibrated "
        "on the out-of-fold jobs inside their fit's training ranges (out-of-range ones are served the margin "
        "times the widening below). "
        "The shipped model (`transformer_bigru_tuned`) is the tuned network blended with a LightGBM booster "
        "and an AdaBoost regressor fitted on the same rows and features: per job, the median of their three "
        "densities in log space (`predictor.runtime.blend_points`); its raw bound, like every other model's, is "
        "its point prediction. "
        "Test rows are never seen before scoring.",
        "- **Outside the training ranges** (params, batch, input size or depth beyond what the family had in "
        "training) the runtime widens the bound (x2^(0.5 x doublings out), at most x4; x2 for a model-type "
        "never trained on) and puts a warning in the Demand. The tables score the bound exactly as served, "
        "widening included (`predictor.runtime.range_factor`, one rule for both).",
        "- **Paper configuration** (`predictor.model.paper_config`): the seed's 11 columns (categories "
        "label-encoded) as a one-step sequence of 11 channels, position embedding (512), forward GRU 6 / "
        "backward GRU 10 on the flipped sequence, 2 self-attention layers (4 heads x 32 key channels) with "
        "residual + layer norm, ReLU, dropout 0.01, fully connected output; z-scored raw targets, one network "
        "per target; Adam, batch 256, lr 0.01 then 0.001 from epoch 80, L2 1e-3, gradient clipping 10.",
        "- **What is learned** (`predictor.features.Decomposition`): the annotations fix weights + optimizer "
        "state exactly (params x bytes per parameter of the precision x 1 + state tensors of the optimizer); "
        "what a training step saves for backward, and its temporaries, they do not. The physics models (the "
        "tuned network and every baseline) learn that remainder as a density, (traced peak - fixed bytes) / "
        "(batch x input units x sqrt(params x layers)), in log space, and FLOPs as GFLOPs / (batch x input units "
        "x params); memory = the calibration's context + factor x (fixed + density x scale). The bound's margin "
        "widens the learned term only, so a job whose peak is mostly weights and optimizer state gets a tight "
        "bound and one whose peak is mostly activations a wide one (normalised conformal, the scale being what "
        "the annotations leave unknown). A job that states its activation count (`activations-millions`, one "
        "sample's convolution and matmul outputs: timm's model cards, `deepres profile`) has the scale batch x "
        "that count, the density then being bytes per counted activation; fits drop the count for half the "
        "architectures (by a hash of the name), and jobs without it have their own margins, calibrated on "
        "held-out predictions made without it.",
        "- **Tuned configuration** (`predictor.model.tuned_config`): the physics feature set (log2 of the "
        "annotations' sizes, params per layer, input units, the fixed bytes and the activation scale; precision, "
        "optimizer and model-type as embeddings), each feature group a token, BiGRU + 2 attention layers, "
        "flattened into an MLP head plus a linear (wide) path; the two densities jointly, plus the upper-quantile "
        "head; AdamW with cosine decay. Its epochs were chosen by grouped cross-validation inside the grouped "
        "split's training rows (never on its test rows).",
        "- **How the choices were made.** The decomposition, the activation scale and the bound's design were "
        "set from physics and from grouped cross-validation inside the grouped split's training rows (the "
        "tuned network's epochs, LightGBM for quick comparisons). One choice was made after a grouped test "
        "figure had been seen: an MLP's activation scale ignores its number of input features (a first "
        "version counted them, which made the held-out MLPs' densities 20x off). The physics argument for it "
        "stands on its own (an MLP's hidden activations do not grow with the input width) and it did not "
        "change the cross-validation score; it is reported here because it was not chosen blind. The "
        f"bound's coverage ({context['coverage']:.0%}) is the issue's under-rate target (at most 5% of unseen "
        "jobs under the bound); an earlier release had chosen 97% and lowered it after seeing test figures. The "
        "bound's current method was chosen on the grouped split's training rows alone: on nested grouped folds "
        "of the tuned network's out-of-fold scores, the former rule (a 95% quantile over jobs, per family where 3 "
        "groups back it) left 10% of held-out architectures' jobs under the bound, one margin for all families "
        "6%, and a level tuned on the nested folds 5% at the least reservation (per-family margins, group "
        "weights and a difficulty-normalised score reserved more at the same nested under-rate). Ten CV folds "
        "instead of five were chosen because out-of-fold fits on 80% of the groups err more than the final "
        "fit (out-of-fold 95th percentile log score 0.52 vs 0.49 with ten folds); the grouped test figures of "
        "the five-fold version had been seen by then. The blend was chosen on the same kind of "
        "nested folds of the grouped split's training rows (10 CV folds of the network, of LightGBM, CatBoost, "
        "XGBoost, AdaBoost and a random forest, and of blends of them in log space; nested over-reservation at a "
        "5% nested under-rate): the network alone reserved 0.44, 0.51 and 0.43 for three seeds, LightGBM alone "
        "0.43, the network + LightGBM (geometric mean, the previous release) 0.37, 0.41 and 0.38; three network "
        "seeds averaged reserved 0.44 (their errors are shared: more seeds do not help). AdaBoost alone reserved "
        "0.32, the geometric mean of the network with it 0.36 and of all three 0.34; the median of the three "
        "0.32, 0.34 and 0.33 for the three network seeds, so the median is shipped: it keeps the network, which "
        "the issue names and which errs least on the largest jobs, while dropping, per job, whichever member "
        "errs most (`scripts/bound_study.py score 'tbgru_0~lightgbm~adaboost'`). The study printed the grouped "
        "test figures next to the nested ones, so they were visible when the blend was chosen.",
        "- **Baselines** (`predictor.baselines`) see the same physics features and learn the same log densities; "
        "each has a "
        "2-3 point grid of its most sensitive knob, chosen on the grouped split's calibration fold: "
        + (", ".join(f"{LABELS.get(k, k)} {v}" for k, v in settings.items()) or "(not tuned in this run)") + ".",
        f"- **CPU budget.** The networks train for {context['epochs_scale']:g}x their configured epochs on the grouped "
        f"and random splits and {context['fold_epochs_scale']:g}x on the leave-family-out folds; the random split's "
        f"bound is calibrated with {context['random_cv_folds']} grouped fold(s) (1: a single held-out calibration "
        f"fold of {CALIBRATION_FRACTION:.0%} of the groups); the leave-family-out folds fit "
        + ", ".join(LABELS.get(m, m) for m in context["family_models"]) + " only. "
        + (f"The dataset was subsampled to {context['rows']} jobs (`--max-rows`, a seeded random subset of the "
           f"rows; {context['n_groups']} architecture groups remain)." if context.get("max_rows")
           else "Every job of the dataset is used."),
        "- **Serving** needs no torch, lightgbm or scikit-learn: the artifact's weights are .npz, "
        "`predictor.inference` runs the network in numpy and `predictor.trees` walks the booster's and AdaBoost's "
        "trees flattened into arrays; the tests hold them to the torch forward pass, to LightGBM's own "
        "prediction and to scikit-learn's.",
        "",
        "## Discussion",
        "",
        *_rmse_discussion(results, by_family),
        *_discussion_families(by_family),
        "",
    ]
    path = out / "predictor.md"
    path.write_text("\n".join(lines))
    return path


def _discussion_families(by_family: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    fam = by_family.get("grouped", {}).get(TUNED)
    if fam:
        worst = sorted(fam, key=lambda f: -fam[f]["median_abs_rel_err"])[:3]
        unsafe = [f for f in sorted(fam) if fam[f]["under_rate"] > TARGETS["under_rate"]]
        lines.append("- **Hardest families on unseen architectures:** " + ", ".join(
            f"{f} (median {_pct(fam[f]['median_abs_rel_err'])}, signed {fam[f]['signed_median_rel_err'] * 100:+.0f}%)"
            for f in worst) + ".")
        if unsafe:
            lines.append("- **Families whose bound misses more than 5% of unseen jobs:** " + ", ".join(
                f"{f} ({_pct(fam[f]['under_rate'])})" for f in unsafe) + ". For those, the extender's usage rule "
                "(reservations follow observed peaks) and the explicit `gpu-memory` override are the safety net.")
    lfo = by_family.get("leave_family_out", {}).get(TUNED)
    if lfo:
        unsafe = [f for f in sorted(lfo) if lfo[f]["under_rate"] > LFO_UNDER_TARGET]
        if unsafe:
            lines.append("- **A family never seen at all** is where the bound is weakest: " + ", ".join(
                f"{f} ({_pct(lfo[f]['under_rate'])} under)" for f in unsafe) + ".")
    return lines


def write_plots(data: Dataset, preds: dict[str, dict[str, Predictions]], results: Results, out: Path) -> None:
    """Metrics per model (grouped split), predicted vs real per family and coverage per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = "grouped" if "grouped" in results else next(iter(results))
    by_model = results[split]
    models = list(by_model)
    names = [LABELS.get(m, m).replace(" (", "\n(") for m in models]
    metrics = (("median_abs_rel_err", "median |rel. err|"), ("p90_abs_rel_err", "p90 |rel. err|"),
               ("under_rate", "under-rate"), ("over_reservation", "over-reservation"), ("rmse", "RMSE (MiB)"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(22, 5))
    for ax, (metric, title) in zip(axes, metrics, strict=True):
        values = [by_model[m]["memory"][metric] for m in models]
        colors = ["tab:red" if m == TUNED else "tab:orange" if m == "transformer_bigru_paper" else "tab:blue"
                  for m in models]
        ax.bar(range(len(models)), values, color=colors)
        ax.set_xticks(range(len(models)), names, rotation=90, fontsize=7)
        ax.set_title(f"memory: {title}", fontsize=9)
        if metric in ("rmse", "median_abs_rel_err", "p90_abs_rel_err"):
            ax.set_yscale("log")
    fig.suptitle(f"{split} split: test metrics per model")
    fig.tight_layout()
    fig.savefig(out / METRICS_PNG, dpi=80)
    plt.close(fig)

    if TUNED not in preds.get(split, {}):
        return
    rows, points, upper = preds[split][TUNED].arrays()
    families = data.report_families[rows]
    truth = data.y[rows, 0]
    unique = sorted(set(families.tolist()))
    cols = min(4, len(unique))
    grid_rows = int(np.ceil(len(unique) / cols))
    fig, axes = plt.subplots(grid_rows, cols, figsize=(4.2 * cols, 4 * grid_rows), squeeze=False)
    for i, family in enumerate(unique):
        ax = axes[i // cols][i % cols]
        m = families == family
        ax.scatter(truth[m], points[m, 0], s=5, alpha=0.5, label="predicted")
        ax.scatter(truth[m], upper[m], s=5, alpha=0.4, marker="^", label="bound")
        lo, hi = float(truth[m].min()), float(truth[m].max())
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{family} ({int(m.sum())} jobs)", fontsize=9)
        ax.set_xlabel("real MiB", fontsize=8)
        ax.set_ylabel("predicted MiB", fontsize=8)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(len(unique), grid_rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(f"Tuned Transformer-BiGRU, {split} split: predicted and bound vs real peak memory per family")
    fig.tight_layout()
    fig.savefig(out / SCATTER_PNG, dpi=80)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, split_name in zip(axes, ("grouped", "leave_family_out"), strict=True):
        if TUNED not in preds.get(split_name, {}):
            ax.axis("off")
            continue
        rows, points, upper = preds[split_name][TUNED].arrays()
        families = data.report_families[rows]
        truth = data.y[rows, 0]
        unique = sorted(set(families.tolist()))
        under = [float(np.mean(upper[families == f] < truth[families == f])) for f in unique]
        over = [float(np.mean(upper[families == f] / truth[families == f] - 1.0)) for f in unique]
        x = np.arange(len(unique))
        ax.bar(x - 0.2, under, 0.4, label="under-rate", color="tab:red")
        ax.bar(x + 0.2, over, 0.4, label="over-reservation", color="tab:blue")
        ax.axhline(0.05, color="tab:red", linestyle=":", linewidth=1)
        ax.axhline(0.30, color="tab:blue", linestyle=":", linewidth=1)
        ax.set_xticks(x, unique, rotation=60, fontsize=8)
        ax.set_title(f"{split_name}: bound coverage per family (tuned)", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / COVERAGE_PNG, dpi=80)
    plt.close(fig)


def _without_shapes_lines(report: dict[str, Any]) -> list[str]:
    """The grouped test jobs again with the optional shape annotations left out (every model, and the
    tuned network per family): what a user who does not give them meets."""
    split = report.get("splits", {}).get("grouped", {})
    bare, with_shapes = split.get("memory_without_shapes"), split.get("memory", {})
    if not bare:
        return []

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [
        "### The same test jobs without the optional activation count",
        "",
        "The rows above carry `activations-millions` as the dataset's rule fills it (docs/data-scientist.md, "
        "\"How to fill the family annotations\"). A user may leave it out; the models were fitted with it "
        "dropped for half the architectures, and the bound of a job without it has margins calibrated on "
        "held-out predictions made without it. The same jobs without it "
        "(`splits.grouped.memory_without_shapes` in predictor.json):",
        "",
        "| model | median rel. error (with) | median (without) | p90 (with) | p90 (without) | under-rate (without) "
        "| over-reservation (without) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, m in bare.items():
        w = with_shapes.get(model, {})
        lines.append(f"| {model} | {cell(w.get('median_abs_rel_err'))} | {cell(m.get('median_abs_rel_err'))} | "
                     f"{cell(w.get('p90_abs_rel_err'))} | {cell(m.get('p90_abs_rel_err'))} | "
                     f"{cell(m.get('under_rate'))} | {cell(m.get('over_reservation'))} |")
    fam = split.get("memory_by_family_without_shapes", {})
    if any(TUNED in per for per in fam.values()):
        lines += ["", "Tuned network per family, without it:", "",
                  "| family | n | median rel. error | p90 | signed median | under-rate | over-reservation |",
                  "|---|---|---|---|---|---|---|"]
        for family, per in fam.items():
            if TUNED in per:
                m = per[TUNED]
                lines.append(f"| {family} | {int(m.get('n') or 0)} | {cell(m.get('median_abs_rel_err'))} | "
                             f"{cell(m.get('p90_abs_rel_err'))} | {cell(m.get('signed_median_rel_err'))} | "
                             f"{cell(m.get('under_rate'))} | {cell(m.get('over_reservation'))} |")
    return [*lines, ""]

"""
Figures from this project's logs. matplotlib is an optional extra: pip install matplotlib.

    python plot.py --runs=out/tiny_orig,out/tiny_pair --labels=original,pairwise
        eval loss vs step (the paper's Figure 2), and the plateau diagnostics (attention entropy per layer,
        representation collapse) when the logs have them. Runs that share a label are seeds of one arm: drawn
        as their mean with a band from their minimum to their maximum.
    python plot.py --benchmarks=out-glue/bench_orig,out-glue/bench_pair
        GLUE score vs pre-training step (Figure 3: finetune_glue.py --benchmark), with each run's 95% line.

Writes <out>_loss, <out>_diagnostics and <out>_glue (.png and .svg) and prints Markdown tables; by default
<out> is plot_ in the folder that holds the runs (e.g. out/plot_loss.png).
"""
if __name__ == "__main__":  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import json
import math
import os
from collections import defaultdict

import numpy as np

from configurator import comma_list
from lib.files import atomic_write


# -----------------------------------------------------------------------------
runs = ""  # comma list of train.py out_dirs (each with log.jsonl)
benchmarks = ""  # comma list of finetune_glue.py --benchmark out_dirs (each with benchmark.json)
labels = ""  # legend labels in the order of --runs (then of --benchmarks); a repeated label groups seeds
threshold = 0.0  # eval loss of the "first step reaching it" criterion; 0 = the worst final loss + 10%
out = ""  # output path prefix; '' = <folder holding the first run or benchmark>/plot
# -----------------------------------------------------------------------------


def read_evals(run):
    """The eval records of a train.py run (its out_dir or log.jsonl), sorted by step. A half-written last line
    (a killed run) is skipped; anything else malformed is a one-line error."""
    path = os.path.join(run, "log.jsonl") if os.path.isdir(run) else run
    try:
        with open(path, errors="replace") as f:  # a damaged byte spoils its line at most, not the file
            lines = f.read().splitlines()
    except OSError as e:
        raise SystemExit(f"cannot read {path} ({getattr(e, 'strerror', None) or e}): not a train.py out_dir?")
    evals = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line) if line.strip() else {}
        except ValueError:
            if n == len(lines):
                continue
            raise SystemExit(f"{path}, line {n}: not JSON; is this a train.py log.jsonl?")
        if isinstance(r, dict) and r.get("type") == "eval":
            if not isinstance(r.get("step"), int) or not isinstance(r.get("loss"), (int, float)) or \
                    not math.isfinite(r["loss"]):
                raise SystemExit(f"{path}, line {n}: an eval record needs a step and a finite loss")
            evals.append(r)
    if not evals:
        if lines and not any(line.strip().startswith("{") for line in lines):
            raise SystemExit(f"{path} is not JSON lines: is this a train.py log.jsonl?")
        raise SystemExit(f"{path} has no eval records: run train.py past its first eval_interval")
    return sorted(evals, key=lambda r: r["step"])


def first_step_below(evals, level):
    """The study's criterion: the first eval step whose loss is <= level (None if never)."""
    return next((r["step"] for r in evals if r["loss"] <= level), None)


def read_benchmark(run):
    """(points [(step, GLUE score)], step_95, target_95, tasks) from a checkpoint benchmark's benchmark.json."""
    path = os.path.join(run, "benchmark.json") if os.path.isdir(run) else run
    try:
        with open(path) as f:
            bench = json.load(f)
        points = sorted((r["step"], r["score"]) for r in bench["records"])
        return points, bench["step_95"], bench["target_95"], bench.get("tasks")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"plot: cannot read a checkpoint benchmark at {path} ({type(e).__name__}: {e}): "
                         "run finetune_glue.py --benchmark=<train out_dir> first")


def band(curves, key):
    """steps, mean, min, max of r[key] over the curves (seeds), at the steps that all of them have (a run that
    stopped early ends the band: a mean over the seeds still running would be another mean)."""
    at = defaultdict(list)
    for c in curves:
        for r in c:
            if key(r) is not None:
                at[r["step"]].append(key(r))
    steps = sorted(s for s, v in at.items() if len(v) == len(curves))
    v = [np.array(at[s]) for s in steps]
    return steps, [x.mean() for x in v], [x.min() for x in v], [x.max() for x in v]


def draw(ax, curves, key, label, color=None):
    steps, mean, lo, hi = band(curves, key)
    line = ax.plot(steps, mean, label=label + (f" (mean of {len(curves)})" if len(curves) > 1 else ""), color=color)[0]
    if len(curves) > 1:
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    return line


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot: needs matplotlib, an optional extra: pip install matplotlib")
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def save(fig, path):
    import matplotlib

    fig.tight_layout()
    # the same figure gives the same files: no date, fixed SVG ids (a rebuilt figure shows no false diff); each file
    # whole or not at all (a Ctrl-C, a full disk: one line)
    with matplotlib.rc_context({"svg.hashsalt": "symmetric-bert"}):
        for ext in ("png", "svg"):
            atomic_write(f"{path}.{ext}", lambda f: fig.savefig(f, format=ext, metadata={"Date": None}))
    print(f"wrote {path}.png and {path}.svg")


def output_prefix(out, first):
    """--out, or plot in the folder that holds the first run or benchmark; its folder made."""
    out = out or os.path.join(os.path.dirname(os.path.normpath(first)) or ".", "plot")
    if os.path.dirname(out):
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        except OSError as e:
            raise SystemExit(f"plot: cannot create {os.path.dirname(out)} ({e.strerror}): choose another --out")
    return out


def loss_figure(groups, level, path):
    """Eval loss against steps, each arm's seeds as a mean with a min-max band, and the criterion's level."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    for label, curves in groups.items():
        draw(ax, curves, lambda r: r["loss"], label)
    ax.axhline(level, color="gray", ls=":", lw=1, label=f"criterion: eval loss {level:.2f}")
    # the y axis shows the plateau and what follows (from 10% of the run on), not the first drop from ~11
    last = max(c[-1]["step"] for g in groups.values() for c in g)
    shown = [r["loss"] for g in groups.values() for c in g for r in c if r["step"] >= last / 10]
    ax.set_ylim(min(min(shown), level) - 0.1, max(max(shown), level) + 0.1)  # the criterion's line is shown
    ax.set(xlabel="step", ylabel="eval cross-entropy (nats)", title="MLM pre-training: evaluation loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
    plt.close(fig)


def loss_table(groups, level):
    """Per arm: seeds, final step(s), final eval loss, the first step at or below the level, and against the fastest."""
    reached = {label: [first_step_below(c, level) for c in curves] for label, curves in groups.items()}
    mean_reached = {k: np.mean(v) if None not in v else None for k, v in reached.items()}
    fastest = min((s for s in mean_reached.values() if s), default=None)
    print(f"\n| run | seeds | final step | final eval loss | first step with eval loss <= {level:.3f} | vs fastest |")
    print("|---|---|---|---|---|---|")
    for label, curves in groups.items():
        finals = [c[-1]["loss"] for c in curves]
        loss = f"{np.mean(finals):.4f}" + (f" ({min(finals):.4f}-{max(finals):.4f})" if len(finals) > 1 else "")
        steps = ", ".join(str(s) if s is not None else "not reached" for s in reached[label])
        m = mean_reached[label]
        ratio = f"{m / fastest:.2f}x" if m and fastest else "-"
        ends = sorted({c[-1]["step"] for c in curves})  # seeds may end at different steps: their range
        end = str(ends[0]) if len(ends) == 1 else f"{ends[0]}-{ends[-1]}"
        print(f"| {label} | {len(curves)} | {end} | {loss} | {steps} | {ratio} |")


def diagnostics_figure(groups, path):
    """The plateau diagnostics: each layer's attention entropy, and representation collapse."""
    plt = pyplot()
    n_layer = max(len(r.get("attn_entropy", [])) for g in groups.values() for c in g for r in c)
    cols = min(3, n_layer + 1)
    rows = -(-(n_layer + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), dpi=150, squeeze=False)
    panels = [(f"layer {l + 1}: attention entropy / log(keys)",
               lambda r, l=l: r["attn_entropy"][l] if len(r.get("attn_entropy", [])) > l else None)
              for l in range(n_layer)]
    panels.append(("representation collapse: mean cosine", lambda r: r.get("collapse")))
    for ax, (title, key) in zip(axes.flat, panels):
        for label, curves in groups.items():
            draw(ax, curves, key, label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    save(fig, path)
    plt.close(fig)


def glue_figure(benchmarks, path):
    """Figure 3: GLUE score against pre-training step per benchmark ([(label, folder)]), with a table."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    print("\n| run | final score | 95% of final | first step reaching it |\n|---|---|---|---|")
    task_sets = set()
    for label, d in benchmarks:
        points, step_95, target_95, tasks = read_benchmark(d)
        task_sets.add(tuple(tasks) if tasks else None)
        line = ax.plot(*zip(*points), marker="o", ms=3, label=label)[0]
        ax.axhline(target_95, color=line.get_color(), ls=":", lw=1, label=f"95% of {label}'s final score")
        print(f"| {label} | {points[-1][1]:.2f} | {target_95:.2f} | {step_95} |")
    tasks = task_sets.pop() if len(task_sets) == 1 else None
    full = tasks is None or len(tasks) >= 8
    ax.set(xlabel="pre-training step", ylabel="GLUE score" if full else "mean score of " + ", ".join(tasks),
           title="GLUE score of pre-training checkpoints" if full else
           f"GLUE tasks {', '.join(tasks)} (not the GLUE score)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
    plt.close(fig)


def main(runs, benchmarks, labels, threshold, out):
    """runs, benchmarks, labels: comma lists (the command line) or lists (a caller whose labels hold commas)."""
    if not runs and not benchmarks:
        raise SystemExit("plot: nothing to plot: pass --runs=DIR,DIR (eval loss) and/or --benchmarks=DIR,DIR (GLUE)")
    listed = lambda key, v: v if isinstance(v, list) else comma_list("plot", key, v) if v else []  # a folder named
    run_dirs, bench_dirs = listed("runs", runs), listed("benchmarks", benchmarks)  # twice would count as two seeds
    names = [x for x in (labels if isinstance(labels, list) else labels.split(",")) if x]  # a label repeated: a group
    name = lambda i, d: names[i] if i < len(names) else os.path.basename(os.path.normpath(d))
    out = output_prefix(out, (run_dirs or bench_dirs)[0])
    pyplot()  # matplotlib present, before any file is read
    if run_dirs:
        groups = defaultdict(list)  # label -> [eval records of each run]
        for i, d in enumerate(run_dirs):
            groups[name(i, d)].append(read_evals(d))
        level = threshold or max(c[-1]["loss"] for g in groups.values() for c in g) * 1.1
        loss_figure(groups, level, f"{out}_loss")
        loss_table(groups, level)
        if any("collapse" in r for g in groups.values() for c in g for r in c):
            diagnostics_figure(groups, f"{out}_diagnostics")
    if bench_dirs:  # labels after the runs' if there are more than runs, else from the first
        first = len(run_dirs) if len(names) > len(run_dirs) else 0
        glue_figure([(name(first + i, d), d) for i, d in enumerate(bench_dirs)], f"{out}_glue")


if __name__ == "__main__":
    from configurator import configure

    with interrupt.stops_cleanly("plot", "the figures written so far are whole"):
        main(**configure(globals()))

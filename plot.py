"""
Figures of the paper from this project's logs (matplotlib, an optional dependency: pip install matplotlib).

    python plot.py --runs=out/study_orig,out/study_sym,out/study_pair --out=assets/study
        Figure 2: eval cross-entropy vs step, one line per run (out_dir/log.jsonl), plus a table of the
        final eval loss and the first step at which each run reaches `threshold`.
    python plot.py --benchmarks=out/glue_bench_orig,out/glue_bench_pair --out=assets/study_glue
        Figure 3: GLUE score vs pre-training step (finetune_glue.py's checkpoint benchmark), with each
        run's 95%-of-final line.

Writes <out>_loss.png/.svg and/or <out>_glue.png/.svg, and prints Markdown tables.
"""
import json
import os

runs = ""  # comma list of train.py out_dirs (each with log.jsonl)
benchmarks = ""  # comma list of finetune_glue.py checkpoint-benchmark out_dirs (each with benchmark.json)
labels = ""  # legend labels, in the order of --runs (and of --benchmarks); default: the folder names
threshold = 0.0  # eval loss threshold for the "first step reaching it" column; 0 = the worst final loss + 10%
out = "plot"  # output path prefix


def read_evals(run):
    """[(step, eval loss)] from a run's log.jsonl, or a one-line error."""
    path = os.path.join(run, "log.jsonl") if os.path.isdir(run) else run
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise SystemExit(f"plot: no log at {path}: pass train.py out_dirs with --runs=")
    except json.JSONDecodeError as e:
        raise SystemExit(f"plot: {path} is not a JSON-lines log ({e})")
    evals = sorted((r["step"], r["loss"]) for r in records if r.get("type") == "eval")
    if not evals:
        raise SystemExit(f"plot: {path} has no eval records: run train.py past its first eval_interval")
    return evals


def first_step_below(evals, level):
    return next((step for step, loss in evals if loss <= level), None)


def read_benchmark(run):
    """[(step, GLUE score)] from a checkpoint benchmark's benchmark.json."""
    path = os.path.join(run, "benchmark.json") if os.path.isdir(run) else run
    try:
        with open(path) as f:
            bench = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise SystemExit(f"plot: cannot read a checkpoint benchmark at {path} ({type(e).__name__})")
    points = sorted((r["step"], r["score"]) for r in bench.get("records", []))
    if not points:
        raise SystemExit(f"plot: {path} has no records: run finetune_glue.py --benchmark=<train out_dir> first")
    return points


def figure(xlabel, ylabel, title):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return plt, fig, ax


def save(plt, fig, ax, path):
    ax.legend()
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{path}.{ext}")
    plt.close(fig)
    print(f"wrote {path}.png and {path}.svg")


def main(runs, benchmarks, labels, threshold, out):
    if not runs and not benchmarks:
        raise SystemExit("plot: nothing to plot: pass --runs=DIR,DIR (eval loss) and/or --benchmarks=DIR,DIR (GLUE)")
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    names = [n for n in labels.split(",") if n]
    if runs:
        dirs = runs.split(",")
        curves = {(names[i] if i < len(names) else os.path.basename(os.path.normpath(d))): read_evals(d)
                  for i, d in enumerate(dirs)}
        level = threshold or max(c[-1][1] for c in curves.values()) * 1.1
        plt, fig, ax = figure("step", "eval cross-entropy", "MLM pre-training: evaluation loss")
        for name, c in curves.items():
            ax.plot(*zip(*c), label=name)
        ax.axhline(level, color="gray", ls=":", lw=1)
        save(plt, fig, ax, f"{out}_loss")
        reached = {name: first_step_below(c, level) for name, c in curves.items()}
        fastest = min((s for s in reached.values() if s), default=None)
        print(f"\n| run | final step | final eval loss | first step with eval loss <= {level:.3f} | vs fastest |")
        print("|---|---|---|---|---|")
        for name, c in curves.items():
            r = reached[name]
            ratio = f"{r / fastest:.2f}x" if r and fastest else "-"
            print(f"| {name} | {c[-1][0]} | {c[-1][1]:.4f} | {r if r is not None else 'not reached'} | {ratio} |")
    if benchmarks:
        dirs = benchmarks.split(",")
        plt, fig, ax = figure("pre-training step", "GLUE score", "GLUE score of pre-training checkpoints")
        print("\n| run | final score | 95% of final | first step reaching it |\n|---|---|---|---|")
        for i, d in enumerate(dirs):
            name = names[i] if i < len(names) else os.path.basename(os.path.normpath(d))
            points = read_benchmark(d)
            final = points[-1][1]
            line = ax.plot(*zip(*points), marker="o", ms=3, label=name)[0]
            ax.axhline(0.95 * final, color=line.get_color(), ls=":", lw=1)
            reached = next(step for step, score in points if score >= 0.95 * final)
            print(f"| {name} | {final:.2f} | {0.95 * final:.2f} | {reached} |")
        save(plt, fig, ax, f"{out}_glue")


if __name__ == "__main__":
    from configurator import configure

    main(**configure(globals()))

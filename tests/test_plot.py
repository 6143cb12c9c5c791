import json
import subprocess
import sys

import pytest

from conftest import ROOT, run_script
import plot



def write_log(path, evals, diag=False, tail=""):
    path.mkdir()
    with open(path / "log.jsonl", "w") as f:
        f.write(json.dumps({"type": "train", "step": 1, "loss": 11.0, "lr": 0.0, "tokens_per_s": 1.0}) + "\n")
        for step, loss in evals:
            extra = {"attn_entropy": [0.99 - step / 100, 0.98], "collapse": 0.9 - step / 100} if diag else {}
            f.write(json.dumps({"type": "eval", "step": step, "loss": loss, "accuracy": 0.1, **extra}) + "\n")
        f.write(tail)


def bench_json(path, tasks):
    path.mkdir()
    records = [{"step": 10, "score": 50.0}, {"step": 20, "score": 70.0}, {"step": 30, "score": 72.0}]
    (path / "benchmark.json").write_text(json.dumps({"records": records, "final_score": 72.0, "target_95": 68.4,
                                                     "step_95": 20, "tasks": tasks}))


def test_labels_with_commas_group_the_runs_they_name(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for name in ("a1", "a2", "b1"):
        write_log(tmp_path / name, [(0, 10.8), (10, 7.0 if name < "b" else 8.0)])
    plot.main([str(tmp_path / n) for n in ("a1", "a2", "b1")], "", ["pairwise, S ~ N(0, 1)"] * 2 + ["original"], 7.5,
              str(tmp_path / "fig"))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pairwise") or
            line.startswith("| original")]
    assert rows[0].startswith("| pairwise, S ~ N(0, 1) | 2 | 10 | 7.0000 (7.0000-7.0000) | 10, 10 |")
    assert rows[1].startswith("| original | 1 | 10 | 8.0000 | not reached |")
    assert len(rows) == 2


def test_the_same_figure_gives_the_same_files(tmp_path):
    pytest.importorskip("matplotlib")
    write_log(tmp_path / "run", [(0, 10.8), (10, 7.0), (20, 6.0)], diag=True)
    for out in ("one", "two"):
        plot.main(str(tmp_path / "run"), "", "pairwise", 0.0, str(tmp_path / out))
    for name in ("loss.png", "loss.svg", "diagnostics.svg"):
        assert (tmp_path / f"one_{name}").read_bytes() == (tmp_path / f"two_{name}").read_bytes(), name


def run_plot(*args):
    return run_script("plot.py", *args)


def test_plot_writes_figures_and_table(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    write_log(tmp_path / "orig", [(0, 10.8), (10, 9.0), (20, 7.5), (30, 6.0)])
    write_log(tmp_path / "pair", [(0, 10.8), (10, 7.4), (20, 6.2), (30, 5.8)], tail='{"type": "eval", "st')
    bench_json(tmp_path / "bench_pair", ["rte", "stsb"])
    out = tmp_path / "fig" / "study"
    plot.main(f"{tmp_path}/orig,{tmp_path}/pair", str(tmp_path / "bench_pair"), "original,pairwise", 7.5, str(out))
    for name in ("study_loss.png", "study_loss.svg", "study_glue.png", "study_glue.svg"):
        assert (tmp_path / "fig" / name).stat().st_size > 1000
    assert (tmp_path / "fig" / "study_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "fig" / "study_diagnostics.png").exists()  # these logs have no diagnostics
    text = capsys.readouterr().out
    assert "| original | 1 | 30 | 6.0000 | 20 | 2.00x |" in text  # reaches 7.5 at step 20, pairwise at 10
    assert "| pairwise | 1 | 30 | 5.8000 | 10 | 1.00x |" in text  # (its half-written last line is skipped)
    assert "| original | 72.00 | 68.40 | 20 |" in text  # the benchmark's own 95% step
    svg = (tmp_path / "fig" / "study_loss.svg").read_text()
    assert "criterion: eval loss 7.50" in svg  # the threshold has a legend entry
    glue = (tmp_path / "fig" / "study_glue.svg").read_text()
    assert "95% of original" in glue and "rte, stsb (not the GLUE score)" in glue


def test_seeds_of_one_label_are_a_band_and_diagnostics_are_drawn(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for name, shift in (("a1", 0.0), ("a2", 0.4), ("b1", -1.0)):
        write_log(tmp_path / name, [(0, 10.0 + shift), (10, 8.0 + shift), (20, 6.0 + shift)], diag=True)
    plot.main(f"{tmp_path}/a1,{tmp_path}/a2,{tmp_path}/b1", "", "arm A,arm A,arm B", 7.0, "")
    text = capsys.readouterr().out
    assert "| arm A | 2 | 20 | 6.2000 (6.0000-6.4000) | 20, 20 | 2.00x |" in text  # mean and range over seeds
    assert "| arm B | 1 | 20 | 5.0000 | 10 | 1.00x |" in text
    svg = (tmp_path / "plot_loss.svg").read_text()  # default: next to the runs
    assert "arm A (mean of 2)" in svg and "arm B" in svg
    diag = (tmp_path / "plot_diagnostics.svg").read_text()
    assert "layer 2: attention entropy" in diag and "representation collapse" in diag


def test_bad_inputs_are_one_line(tmp_path):
    write_log(tmp_path / "empty", [])
    write_log(tmp_path / "broken", [(0, 10.0)], tail='{"type": "eval", "step": 5}\n{"type": "eval"')
    write_log(tmp_path / "ok", [(0, 10.0), (5, 9.0)])
    (tmp_path / "file").write_text("x")
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "log.jsonl").write_text("step,loss 0,10.0 25,9.0\n")  # one line: not a half-written one
    for args, msg in (([f"--runs={tmp_path}/empty"], "has no eval records"),
                      ([f"--runs={tmp_path}/notjson"], "is not JSON lines"),
                      ([f"--runs={tmp_path}/missing"], "cannot read"),
                      ([f"--runs={tmp_path}/broken"], "line 3: an eval record needs a step and a finite loss"),
                      ([f"--runs={tmp_path}/ok", f"--out={tmp_path}/file/fig"], "cannot create"),
                      ([f"--benchmarks={tmp_path}/ok"], "cannot read a checkpoint benchmark")):
        p = run_plot(*args)
        assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not list(tmp_path.glob("**/*.png"))


def test_missing_matplotlib_is_one_line(tmp_path):
    write_log(tmp_path / "ok", [(0, 10.0), (5, 9.0)])
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['plot.py', '--runs=" + str(tmp_path / "ok")
            + "']; import runpy; runpy.run_path('plot.py', run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and "plot: needs matplotlib" in p.stderr and "pip install matplotlib" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_band_covers_only_the_steps_every_seed_has():
    long = [{"step": s, "loss": 5.0} for s in (0, 25, 50, 75)]
    short = [{"step": s, "loss": 7.0} for s in (0, 25)]
    steps, mean, lo, hi = plot.band([long, short], lambda r: r["loss"])
    assert steps == [0, 25] and mean == [6.0, 6.0] and lo == [5.0, 5.0] and hi == [7.0, 7.0]


def test_final_step_is_a_range_when_seeds_end_apart(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    write_log(tmp_path / "a1", [(0, 10.0), (10, 7.0)])
    write_log(tmp_path / "a2", [(0, 10.0), (10, 8.0), (20, 6.0)])  # the longer run ends second
    plot.main([str(tmp_path / "a1"), str(tmp_path / "a2")], "", ["arm A"] * 2, 7.5, "")
    assert "| arm A | 2 | 10-20 | 6.5000 (6.0000-7.0000) | 10, 20 |" in capsys.readouterr().out

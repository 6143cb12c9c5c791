import json
import subprocess
import sys

import pytest

import plot

pytest.importorskip("matplotlib")


def write_log(path, evals):
    path.mkdir()
    with open(path / "log.jsonl", "w") as f:
        f.write(json.dumps({"type": "train", "step": 1, "loss": 11.0, "lr": 0.0, "tokens_per_s": 1.0}) + "\n")
        for step, loss in evals:
            f.write(json.dumps({"type": "eval", "step": step, "loss": loss, "accuracy": 0.1}) + "\n")


def test_plot_writes_figures_and_table(tmp_path, capsys):
    write_log(tmp_path / "orig", [(0, 10.8), (10, 9.0), (20, 7.5), (30, 6.0)])
    write_log(tmp_path / "pair", [(0, 10.8), (10, 7.4), (20, 6.2), (30, 5.8)])
    bench = tmp_path / "bench_pair"
    bench.mkdir()
    (bench / "benchmark.json").write_text(json.dumps({"records": [{"step": 10, "score": 50.0},
                                                                  {"step": 20, "score": 70.0},
                                                                  {"step": 30, "score": 72.0}]}))
    out = tmp_path / "fig" / "study"
    plot.main(f"{tmp_path}/orig,{tmp_path}/pair", str(bench), "original,pairwise", 7.5, str(out))
    for name in ("study_loss.png", "study_loss.svg", "study_glue.png", "study_glue.svg"):
        assert (tmp_path / "fig" / name).stat().st_size > 1000
    assert (tmp_path / "fig" / "study_loss.png").read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    assert "| original | 30 | 6.0000 | 20 | 2.00x |" in text  # reaches 7.5 at step 20, pairwise at 10
    assert "| pairwise | 30 | 5.8000 | 10 | 1.00x |" in text
    assert "| original | 72.00 | 68.40 | 20 |" in text  # first step with score >= 95% of the final one


def test_plot_rejects_log_without_eval_records(tmp_path):
    write_log(tmp_path / "run", [])
    p = subprocess.run([sys.executable, "plot.py", f"--runs={tmp_path}/run", f"--out={tmp_path}/x"],
                       capture_output=True, text=True, cwd=plot.os.path.dirname(plot.os.path.abspath(plot.__file__)))
    assert p.returncode != 0
    assert "has no eval records" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "x_loss.png").exists()

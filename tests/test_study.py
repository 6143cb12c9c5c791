"""study.py: the criterion and summary on hand-made logs, and the whole command on tiny runs."""
import json
import os
import subprocess
import sys

import pytest

import study
from common import lock_dir, unlock_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_log(run, losses, step=25):
    os.makedirs(run)
    with open(os.path.join(run, "log.jsonl"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"type": "train", "step": i * step + 1, "loss": 9.0}) + "\n")
            f.write(json.dumps({"type": "eval", "step": i * step, "loss": loss, "accuracy": 0.1,
                                "attn_entropy": [0.9, 0.8], "collapse": 0.5}) + "\n")


def test_steps_to_criterion_and_ratios_from_hand_made_logs(tmp_path):
    curves = {("original", "1"): [10.0, 6.0, 5.1, 5.0, 4.8, 4.5], ("original", "2"): [10.0, 6.0, 5.0, 4.9, 4.85, 4.7],
              ("pairwise", "1"): [10.0, 5.5, 4.8, 4.3, 4.0, 3.9], ("pairwise", "2"): [10.0, 5.9, 4.95, 4.79, 4.5, 4.2],
              ("symmetric", "1"): [10.0, 6.0, 5.5, 5.2, 5.0, 4.9], ("symmetric", "2"): [10.0, 6.0, 5.0, 4.7, 4.5, 4.4]}
    for (arm, seed), losses in curves.items():
        write_log(str(tmp_path / f"{arm}_s{seed}"), losses)
    runs = {arm: {s: study.run_summary(str(tmp_path / f"{arm}_s{s}"), 4.8) for s in ("1", "2")}
            for arm in ("original", "pairwise", "symmetric")}
    # by hand: the first eval step whose loss is <= 4.8 (steps 0, 25, 50, ...)
    assert [runs["original"][s]["steps_to_criterion"] for s in "12"] == [100, 125]
    assert [runs["pairwise"][s]["steps_to_criterion"] for s in "12"] == [50, 75]
    assert [runs["symmetric"][s]["steps_to_criterion"] for s in "12"] == [None, 75]  # seed 1 never gets there
    assert runs["pairwise"]["1"]["final_loss"] == 3.9 and runs["pairwise"]["1"]["final_collapse"] == 0.5
    per_arm, ratios = study.summarize(runs, 4.8)
    assert per_arm["original"]["steps_to_criterion"] == {"mean": 112.5, "min": 100, "max": 125, "n": 2}
    assert per_arm["symmetric"]["steps_to_criterion"]["mean"] is None and per_arm["symmetric"]["reached"] == 1
    assert ratios["original/pairwise"]["per_seed"] == {"1": 2.0, "2": 125 / 75}  # paired by seed
    assert ratios["original/pairwise"]["min"] == pytest.approx(125 / 75) and ratios["original/pairwise"]["max"] == 2.0
    assert ratios["original/symmetric"]["per_seed"] == {"1": None, "2": 125 / 75}
    assert ratios["original/symmetric"]["mean"] is None  # a seed that never reached it: no mean pretended
    runs["original"]["1"]["steps_to_criterion"] = None  # never reached in its 125 steps: the ratio is a bound
    assert study.summarize(runs, 4.8)[1]["original/pairwise"]["at_least_per_seed"] == {"1": 125 / 50}


def test_the_whole_study_on_tiny_runs(data_dir, tmp_path):
    base = tmp_path / "tiny_study.py"
    base.write_text(f'dataset = "{data_dir}"\nn_layer, n_head, n_embd, n_inner = 1, 2, 32, 64\nblock_size = 64\n'
                    'batch_size = 8\ngradient_accumulation_steps = 1\nmax_iters = 6\nlearning_rate = 1e-2\n'
                    'warmup_iters = 2\neval_interval = 2\neval_iters = 2\nlog_interval = 2\ncheckpoint_interval = 0\n'
                    'compile = False\n')
    args = [sys.executable, "study.py", f"--base={base}", "--arms=original,pairwise", "--seeds=1,2",
            "--threshold=10.5", f"--out_dir={tmp_path}/runs", f"--summary={tmp_path}/study.json",
            f"--figures={tmp_path}/fig"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((tmp_path / "study.json").read_text())
    assert set(s["runs"]) == {"original", "pairwise"} and set(s["runs"]["pairwise"]) == {"1", "2"}
    run = s["runs"]["pairwise"]["2"]
    assert run["final_step"] == 6 and [c[0] for c in run["curve"]] == [0, 2, 4, 6] and len(run["attn_entropy"]) == 4
    assert "--seed=2" in s["commands"][f"{tmp_path}/runs/pairwise_s2"] and s["threshold"] == 10.5
    assert "ratios" in s and "original/pairwise" in s["ratios"] and s["date"] and s["machine"]
    for name in ("fig_loss.png", "fig_diagnostics.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "| pairwise | 1, 2 |" in p.stdout
    part = args + ["--arms=original,symmetric,pairwise", "--train=False", f"--summary={tmp_path}/part.json"]
    lock_dir(str(tmp_path / "runs" / "original_s1"), "a test")  # as if training now: left out, not touched
    p = subprocess.run(part, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "left out: original_s1, symmetric_s1, symmetric_s2" in p.stdout, p.stderr
    part_s = json.loads((tmp_path / "part.json").read_text())
    assert part_s["seeds"] == {"original": ["2"], "pairwise": ["1", "2"]} and "started" not in p.stdout
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and "original_s1 is in use by a test" in p.stderr
    unlock_dir(str(tmp_path / "runs" / "original_s1"))
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # again: nothing re-run
    assert p.returncode == 0 and "started" not in p.stdout and "0 of them run now" in p.stdout
    assert json.loads((tmp_path / "study.json").read_text())["runs"] == s["runs"]
    p = subprocess.run(args + ["--train_args=--learning_rate=5e-3"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "holds a run of other settings (learning_rate 0.01 -> 0.005)" in p.stderr
    os.remove(tmp_path / "runs" / "original_s2" / "ckpt.pt")  # as if killed before its first checkpoint
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "original_s2 stopped before its first checkpoint: starting it again" in p.stdout
    assert "1 of them run now" in p.stdout
    for bad, msg in (("--jobs=0", "jobs must be >= 1"), ("--arms=orig", "arms must be a comma list of")):
        p = subprocess.run(args + [bad], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr

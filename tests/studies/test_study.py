"""study.py: its endpoints, the summary on hand-made logs with answers worked out by hand, the plan, and the whole
command on tiny runs (records written, nothing re-run, the summary rebuilt from the committed records alone). Its
statistics: test_stats.py; the launcher and the records: test_jobs.py."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, run_script, same
from lib.files import lock_dir, unlock_dir
from studies.jobs import read_record, unigram_loss
from studies.stats import holm
from plot import first_step_below
from studies import study


def test_the_rank_correlation_and_the_entropy_endpoint():
    ties = np.corrcoef([1, 2.5, 2.5, 4], [1, 3, 2, 4])[0, 1]  # the tied pair shares rank 2.5
    assert study.rank_correlation([(1, 1), (2, 3), (2, 2), (3, 4)]) == pytest.approx(ties)
    # undefined (a constant side) or two pairs (always +-1): None, null in the summary (JSON has no nan)
    assert study.rank_correlation([(100, 1), (100, 2), (100, 3)]) is None
    assert study.rank_correlation([(1, 1), (2, 2)]) is None and study.rank_correlation([]) is None
    ent = lambda steps: [{"step": s, "loss": 9.0, "attn_entropy": [e, e]} for s, e in steps]
    # step 25: 0.9; the first eval after it below 0.8 x 0.9 = 0.72 is step 75 (0.71), not step 50 (0.73)
    assert study.entropy_step(ent([(0, 1.0), (25, 0.9), (50, 0.73), (75, 0.71), (100, 0.5)])) == 75
    assert study.entropy_step(ent([(0, 1.0), (25, 0.9), (50, 0.85)])) is None
    assert study.entropy_step([{"step": 25, "loss": 9.0}]) is None  # no diagnostics recorded


def evals(losses, step=25):
    return [{"type": "eval", "step": i * step, "loss": l} for i, l in enumerate(losses)]


def test_summary_on_hand_made_curves():
    u = 5.0  # criterion: loss <= 4.5
    runs = {"original": {"1": evals([9, 5.0, 4.9, 4.5, 4.0]), "2": evals([9, 5.0, 4.9, 4.8, 4.7])},  # 75; censored 100
            "pairwise": {"1": evals([9, 5.0, 4.4]), "2": evals([9, 4.9, 4.5])}}  # 50, 50: stopped at min_steps
    s = study.censored_summary(runs, u, 100, drop=0.5, loss_step=50, sweep=[0.2, 0.5])
    o, p = s["per_arm"]["original"], s["per_arm"]["pairwise"]
    assert o["steps_to_criterion"] == {"1": 75, "2": None} and o["reached"] == 1 and o["n"] == 2
    assert o["km_median"] == 75 and o["rmst"] == pytest.approx(75 + 25 * 0.5)
    assert p["km_median"] == 50 and p["rmst"] == 50
    assert o["loss_at_50"]["per_seed"] == {"1": 4.9, "2": 4.9} and p["loss_at_50"]["mean"] == pytest.approx(4.45)
    c = {x["endpoint"]: x for x in s["comparisons"] if x["arm"] == "pairwise" and x["reference"] == "original"}
    loss = c["loss_at_50"]  # differences -0.5 and -0.4: mean -0.45, se 0.05, t = -9 with 1 degree of freedom
    assert loss["mean"] == pytest.approx(-0.45) and loss["per_seed"] == pytest.approx({"1": -0.5, "2": -0.4})
    assert loss["p_t"] == pytest.approx(1 - 2 * np.arctan(9) / np.pi)  # Cauchy tails
    assert loss["ci95"] == pytest.approx([-0.45 - 12.706204736 * 0.05, -0.45 + 12.706204736 * 0.05])
    assert loss["p_sign_flip"] == 0.5 and loss["p_holm"] == loss["p_t"]  # the family's only comparison
    # steps: 50 vs 75, and 50 vs the cap (the original's seed 2 never met it: counted as 100, conservative)
    assert c["log_steps"]["per_seed"] == pytest.approx({"1": np.log(50 / 75), "2": np.log(50 / 100)})
    assert "log_entropy_step" not in c and "loss_at_cap" not in c  # no diagnostics; nobody reached the cap
    # the sweep, 0.2 below U (4.8): original 75 and 75 (4.8 <= 4.8 counts); pairwise 50 and 50 (4.9 > 4.8 at 25)
    assert s["sweep"]["0.2"]["original"] == {"km_median": 75, "reached": 2, "n": 2}
    assert s["sweep"]["0.2"]["pairwise"] == {"km_median": 50, "reached": 2, "n": 2}
    assert s["sweep"]["0.5"]["original"] == {"km_median": 75, "reached": 1, "n": 2}


def test_the_loss_endpoint_stays_at_its_step_when_runs_train_longer():
    """Runs trained to the cap (--min_steps=cap, as on the second corpus) keep the pre-registered loss endpoint:
    the summary's loss is at loss_step, not at min_steps."""
    runs = {"original": {"1": evals([9, 5.0, 4.9, 4.5, 4.0]), "2": evals([9, 5.0, 4.8, 4.8, 4.7])},
            "pairwise": {"1": evals([9, 5.0, 4.4, 4.3, 4.2]), "2": evals([9, 4.9, 4.5, 4.4, 4.1])}}
    s = study.censored_summary(runs, 5.0, 100, drop=0.5, loss_step=50, sweep=[])
    assert s["per_arm"]["original"]["loss_at_50"]["per_seed"] == {"1": 4.9, "2": 4.8}
    assert "loss_at_100" not in s["per_arm"]["original"]
    c = {x["endpoint"]: x for x in s["comparisons"]}
    assert c["loss_at_50"]["per_seed"] == pytest.approx({"1": -0.5, "2": -0.3})
    assert c["loss_at_cap"]["per_seed"] == pytest.approx({"1": 0.2, "2": -0.6})


def test_comparisons_holm_within_a_family_and_the_new_seeds_alone():
    seeds = ["2", "7", "8", "9"]
    base = {sd: evals([9, 5.0, 4.9, 4.4]) for sd in seeds}  # loss 4.9 at step 50
    arm = lambda ds: {sd: evals([9, 5.0, 4.9 + d, 4.4]) for sd, d in zip(seeds, ds)}
    runs = {"original": base, "pairwise": arm([-0.3, -0.2, -0.25, -0.35]), "original_scaled": arm([0.1, -0.1, 0, 0.05]),
            "symmetric": arm([-0.3, -0.2, -0.25, -0.35])}
    c = {(x["arm"], x["endpoint"]): x for x in study.censored_summary(runs, 5.0, 100, 0.5, 50, [])["comparisons"]}
    primary = [c[("pairwise", "loss_at_50")], c[("original_scaled", "loss_at_50")]]
    assert [x["p_holm"] for x in primary] == pytest.approx(holm([x["p_t"] for x in primary]))
    sym = c[("symmetric", "loss_at_50")]  # the same numbers as pairwise, but alone in its family: no adjustment
    assert sym["p_t"] == pytest.approx(primary[0]["p_t"]) and sym["p_holm"] == sym["p_t"] < primary[0]["p_holm"]
    new = primary[0]["new_seeds"]  # seeds 7, 8, 9 (NEW_SEEDS = 7): the replication
    assert new["seeds"] == ["7", "8", "9"] and new["mean"] == pytest.approx(-0.8 / 3)


def test_the_whole_study_on_tiny_runs(data_dir_gpt2, tmp_path):  # its level, U + 2.5, is GPT-2's vocabulary's
    data = tmp_path / "data"
    shutil.copytree(data_dir_gpt2, data)
    base = tmp_path / "tiny_study.py"
    base.write_text(f'dataset = "{data}"\nn_layer, n_head, n_embd, n_inner = 1, 2, 32, 64\nblock_size = 64\n'
                    'batch_size = 8\ngradient_accumulation_steps = 1\nmax_iters = 12\nlearning_rate = 1e-2\n'
                    'warmup_iters = 2\ndecay_lr = False\neval_interval = 2\neval_iters = 2\nlog_interval = 2\n'
                    'checkpoint_interval = 0\ncompile = False\ndtype = "float32"\n')
    u = unigram_loss(str(data), 64, 8, 2)
    args = ["studies/study.py", f"--base={base}", "--arms=original,pairwise", "--seeds=1,2", "--drop=-2.5",
            "--min_steps=8", "--loss_step=8", "--sweep=-2.5,-1", f"--out_dir={tmp_path}/runs",
            f"--records={tmp_path}/rec", f"--summary={tmp_path}/study.json", f"--figures={tmp_path}/fig"]
    run = lambda *extra: run_script(*args, *extra)
    p = run()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "0 of 4 runs recorded" in p.stdout and "4 to train" in p.stdout
    s = json.loads((tmp_path / "study.json").read_text())
    assert s["unigram_loss"] == pytest.approx(u) and s["level"] == pytest.approx(u + 2.5) and s["cap"] == 12
    for arm in ("original", "pairwise"):
        for sd in ("1", "2"):
            head, ev = read_record(str(tmp_path / "rec" / f"{arm}_s{sd}.jsonl"))
            assert head["config"]["seed"] == int(sd) and head["config"]["attention_type"] == arm
            head_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
            assert head["commit"].split("+")[0] == head_commit.stdout.strip()  # the code that trained it
            met, deepest = first_step_below(ev, u + 2.5), first_step_below(ev, u + 1)  # the sweep's deepest: -1
            # train.py stopped at the first eval at or after min_steps once the sweep's deepest criterion was met
            assert ev[-1]["step"] == (max(deepest, 8) if deepest is not None else 12), (arm, sd, deepest, ev[-1])
            assert s["per_arm"][arm]["steps_to_criterion"][sd] == met
    for name in ("fig_loss.png", "fig_diagnostics.png", "fig_survival.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "| pairwise | 2 |" in p.stdout

    p = run()  # again: nothing is trained, the same summary
    assert p.returncode == 0 and "4 of 4 runs recorded" in p.stdout and "started" not in p.stdout
    assert json.loads((tmp_path / "study.json").read_text()) == s

    p = run("--train_args=--learning_rate=5e-3")
    assert p.returncode == 1 and "is a run of other settings (learning_rate 0.01 -> 0.005)" in p.stderr
    for bad, msg in (("--jobs=0", "jobs must be >= 1"), ("--arms=orig", "arms must be a comma list of"),
                     ("--loss_step=10", "loss_step <= min_steps")):  # runs stopping at 8 would lack the endpoint
        p = run(bad)
        assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr

    # a fresh clone: the records alone, no data, no run folders
    shutil.rmtree(data)
    shutil.rmtree(tmp_path / "runs")
    p = run("--train=False", f"--summary={tmp_path}/again.json", f"--figures={tmp_path}/again")
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "again.json").read_text()) == s
    p = run("--train=False", "--arms=original,symmetric,pairwise", f"--summary={tmp_path}/part.json", "--figures=")
    assert p.returncode == 0 and "not yet run: symmetric_s1, symmetric_s2" in p.stdout, p.stderr
    assert json.loads((tmp_path / "part.json").read_text())["missing"] == ["symmetric_s1", "symmetric_s2"]



def test_a_run_in_use_is_not_touched(data_dir, tmp_path):
    base = tmp_path / "b.py"
    base.write_text(f'dataset = "{data_dir}"\nn_layer, n_head, n_embd, n_inner = 1, 2, 32, 64\nblock_size = 64\n'
                    'batch_size = 8\nmax_iters = 4\neval_interval = 2\neval_iters = 2\ncompile = False\n')
    lock_dir(str(tmp_path / "runs" / "original_s1"), "a test")  # as if training now
    p = run_script("studies/study.py", f"--base={base}", "--arms=original", "--seeds=1", f"--out_dir={tmp_path}/runs",
                   f"--records={tmp_path}/rec", "--summary=", "--figures=", "--min_steps=2", "--loss_step=2", timeout=300)
    unlock_dir(str(tmp_path / "runs" / "original_s1"))
    assert p.returncode == 1 and "original_s1 is in use by a test" in p.stderr and not (tmp_path / "rec").exists()


def test_the_plan_gives_each_family_its_own_number_of_seeds():
    plan = study.plan_runs("original,symmetric,original_heat", "", 2, "studies/config/study.py", "")
    seeds = {arm: [sd for a, sd, _ in plan if a == arm] for arm in ("original", "symmetric", "original_heat")}
    assert seeds == {"original": [str(s) for s in range(2, 2 + study.SEEDS["primary"])],
                     "symmetric": [str(s) for s in range(2, 2 + study.SEEDS["exploratory"])],
                     "original_heat": [str(s) for s in range(2, 2 + study.SEEDS["start_or_step"])]}
    assert [sd for _, sd, _ in plan] == sorted((sd for _, sd, _ in plan), key=int)  # seed-major
    plan = study.plan_runs("original,symmetric,original_heat", "7,9", 2, "b.py", "--device=cuda")
    assert {sd for _, sd, _ in plan} == {"7", "9"} and len(plan) == 6  # a list given: every arm has exactly those
    heat = next(cmd for a, _, cmd in plan if a == "original_heat")
    assert heat == ["b.py", "--attention_type=original", "--score_scale=8.0", "--score_scale_warmup=500", "--seed=7",
                    "--device=cuda"]  # the pre-registered arm (docs/study.md), then the extra train.py arguments
    assert [a for a, _, _ in study.plan_runs("", "3", 2, "b.py", "")] == list(study.ARMS)  # '': every arm, in order


def test_the_entropy_median_counts_runs_whose_entropy_never_dropped():

    def run(entropies):  # mean entropy per eval, from step 0: the drop is below 0.8 x the value at step 25
        return [{"type": "eval", "step": i * 25, "loss": 9.0, "attn_entropy": [h]} for i, h in enumerate(entropies)]

    dropped, flat = run([1.0, 1.0, 0.9, 0.7, 0.6]), run([1.0, 1.0, 1.0, 0.9, 0.9])  # 75; never (last step 100)
    summary = lambda runs: study.censored_summary({"original": runs}, 9.5, 100, 0.7, 50, [0.5])["per_arm"]["original"]
    s = summary({"1": dropped, "2": flat, "3": flat})
    assert s["entropy_step"] == {"1": 75, "2": None, "3": None}
    assert s["entropy_step_median"] is None  # two of three never dropped: not the one that did (75)
    s = summary({"1": dropped, "2": dropped, "3": flat})
    assert s["entropy_step_median"] == 75


def test_the_prose_config_is_the_study_config_on_another_corpus():
    from configurator import read_file  # the two files are kept flat (nanoGPT's style); this keeps them in step
    gcide, prose = (read_file(os.path.join(ROOT, "studies", "config", f)) for f in ("study.py", "study_prose.py"))
    assert set(gcide) == set(prose)
    assert {k for k in gcide if gcide[k] != prose[k]} == {"dataset", "out_dir"}


def test_the_prose_plan_summarises_its_committed_records(tmp_path):
    """studies/config/study_prose_plan.py is study.py's plan for the second corpus: from the committed records alone (no
    data), its summary has the pre-registered step-1,000 loss beside the loss at the cap, though its runs train to
    the cap."""
    p = run_script("studies/study.py", "studies/config/study_prose_plan.py", "--train=False",
                   f"--summary={tmp_path}/prose.json", "--figures=", timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "prose.json").read_text())
    assert s["base_config"] == "studies/config/study_prose.py" and s["min_steps"] == 3000 and s["loss_step"] == 1000
    assert set(s["arms"]) <= {"original", "pairwise", "original_scaled", "original_heat"} and "original" in s["arms"]
    head, evals = read_record(os.path.join(ROOT, "assets", "study_prose", "original_s2.jsonl"))
    assert s["per_arm"]["original"]["loss_at_1000"]["per_seed"]["2"] == study.loss_at(evals, 1000)
    assert s["unigram_loss"] == pytest.approx(head["unigram_loss"])


def test_the_per_seed_table_pairs_each_seed_across_arms(capsys):

    def run(losses, entropies):
        return [{"type": "eval", "step": i * 25, "loss": l, "attn_entropy": [h]}
                for i, (l, h) in enumerate(zip(losses, entropies))]
    runs = {"original": {"2": run([9, 5.0, 4.9, 4.5, 4.4], [1, 1, 0.9, 0.7, 0.7]),   # criterion 75, entropy 75
                         "3": run([9, 5.0, 4.9, 4.8, 4.7], [1, 1, 1, 1, 1])},       # censored, never
            "pairwise": {"3": run([9, 5.0, 4.4, 4.3, 4.2], [1, 1, 0.5, 0.5, 0.5])}}  # 50, 50; no seed 2
    study.per_seed_table(study.censored_summary(runs, 5.0, 100, 0.5, 50, [])["per_arm"], 100)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0] == "| seed | original | pairwise |"
    assert rows[1:] == ["| 2 | 75 (75) | - |", "| 3 | > 100 (never) | 50 (50) |"]


@pytest.mark.parametrize("plan, committed", [([], "study.json"), (["studies/config/study_prose_plan.py"], "study_prose.json")])
def test_the_committed_summaries_are_what_the_committed_records_give(tmp_path, plan, committed):
    """A fresh clone reproduces each corpus's summary from its records alone: a record committed without its
    summary brought up to date (or a summary edited by hand) fails here."""
    p = run_script("studies/study.py", *plan, "--train=False", f"--summary={tmp_path}/s.json", "--figures=",
                   timeout=300)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(ROOT, "assets", committed)) as f:
        assert same(json.loads((tmp_path / "s.json").read_text()), json.load(f))

"""studies/study_small.py, the third study's GPU runner, on the CPU at toy sizes (--dry: a tiny model, the built-in
corpus packed as the GPU run gets it, toy GLUE files; never /work/shared or a GPU): each job's record written as it
ends and bundled for the device tool, a second run continuing where the records end (a model whose fine-tunes are
missing is pre-trained again), the deadline and the hard stop, the summary rebuilt byte for byte from the records,
and bad inputs in one line. ~5 minutes on 2 busy cores."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, run_script
from test_train import one_line_error
from studies import carry as travel, study_small as ss


def run(work, *args, timeout=900, env=None):
    """The runner in dry mode on `work` (its inputs made there on first use), one torch thread per job; forked from a
    server that has imported torch (conftest.run_script), no $OUT (its output under work)."""
    return run_script("studies/study_small.py", "--dry=True", f"--work={work}", *args, env={"OUT": "", **(env or {})},
                      timeout=timeout)


def ok(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def copy_work(src, dst, keep=("carry", "records")):
    """A fresh machine's view of a dry work folder: its inputs and records, no runs, no unpacked data."""
    dst.mkdir()
    for k in keep:
        if (src / k).exists():
            shutil.copytree(src / k, dst / k)
    return dst


def tar_names(path):
    with tarfile.open(path) as t:
        return sorted(n for n in t.getnames() if n != "MANIFEST")  # lib/files.tar_writer's list of the others


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    """The dry pilot, once: its inputs made (packed as --prepare packs them), its 7 jobs run."""
    work = tmp_path_factory.mktemp("small") / "work"
    p = run(work, "--phase=pilot")
    return work, ok(p)


def test_the_pilot_records_each_job_as_it_ends_and_picks_by_its_rules(pilot):
    work, out = pilot
    done = re.findall(r"done (\S+) in .*?: (\S+) \(", out)
    assert len(done) == 7, out  # 2 pilot runs, the untrained model, 2 fine-tuning lrs x (best run, untrained)
    for name, path in done:  # each record is named in the job's own 'done' line: written as the job ended
        assert os.path.basename(path).startswith(name) and os.path.exists(path)
    assert tar_names(work / "out" / "records.tar") == sorted(os.path.basename(p) for _, p in done)
    logs = tar_names(work / "out" / "logs.tar.gz")
    assert "init_s1/log.jsonl" in logs and "init_s1.glue_lr1e-4_s1/job.txt" in logs
    events = re.findall(r"(started|done) (\S+\.glue_\S+)", out)  # the fine-tunes run side by side (jobs at once)
    assert [e for e, _ in events[:events.index(next(e for e in events if e[0] == "done"))]].count("started") >= 2, out
    assert (work / "out" / "study_small.log").read_text().count("done ") == 7
    s = json.loads((work / "summary.json").read_text())
    p = s["pilot"]
    losses = {r["lr"]: r["mlm_loss"] for r in p["runs"].values()}
    assert p["picked_lr"] == min(losses, key=losses.get)  # the lowest final eval loss
    g = {r["lr"]: r["pilot_model"]["score"] for r in p["glue"].values()}
    assert p["picked_glue_lr"] == max(g, key=g.get) and p["glue_model"] == "pilot_lr1e-3_s1"  # the first run's
    head = json.loads((work / "records" / "pilot_lr1e-3_s1.jsonl").read_text().splitlines()[0])
    assert head["gpu"].endswith("(CPU, dry)") and head["data"] and head["timing"]["tokens_per_s"] > 0
    assert head["config"]["max_iters"] == 4 and head["config"]["warmup_iters"] == 0  # 2,048 tokens of 512


def test_the_calibration_then_again_then_from_the_records_alone(pilot, tmp_path):
    """The calibration's summary (the untrained model and each snapshot: tokens, GLUE-4, tasks); the same command
    again runs nothing; the records alone rebuild the summary and the figure byte for byte."""
    work = tmp_path / "w"
    shutil.copytree(pilot[0], work)
    out = ok(run(work, "--phase=calibration"))
    assert "calibration: 8 jobs, 2 recorded" in out  # the untrained model and its seed-1 fine-tune: the pilot's
    c = json.loads((work / "summary.json").read_text())["calibration"]
    assert [p["tokens"] for p in c["points"]] == [0, 1024, 3072] and [p["step"] for p in c["points"]] == [0, 2, 6]
    for p in c["points"]:
        assert sorted(p["glue4_per_seed"]) == ["1", "2"] and set(p["tasks"]) == {"sst2", "mrpc", "stsb", "rte"}
        assert p["glue4"] == pytest.approx(np.mean(list(p["glue4_per_seed"].values())))
        assert p["mlm_loss"] > 0
    assert [g["tokens"] for g in c["gain"]] == [1024, 3072] and set(c["first_clear"]) == {"glue4", "sst2", "mrpc",
                                                                                           "stsb", "rte"}
    s = json.loads((work / "summary.json").read_text())
    assert s["per_arm"] == {} and s["gpu"] and all(m.startswith("comparison: ") for m in s["missing"])

    again = ok(run(work, "--phase=calibration"))
    assert "8 jobs, 8 recorded" in again and "started" not in again
    assert json.loads((work / "summary.json").read_text()) == s

    fresh = tmp_path / "fresh"  # a clone: the records, nothing else
    shutil.copytree(work / "records", fresh)
    shutil.rmtree(work / "runs")
    shutil.rmtree(work / "data")
    ok(run(work, "--train=False", f"--records={fresh}", f"--summary={tmp_path}/s.json", f"--figures={tmp_path}/f"))
    for a, b in (("summary.json", "s.json"), ("study_small.png", "f.png"), ("study_small.svg", "f.svg")):
        assert (work / a).read_bytes() == (tmp_path / b).read_bytes(), a


def test_a_hard_stop_keeps_what_finished_and_the_next_run_continues(pilot, tmp_path):
    """Stopped at stop_s with jobs running: exit 3, every finished job's record in records.tar; the next run, on a
    bare machine, skips every recorded job, pre-trains a recorded model again for its missing fine-tunes (no
    checkpoint came back) and does the rest."""
    work = copy_work(pilot[0], tmp_path / "w")
    # one job at a time, each a new interpreter as in a study (not the fork server: ~2 s a job on fast cores): 8 jobs
    # take > 20 s of imports alone, so one still runs at 12 s on any machine
    p = run(work, "--phase=calibration", "--time_scale=0.01", "--jobs=1", "--budget_s=12", "--stop_s=12",
            env={"STUDY_JOBS_FORKED": ""})
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    finished = sorted(os.path.basename(x) for x in re.findall(r"done \S+ in .*?: (\S+) \(", p.stdout))
    assert "stopped while running (the next run starts them again)" in p.stdout
    assert tar_names(work / "out" / "records.tar") == finished
    left = re.search(r"left for the next run: (.*)", p.stdout).group(1).split(", ")
    missing = [m.split(": ")[1] for m in json.loads((work / "summary.json").read_text())["missing"]
               if m.startswith("calibration: ")]
    assert missing and set(missing) <= set(left)  # those never started too
    shutil.rmtree(work / "runs")  # the next GPU run starts bare
    shutil.rmtree(work / "data")
    before = {f: (work / "records" / f).read_bytes() for f in os.listdir(work / "records")}
    out = ok(run(work, "--phase=calibration"))
    started = re.findall(r"started (\S+)", out)
    assert not {f for f in finished if ".glue" in f} & {x + ".json" for x in started}  # no fine-tune twice
    assert all((work / "records" / f).read_bytes() == b for f, b in before.items())  # no record rewritten
    assert "calib_s1" in started  # its snapshots' fine-tunes need it here
    s = json.loads((work / "summary.json").read_text())
    assert not [m for m in s["missing"] if m.startswith("calibration")]
    made = "calib_s1.rerun1" if "calib_s1.jsonl" in finished else "calib_s1"
    assert os.path.exists(work / "records" / f"{made}.jsonl")  # a first record stays as it was
    (last,) = [f for f in os.listdir(work / "records") if re.fullmatch(r"calib_s1_t3072\.glue_\S+_s2\.json", f)]
    g = json.loads((work / "records" / last).read_text())
    assert g["pretrained_by"] == made and g["gpu"].endswith("(CPU, dry)") and g["job_s"] > 0


def test_the_hard_stop_is_no_error_of_what_it_interrupts(monkeypatch, tmp_path):
    """stop_s's alarm comes anywhere: inside a checkpoint read (whose handler makes any Exception one line) it is
    still the stop (a hard-stop run once exited 1 with 'ckpt.pt is not a readable checkpoint (HardStop: )')."""
    from lib import checkpoint

    def alarm(*args, **kwargs):
        raise ss.HardStop
    monkeypatch.setattr(checkpoint.torch, "load", alarm)
    with pytest.raises(ss.HardStop):
        checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))


def test_a_deadline_starts_nothing_that_cannot_end_before_it(pilot, tmp_path):
    work = copy_work(pilot[0], tmp_path / "w")
    out = ok(run(work, "--phase=calibration", "--budget_s=0.1", "--stop_s=300", "--summary=", "--figures="))  # no
    # job ends in 0.1 s (at 3 s, the untrained model's ~1 s fitted once the jobs started faster)
    assert "started" not in out and "left for the next run: calib_s1 (~" in out
    assert re.search(r"left for the next run: calib_s1_t1024\.glue_lr\S+_s1 \(calib_s1 did not run\)", out)
    assert sorted(os.listdir(work / "records")) == sorted(os.listdir(pilot[0] / "records"))


def test_the_deadline_rule(monkeypatch):
    """may_start: a job starts only if its estimate (x time_scale) ends by budget_s; a pre-training also needs the
    fine-tunes of its final model after it; its fine-tunes go when it goes; one pre-training at a time, at most
    `jobs` fine-tunes, and without overlap none beside a pre-training."""
    monkeypatch.setattr(ss, "time_scale", 1.0)
    monkeypatch.setattr(ss, "jobs", 2)
    monkeypatch.setattr(ss, "budget_s", 120.0)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(ss, "phase", "calibration")
    monkeypatch.setattr(ss, "T0", 0.0)
    clock = [0.0]
    monkeypatch.setattr(ss.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ss, "model_ready", lambda s: True)
    t = {**ss.TIMES["gpu"], "fixed_cold": 30.0, "fixed_warm": 10.0, "tokens_per_s": 1e6, "end": 0.0, "glue": 20.0}
    r = ss.Runner({}, {"type": "cuda", "name": "G"}, t, 7.0, "d")
    pre = ss.Step("pretrain", "p", [], "", "", 100, 40_000_000)  # 30 + 40 s, cold
    g = [ss.Step("glue", f"p.g{i}", [], "", "", 100 if i < 3 else 50, 0, owner="p") for i in range(4)]
    r.steps = {s.name: s for s in [pre, *g]}
    r.round = set(r.steps)
    job = lambda s: ss.Job(s.name, "", "", [], None)
    clock[0] = 11.0  # 70 s + its 3 final fine-tunes, 2 at a time (40 s): 121 > 120
    assert r.may_start(job(pre), []) is False and "p" in r.dropped
    assert r.may_start(job(g[0]), []) is False and "p did not run" in r.dropped["p.g0"]
    r.dropped.clear()
    clock[0] = 0.0
    assert r.may_start(job(pre), []) is True and r.started["p"][2] is True  # 110 <= 120; its first compile: cold
    clock[0] = 75.0
    assert r.may_start(job(g[3]), ["p"]) is True  # 75 + 20 <= 120, beside the pre-training (overlap)
    assert r.may_start(job(g[0]), ["p", "p.g3"]) is True
    assert r.may_start(job(g[1]), ["p", "p.g3", "p.g0"]) is None  # `jobs` fine-tunes run already
    clock[0] = 101.0
    assert r.may_start(job(g[1]), ["p.g0"]) is False and "~20 s estimated, 19 s left" in r.dropped["p.g1"]
    monkeypatch.setattr(ss, "phase", "comparison")  # without overlap
    r2 = ss.Runner({}, {"type": "cuda", "name": "G"}, t, 7.0, "d")
    q = ss.Step("pretrain", "q", [], "", "", 1, 1)
    r2.steps, clock[0] = {**r.steps, "q": q}, 0.0
    r2.round = set(r2.steps)
    assert r2.may_start(job(g[3]), ["p"]) is None  # no fine-tune beside a pre-training
    assert r2.may_start(job(pre), ["p.g3"]) is None  # nor a pre-training beside a fine-tune
    assert r2.may_start(job(q), ["p"]) is None  # one pre-training at a time
    assert r2.may_start(job(q), []) is True


def test_the_calibration_summary_by_hand(monkeypatch):
    """Each point's GLUE-4 the mean of its fine-tuning seeds; its gain over the untrained model with the pooled
    fine-tuning sd of every point (t at 97.5%, one-sided); clear when the bound is above 0; the first clear point."""
    stats = pytest.importorskip("scipy.stats")
    monkeypatch.chdir(ROOT)
    for k, v in {"train_args": ss.DRY["train_args"], "points": "1024,3072", "learning_rate": 1e-2, "glue_lr": 1e-4,
                 "data_dir": "data/english", "glue_seeds": "1,2"}.items():
        monkeypatch.setattr(ss, k, v)
    cfg = ss.base_config()
    steps = ss.plan(cfg, {}, "calibration")
    scores = {"init_s1": (50.0, 52.0), "calib_s1_t1024": (51.0, 55.0), "calib_s1_t3072": (60.0, 62.0)}
    recs = {}
    for s in steps:
        if s.kind == "glue":
            model, sd = s.name.split(".glue_")[0], ss.seed_of(s)
            x = scores[model][int(sd) - 1]
            recs[s.name] = {"request": {}, "runs": {t: {sd: {"dev": {t: {"score": x + i}}}} for i, t in
                                                    enumerate(ss.tasks.split(","))}}
    ev = [{"step": st, "loss": 10.0 - st, "accuracy": 0.01 * st} for st in range(0, 7, 2)]
    recs["calib_s1"] = ({"unigram_loss": 7.5}, ev)
    recs["init_s1"] = ({"unigram_loss": 7.5}, ev[:1])
    recs["calib_s1.rerun1"] = ({"unigram_loss": 7.5}, ev[:2])  # made again to its first snapshot: the same bits
    recs["calib_s1.rerun2"] = ({"unigram_loss": 7.5}, [ev[0], {**ev[1], "loss": 8.0 + 1e-12}])  # another CPU's
    c = ss.calibration_summary(cfg, recs)
    assert c["reruns"] == {"calib_s1.rerun1": {"step": 2, "loss": 8.0, "as_first": True},
                           "calib_s1.rerun2": {"step": 2, "loss": 8.0 + 1e-12, "as_first": False}}
    assert [p["glue4"] for p in c["points"]] == [52.5, 54.5, 62.5]  # the task offsets 0..3 average to +1.5
    groups = [np.array(v) + 1.5 for v in scores.values()]
    sd = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / 3)
    assert c["noise"]["glue4"] == {"sd": pytest.approx(sd), "df": 3}
    half = stats.t.ppf(0.975, 3) * sd * math.sqrt(1 / 2 + 1 / 2)
    g1, g2 = (x["glue4"] for x in c["gain"])
    assert g1["diff"] == pytest.approx(2.0) and g1["half95"] == pytest.approx(half) and not g1["clear"]
    assert g2["diff"] == pytest.approx(10.0) and g2["clear"]
    assert c["first_clear"]["glue4"] == {"tokens": 3072, "diff": pytest.approx(10.0), "train_hours": None}
    assert c["plateau_exit_step"] == 4 and c["final"]["mlm_loss"] == 4.0  # 10 - step <= 7.5 - 0.7
    assert c["seeds_for_delta"]["glue4"]["2"] == math.ceil(((1.96 + 0.84) * sd * math.sqrt(2 / 2) / 2) ** 2 + 2)
    del recs[next(n for n in recs if n.startswith("calib_s1_t3072.") and n.endswith("_s2"))]
    c = ss.calibration_summary(cfg, recs)  # a point with fewer seeds than the plan's: its gain is not clear yet
    g2 = c["gain"][1]["glue4"]
    assert g2["seeds"] == [1, 2] and g2["diff"] == pytest.approx(9.0) and not g2["clear"]
    assert c["first_clear"]["glue4"] is None


def test_the_comparison_per_arm(pilot, tmp_path):
    """The comparison at its budget: paired seeds per arm, whole models in order (each pre-training's fine-tunes and
    probe before the next pre-training, a seed's models before the next seed's), each run's endpoints (MLM at the cap
    and at equal time, GLUE-4 and its tasks, the plateau exit, its step time, the frozen probes) and the arms against
    the original; the untrained model of each seed beside them, outside the operators' Holm family; a summary with
    jobs missing says it is partial."""
    work = copy_work(pilot[0], tmp_path / "w")
    out = ok(run(work, "--phase=comparison", "--glue_seeds=1", "--arms=original,pairwise,untrained", "--probes=True"))
    model_of = lambda job: job.split(".")[0]
    events = re.findall(r"(started|done) (\S+)", out)
    starts = [(i, job) for i, (e, job) in enumerate(events) if e == "started" and "." not in job and
              not job.startswith("init")]  # the pre-trainings, in the order they started
    assert [job for _, job in starts] == ["original_s2", "pairwise_s2", "original_s3", "pairwise_s3"], out
    for (_, a), (i, b) in zip(starts, starts[1:]):  # a model's fine-tune and probe are done before the next starts
        assert max(j for j, (e, job) in enumerate(events) if e == "done" and "." in job and model_of(job) == a) < i
    assert max(j for j, (e, job) in enumerate(events) if e == "done" and model_of(job).endswith("_s2")) < starts[2][0]
    s = json.loads((work / "summary.json").read_text())
    assert s["comparison"]["partial"] is False and "Partial" not in out
    assert set(s["per_arm"]) == {"original", "pairwise", "untrained"} and s["comparison"]["cap"] == 4
    for a, p in s["per_arm"].items():
        assert p["seeds"] == ["2", "3"] and set(p["glue4"]) == {"2", "3"}
        for k in ("stsb_cosine", "sst2_logreg"):  # each model's probe record, read back
            assert p["probe"][k] == {sd: json.loads((work / "records" / f"{'init' if a == 'untrained' else a}_s{sd}"
                                                              f".probe.json").read_text())[k] for sd in ("2", "3")}
        if a != "untrained":
            assert p["ms_per_step"] > 0
            assert set(p["mlm_accuracy_at_cap"]) == {"2", "3"} and set(p["plateau_exit_step"]) == {"2", "3"}
    probes = [c for c in s["comparisons"] if c["endpoint"].startswith("probe_")]
    assert sorted((c["endpoint"], c["arm"]) for c in probes) == sorted(
        (f"probe_{k}", a) for k in ("stsb_cosine", "sst2_logreg") for a in ("pairwise", "untrained"))
    for c in probes:
        x = s["per_arm"][c["arm"]]["probe"][c["endpoint"][6:]]
        y = s["per_arm"]["original"]["probe"][c["endpoint"][6:]]
        assert c["mean"] == pytest.approx(np.mean([x[sd] - y[sd] for sd in ("2", "3")]), abs=1e-9)
        assert c["reference"] == "original" and c["p_holm"] == (None if c["arm"] == "untrained" else c["p_t"])
    g4 = lambda a: s["per_arm"][a]["glue4"]
    gains = {c["arm"]: c for c in s["comparisons"] if c["endpoint"] == "glue4_over_untrained"}
    assert set(gains) == {"original", "pairwise"}
    for a, c in gains.items():  # each arm's gain over the untrained model of its seed, outside the family
        assert c["mean"] == pytest.approx(np.mean([g4(a)[sd] - g4("untrained")[sd] for sd in ("2", "3")]), abs=1e-9)
        assert c["reference"] == "untrained" and c["p_holm"] is None
    per_task = [c for c in s["comparisons"] if c["endpoint"].startswith("task_")]
    tasks = s["per_arm"]["original"]["glue4_tasks"]["2"]
    assert sorted(c["endpoint"] for c in per_task) == sorted(f"task_{t}" for t in tasks)
    for c in per_task:
        t = c["endpoint"][5:]
        x, y = (s["per_arm"][a]["glue4_tasks"] for a in ("pairwise", "original"))
        assert c["arm"] == "pairwise" and c["mean"] == pytest.approx(np.mean([x[sd][t] - y[sd][t] for sd in ("2", "3")]))
    ends = {c["endpoint"] for c in s["comparisons"]}
    # accuracy is compared as a ratio: not where a seed's is 0 (at 2,048 ids the toy's 4 steps can leave one there;
    # at equal time it is interpolated between evals, so it may be compared where the cap's is not)
    acc = all(v > 0 for a, p in s["per_arm"].items() if a != "untrained" for v in p["mlm_accuracy_at_cap"].values())
    assert {"glue4", "mlm_loss_at_cap"} <= ends and ("mlm_accuracy_at_cap" in ends) == acc
    assert set(s["comparison"]["time_matched_steps"]) == {"original", "pairwise"}
    assert "| pairwise | 2 |" in out and "stsb_cosine (frozen)" in out
    (work / "records" / "pairwise_s3.probe.json").unlink()  # a job missing: the summary says so first
    out = ok(run(work, "--phase=comparison", "--glue_seeds=1", "--arms=original,pairwise,untrained", "--probes=True",
                 "--train=False"))
    assert json.loads((work / "summary.json").read_text())["comparison"]["partial"] is True
    assert "**Partial: some of the comparison's jobs have not run" in out


def test_unpacking_a_gpu_runs_records(pilot, tmp_path):
    """records.tar into the records folder: whole records only, nothing overwritten, all or nothing."""
    work, tar = pilot[0], pilot[0] / "out" / "records.tar"
    recs = tmp_path / "recs"
    ok(run(work, f"--unpack={tar}", f"--records={recs}"))
    assert sorted(os.listdir(recs)) == tar_names(tar)
    for f in os.listdir(recs):
        assert (recs / f).read_bytes() == (work / "records" / f).read_bytes()
    assert "0 records unpacked" in ok(run(work, f"--unpack={tar}", f"--records={recs}"))  # again: all there
    name = tar_names(tar)[0]
    (recs / name).write_text((recs / name).read_text().replace("1", "2"))
    one_line_error(run(work, f"--unpack={tar}", f"--records={recs}"), f"is there with other content")
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        t.add(work / "records" / name, arcname=name)
        cut = tmp_path / "x.jsonl"
        cut.write_bytes((work / "records" / "init_s1.jsonl").read_bytes()[:-10])
        t.add(cut, arcname="init_s9.jsonl")
    empty = tmp_path / "empty"
    one_line_error(run(work, f"--unpack={bad}", f"--records={empty}"), "init_s9.jsonl is not a whole study record")
    assert not empty.exists()
    ft = "init_s1.glue_lr1e-4_s1"  # a pre-training's record under a fine-tune's name there: two records of one name
    with tarfile.open(bad, "w") as t:
        t.add(work / "records" / "init_s1.jsonl", arcname=f"{ft}.jsonl")
    one_line_error(run(work, f"--unpack={bad}", f"--records={recs}"), f"holds both {ft}.json and {ft}.jsonl: nothing")
    assert not (recs / f"{ft}.jsonl").exists()


def test_bad_inputs_are_one_line(pilot, tmp_path):
    work = pilot[0]
    w = copy_work(work, tmp_path / "nodata")
    (w / "carry" / "english" / "train.bin.xz").unlink()
    one_line_error(run(w, "--phase=calibration"), "study_small: cannot unpack")
    shutil.rmtree(w / "carry" / "english")
    one_line_error(run(w, "--phase=calibration"), "study_small: no corpus: neither")
    w = copy_work(work, tmp_path / "noglue")
    shutil.rmtree(w / "carry" / "glue" / "RTE")
    one_line_error(run(w, "--phase=calibration"), "study_small: missing GLUE files: ")
    w = copy_work(work, tmp_path / "cut")
    path = w / "records" / "init_s1.jsonl"
    path.write_bytes(path.read_bytes()[:-20])
    one_line_error(run(w, "--train=False"), f"study_small: {path} is not a whole study record")
    w = copy_work(work, tmp_path / "bad")
    path = w / "records" / "init_s1.glue_lr1e-4_s1.json"
    path.write_text('{"request": {}, "runs": {"sst2": {"1": {"dev": {}}}}}')
    one_line_error(run(w, "--train=False"), f"study_small: {path}: request must hold at least one entry")
    one_line_error(run(w, "--train=False", "--phase=nothing"), "study_small: phase must be pilot, calibration")
    import torch
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, "studies/study_small.py", f"--out={tmp_path}/o", "--phase=pilot"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        one_line_error(p, "study_small: PyTorch sees no GPU")


def test_every_record_is_read_for_what_the_runner_does_with_it(pilot, tmp_path, monkeypatch):
    """A record that does not fit what the runner reads of it is one line naming the file and the field: a head
    field of the wrong type, a fine-tune whose runs are not its request's tasks and seeds, a score that is not the
    mean of its metrics, a pre-training that ends before its run's last step, a run that both has a record and
    diverged; and a cut run of other settings is not resumed under the plan's."""
    def edited(tag, name, change):
        w = copy_work(pilot[0], tmp_path / tag)
        path = w / "records" / name
        text = path.read_text()
        if name.endswith(".jsonl"):
            lines = text.splitlines()
            path.write_text("\n".join(change(lines)) + "\n")
        else:
            path.write_text(json.dumps(change(json.loads(text))))
        return w, path

    def head(change):
        return lambda lines: [json.dumps(change(json.loads(lines[0])))] + lines[1:]
    ft = "init_s1.glue_lr1e-4_s1.json"
    cases = [
        ("rate", "pilot_lr1e-3_s1.jsonl", head(lambda h: {**h, "timing": {**h["timing"], "tokens_per_s": "fast"}}),
         "line 1: timing.tokens_per_s must be a number > 0"),
        ("gpu", "init_s1.jsonl", head(lambda h: {**h, "gpu": 3}), "line 1: gpu must be a string"),
        ("seed", ft, lambda r: {**r, "runs": {t: {"2": v["1"]} for t, v in r["runs"].items()}},
         "are not what its request asked for (tasks "),
        ("mean", ft, lambda r: {**r, "runs": {**r["runs"], "mrpc": {"1": {"dev": {"mrpc": {
            **r["runs"]["mrpc"]["1"]["dev"]["mrpc"], "score": r["runs"]["mrpc"]["1"]["dev"]["mrpc"]["score"] + 1}}}}}},
         "is not the mean of its metrics"),
        ("acc", "init_s1.jsonl", lambda lines: lines[:1] + [json.dumps({**json.loads(lines[1]), "accuracy": 1.5})] +
         lines[2:], "line 2: accuracy must be a fraction in [0, 1]"),  # an MLM accuracy is a fraction
        ("dev", ft, lambda r: {**r, "runs": {**r["runs"], "sst2": {"1": {**r["runs"]["sst2"]["1"], "dev": {
            **r["runs"]["sst2"]["1"]["dev"], "rte": {"accuracy": 100.0, "score": 100.0}}}}}},
         "its dev holds rte, not a dev set of sst2"),  # glue4 would average it into SST-2's number
    ]
    for tag, name, change, says in cases:
        w, path = edited(tag, name, change)
        p = run(w, "--train=False")
        one_line_error(p, f"study_small: {path}")
        assert says in p.stderr, p.stderr
    w, path = edited("short", "pilot_lr1e-3_s1.jsonl", lambda lines: lines[:-1])  # its last eval gone
    one_line_error(run(w, "--phase=pilot"), f"{path} ends at step ")
    w = copy_work(pilot[0], tmp_path / "both")
    (w / "records" / "pilot_lr1e-3_s1.diverged.json").write_text(json.dumps({"message": "loss is nan"}))
    one_line_error(run(w, "--train=False"), "holds both a record and a .diverged.json of pilot_lr1e-3_s1")
    w = copy_work(pilot[0], tmp_path / "names")  # one record a name, the kind its name says, read in this process
    monkeypatch.setattr(ss, "records", str(w / "records"))
    for copy, says in (((w / "records" / "init_s1.jsonl", ft + "l"), f"holds both {ft} and {ft}l"),
                       ((w / "records" / ft, "init_s1.rerun9.json"), "rerun9.json, named as a pre-training run again"),
                       (("", "pilot_lr1e-2_s1.diverged.json"), "'train: stopped by signal 15', which is no divergence")):
        if copy[0]:
            shutil.copy(copy[0], w / "records" / copy[1])
        else:
            os.rename(w / "records" / "pilot_lr1e-2_s1.jsonl", w / "records" / "kept.jsonl.x")
            (w / "records" / copy[1]).write_text(json.dumps({"message": "train: stopped by signal 15"}))
        with pytest.raises(SystemExit, match=re.escape(says)):
            ss.read_records()
        os.remove(w / "records" / copy[1])
    made = json.loads((w / "records" / "kept.jsonl.x").read_text().splitlines()[0])["command"]
    (w / "records" / "pilot_lr1e-2_s1.diverged.json").write_text(json.dumps({  # the plan's run, diverged?
        "message": "train: eval loss is nan at step 3", "command": made + " --learning_rate=0.5"}))
    one_line_error(run(w, "--train=False"), "pilot_lr1e-2_s1.diverged.json is a run of other settings (learning_rate")
    notes = tmp_path / "notes.txt"  # a --summary that is no summary of the study's: never replaced
    notes.write_text("mine")
    one_line_error(run(pilot[0], "--train=False", f"--summary={notes}", "--figures="), "is there and is no summary")
    assert notes.read_text() == "mine"
    w = copy_work(pilot[0], tmp_path / "nolog")  # a cut run of another lr whose log is gone: its ckpt.pt decides
    ck = torch.load(pilot[0] / "runs" / "pilot_lr1e-3_s1" / "ckpt.pt", weights_only=True)
    (w / "runs" / "calib_s1").mkdir(parents=True)
    torch.save({**ck, "config": {**ck["config"], "learning_rate": 0.5}}, w / "runs" / "calib_s1" / "ckpt.pt")
    one_line_error(run(w, "--phase=calibration"), "holds a cut run of other settings (")
    w = copy_work(pilot[0], tmp_path / "cut")  # a cut calibration run of another lr, where the plan's would resume
    config = json.loads((w / "records" / "pilot_lr1e-3_s1.jsonl").read_text().splitlines()[0])["config"]
    (w / "runs" / "calib_s1").mkdir(parents=True)
    (w / "runs" / "calib_s1" / "ckpt.pt").write_bytes(b"")
    (w / "runs" / "calib_s1" / "log.jsonl").write_text(json.dumps({"type": "run", "run_id": "x", "config": {
        **config, "learning_rate": 0.5}}) + "\n")
    p = run(w, "--phase=calibration")
    one_line_error(p, "holds a cut run of other settings (")
    assert "learning_rate" in p.stderr and (w / "runs" / "calib_s1" / "ckpt.pt").read_bytes() == b""


def test_predict_names_the_jobs_and_their_times(pilot):
    out = ok(run(pilot[0], "--phase=calibration", "--predict=True"))
    assert "calib_s1: ~" in out and "(CPU, dry) from its records" in out and "budget_s 240" in out


def test_a_refused_prepare_writes_nothing(data_dir, tmp_path):
    """--prepare checks the corpus and every GLUE-4 file before it writes: a malformed file (RTE is read last) is one
    line, and no part of <carry>/ is left behind for the device tool to carry."""
    glue = tmp_path / "glue"
    travel.toy_glue(str(glue))
    with open(glue / "RTE" / "dev.tsv", "a") as f:
        f.write("1\tone\ttwo\tmaybe\n")
    carry = tmp_path / "carry"
    args = ["studies/study_small.py", "--prepare=True", f"--carry={carry}", f"--data_dir={data_dir}"]
    p = subprocess.run([sys.executable, *args, f"--glue_dir={glue}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    one_line_error(p, "bad label 'maybe'")
    assert not carry.exists()


def test_the_runner_survives_its_environment(data_dir, tmp_path, monkeypatch):
    """#72 cause 5: OS-level failures were outside the one-line handlers. A closed stdout (`--predict | head`) was a
    BrokenPipeError traceback: now quiet, exit 141 (lib/interrupt.py, every script's). A Ctrl-C while numpy loaded,
    before the handler, was a traceback. The log on a full disk lost even the traceback: now one line, and the output
    goes on. --prepare with --glue_dir its own <carry>/glue was a SameFileError; a GPT2_BPE_DIR that is no folder,
    read by --prepare itself, a traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # each line written as it is printed
    p = subprocess.Popen([sys.executable, "studies/study_small.py", "--dry=True", f"--work={tmp_path}/w",
                          "--phase=pilot", "--predict=True"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # its reader has gone before the first line
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "study_small" not in err, err[-2000:]
    hit = ("import os, runpy, signal, sys\nclass Hit:\n    def find_spec(self, name, *a):\n"
           "        name == 'numpy' and os.kill(os.getpid(), signal.SIGINT)\nsys.meta_path.insert(0, Hit())\n"
           "sys.argv = ['studies/study_small.py']\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", hit], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 130 and p.stderr == ("study_small: interrupted by signal 2 before its work started; nothing "
                                                "was done\n"), p.stderr[-2000:]
    import torch
    if os.path.exists("/dev/full") and not torch.cuda.is_available():
        (tmp_path / "o").mkdir()
        os.symlink("/dev/full", tmp_path / "o" / "study_small.log")  # a full disk
        p = subprocess.run([sys.executable, "studies/study_small.py", f"--out={tmp_path}/o", "--phase=pilot"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        one_line_error(p, "study_small: PyTorch sees no GPU")  # its own line, after the log's
        assert "study_small: cannot write its log" in p.stdout and "(No space left on device)" in p.stdout
    glue, carry = tmp_path / "glue", tmp_path / "carry"
    travel.toy_glue(str(glue))
    travel.prepare_carry(str(carry), data_dir, str(glue), ss.glue_tasks(), "study_small", corpus="builtin")
    made = {f: (carry / "glue" / f).read_bytes() for f in ("RTE/dev.tsv", "SST-2/train.tsv")}
    monkeypatch.setenv("GPT2_BPE_DIR", str(carry / "gpt2"))  # the carry's own copies, as the GPU run sets it
    # its own carry copy: nothing to copy
    travel.prepare_carry(str(carry), data_dir, str(carry / "glue"), ss.glue_tasks(), "study_small", corpus="builtin")
    assert {f: (carry / "glue" / f).read_bytes() for f in made} == made
    monkeypatch.setenv("GPT2_BPE_DIR", str(glue / "RTE" / "dev.tsv"))
    with pytest.raises(SystemExit, match="^study_small: tokenizer: GPT2_BPE_DIR=.*dev.tsv is not a folder"):
        travel.prepare_carry(str(carry), data_dir, str(glue), ss.glue_tasks(), "study_small", corpus="builtin")


# ----------------------------------------------------------------------------- the laptop study (device=cpu)
LAPTOP = ("--device=cpu", "--pilot_dropout=0", "--pilot_glue_model=best", "--pilot_tasks=stsb,sst2",
          "--glue_seeds=1,2", "--calib_tasks=stsb,sst2", "--init_own_lr=True", "--points=1024,2048",
          "--budget_s=1200", "--stop_s=1200", "--tokens=")  # its 8 and 13 jobs on a busy machine too


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    """The laptop study's pilot at toy sizes: the lr grid with dropout 0.1, a run at its pick with dropout 0, then the
    fine-tuning lrs on STS-B and SST-2 of the pick's model and of the untrained one."""
    work = tmp_path_factory.mktemp("laptop") / "work"
    return work, ok(run(work, "--phase=pilot", *LAPTOP))


def final_loss(work, name):
    return json.loads((work / "records" / f"{name}.jsonl").read_text().splitlines()[-1])["loss"]


def test_the_laptop_pilot_picks_its_recipe_then_tunes_the_fine_tuning_lr_on_it(laptop):
    work, out = laptop
    done = dict(re.findall(r"done (\S+) in .*?: (\S+) \(", out))
    grid = min(("pilot_lr1e-3_s1", "pilot_lr1e-2_s1"), key=lambda n: final_loss(work, n))
    d0 = grid.replace("_s1", "_d0_s1")  # the grid's pick again, with dropout 0
    best = min((grid, d0, "pilot_lr1e-3_s1", "pilot_lr1e-2_s1"), key=lambda n: final_loss(work, n))
    want = {"pilot_lr1e-3_s1", "pilot_lr1e-2_s1", "init_s1", d0} | {
        f"{m}.stsb+sst2_lr{g}_s1" for m in ("init_s1", best) for g in ("1e-4", "1e-3")}
    assert set(done) == want, out
    head = json.loads((work / "records" / f"{d0}.jsonl").read_text().splitlines()[0])
    assert head["config"]["dropout"] == 0.0 and head["config"]["learning_rate"] == float(grid[8:12])
    rows = {}
    for m in ("init_s1", best):
        for g in ("1e-4", "1e-3"):
            r = json.loads((work / "records" / f"{m}.stsb+sst2_lr{g}_s1.json").read_text())
            assert set(r["runs"]) == {"stsb", "sst2"} and r["model"] == m  # the pilot's tasks alone
            rows[m, float(g)] = np.mean([np.mean([x["score"] for x in r["runs"][t]["1"]["dev"].values()])
                                         for t in ("stsb", "sst2")])
    p = json.loads((work / "summary.json").read_text())["pilot"]
    pick = lambda m: max((1e-4, 1e-3), key=lambda g: (rows[m, g], -g))
    assert p["best_run"] == best and p["glue_model"] == best and p["glue_tasks"] == "stsb,sst2"
    assert p["picked_glue_lr"] == pick(best) and p["untrained_glue_lr"] == pick("init_s1")
    assert ("--dropout=0.0" in p["picked"]) == (best == d0) and set(p["runs"]) == {
        "lr1e-3", "lr1e-2", d0[6:-3]}


@pytest.fixture(scope="module")
def laptop_calib(laptop, tmp_path_factory):
    """The laptop study's calibration at toy sizes, after its pilot."""
    work = tmp_path_factory.mktemp("laptop_calib") / "work"
    shutil.copytree(laptop[0], work)
    return work, ok(run(work, "--phase=calibration", *LAPTOP))


def test_the_laptop_calibration_fine_tunes_task_subsets_and_keeps_the_pilots(laptop_calib):
    """STS-B and SST-2 at every snapshot, all four tasks at the last one and the untrained model (the pilot's
    STS-B and SST-2 fine-tune of it kept, not made twice), the untrained model also at its own lr; GLUE-4 only where
    all four ran; the training hours to each point. The pre-training pauses at its first snapshot for its
    fine-tunes, and its record is written once, at its end."""
    work, out = laptop_calib
    started = re.findall(r"started (\S+)", out)
    first = [i for i, n in enumerate(started) if n.startswith("calib_s1_t1024.")]
    assert [i for i, n in enumerate(started) if n == "calib_s1"] == [0, first[-1] + 1] and len(first) == 2
    assert re.search(r"done calib_s1 in .*: paused at step \d+ for its snapshot's fine-tunes", out)
    assert not (work / "records" / "calib_s1.rerun1.jsonl").exists()
    s = json.loads((work / "summary.json").read_text())
    c, p = s["calibration"], s["pilot"]
    assert re.findall(r"started (init_s1\S*)", out) == [f"init_s1.stsb+sst2_lr{ss.lr_tag(c['glue_lr'])}_s2"] + [
        f"init_s1.mrpc+rte_lr{ss.lr_tag(c['glue_lr'])}_s{sd}" for sd in (1, 2)] + (
        [f"init_s1.stsb+sst2_lr{ss.lr_tag(p['untrained_glue_lr'])}_s2"]
        if p["untrained_glue_lr"] != c["glue_lr"] else [])  # seed 1 of the others: the pilot's
    untrained, first, last = c["points"]
    assert untrained["glue4"] is not None and last["glue4"] is not None and first["glue4"] is None
    assert set(first["tasks"]) == {"stsb", "sst2"} and set(last["tasks"]) == {"sst2", "mrpc", "stsb", "rte"}
    assert c["gain"][0]["stsb"] and c["gain"][0]["glue4"] is None and c["gain"][1]["glue4"]
    assert (c["untrained_own_lr"] is None) == (p["untrained_glue_lr"] == c["glue_lr"])
    assert first["train_hours"] == pytest.approx(1024 / c["tokens_per_s"] / 3600, abs=1e-3)
    assert c["recipe"] == p["picked"] and [r["step"] for r in c["curve"]][-1] == c["steps"]
    assert "comparison: waits for its plan, written after the calibration" in out and s["comparison"] is None
    one_line_error(run(work, "--phase=comparison", *LAPTOP), "study_small: the comparison waits for its plan, "
                   "written after the calibration (the study's docs): then set --tokens")
    # calib_tasks' mean (score) at every point, from the records, and its gain with the fine-tuning sd pooled over
    # every model's seeds (the untrained model's at its own lr too)
    stats = pytest.importorskip("scipy.stats")
    dev = {}
    for f in (work / "records").glob("*.json"):
        r = json.loads(f.read_text())
        for t, by_seed in r.get("runs", {}).items():  # a diverged run's .json has none
            for sd, x in by_seed.items():
                dev.setdefault((r["model"], r["protocol"]["learning_rate"]), {}).setdefault(sd, {})[t] = \
                    x["dev"][t]["score"]
    mean = lambda sc: np.mean(list(sc.values()))
    score = [{sd: (x["stsb"] + x["sst2"]) / 2 for sd, x in dev[(m, c["glue_lr"])].items()}
             for m in ("init_s1", "calib_s1_t1024", "calib_s1_t2048")]
    own = [{sd: (x["stsb"] + x["sst2"]) / 2 for sd, x in dev[("init_s1", p["untrained_glue_lr"])].items()}] \
        if p["untrained_glue_lr"] != c["glue_lr"] else []
    assert c["score_tasks"] == "stsb,sst2" and all(len(sc) == 2 for sc in score + own)
    for pt, sc in zip(c["points"] + ([c["untrained_own_lr"]] if own else []), score + own):
        assert pt["score_per_seed"] == pytest.approx(sc) and pt["score"] == pytest.approx(mean(sc))
    groups = [list(sc.values()) for sc in score + own]
    df = sum(len(g) - 1 for g in groups)
    sp = math.sqrt(sum(np.var(g, ddof=1) * (len(g) - 1) for g in groups) / df)
    for g, sc in zip(c["gain"], score[1:]):
        assert g["score"]["diff"] == pytest.approx(mean(sc) - mean(score[0]))
        assert g["score"]["half95"] == pytest.approx(stats.t.ppf(0.975, df) * sp * math.sqrt(1 / 2 + 1 / 2))


def test_a_bare_cpu_makes_a_recorded_run_again_pausing_at_each_snapshot_with_fine_tunes_to_run(laptop_calib,
                                                                                                 tmp_path):
    """device=cpu, its out_dir gone (a new machine) and a snapshot's fine-tunes missing: the recorded pre-training is
    made again, paused (saved) at that snapshot while its fine-tunes run, then on; its record (<name>.rerun1) is
    written at the pause and again at its end, the fine-tunes name it, and on the same CPU it is the first run, bit
    for bit. A snapshot whose fine-tunes are all recorded is no pause."""
    work = copy_work(laptop_calib[0], tmp_path / "w")
    gone = sorted(f for f in os.listdir(work / "records") if f.startswith("calib_s1_t1024."))
    for f in gone:
        os.remove(work / "records" / f)
    out = ok(run(work, "--phase=calibration", *LAPTOP))
    started = re.findall(r"started (\S+)", out)
    assert started == ["calib_s1", *[f[:-5] for f in gone]]
    assert re.search(r"done calib_s1 in .*: \S+/calib_s1\.rerun1\.jsonl, paused at step 2 for its snapshot's "
                     r"fine-tunes", out) and "calib_s1 again" in out
    first, again = ss.read_record(str(work / "records" / "calib_s1.jsonl")), \
        ss.read_record(str(work / "records" / "calib_s1.rerun1.jsonl"))
    same = lambda evals: [(r["step"], r["loss"], r["accuracy"]) for r in evals]
    assert [r["step"] for r in again[1]] == [0, 2] and same(again[1]) == same(first[1][:2])
    assert {json.loads((work / "records" / f).read_text())["pretrained_by"] for f in gone} == {"calib_s1.rerun1"}
    work2 = copy_work(work, tmp_path / "w2")  # the last snapshot's fine-tunes missing: made again to its end
    gone = sorted(f for f in os.listdir(work2 / "records") if f.startswith("calib_s1_t2048.stsb"))
    for f in gone:
        os.remove(work2 / "records" / f)
    out = ok(run(work2, "--phase=calibration", *LAPTOP))
    assert re.findall(r"started (\S+)", out) == ["calib_s1", *[f[:-5] for f in gone]] and "paused" not in out
    again = ss.read_record(str(work2 / "records" / "calib_s1.rerun2.jsonl"))
    assert same(again[1]) == same(first[1]) and (work2 / "records" / "calib_s1.rerun1.jsonl").read_bytes() == \
        (work / "records" / "calib_s1.rerun1.jsonl").read_bytes()


def test_a_rerun_paused_in_one_call_and_resumed_in_the_next_keeps_its_record(laptop_calib, tmp_path):
    """A rerun stopped after its pause (SIGTERM during its snapshot's fine-tunes), then resumed by the next call from
    its checkpoint (out_dir kept): one run, one record (its run_id), that grows to the run's end."""
    work = copy_work(laptop_calib[0], tmp_path / "w")
    for f in os.listdir(work / "records"):
        if f.startswith("calib_s1_t"):
            os.remove(work / "records" / f)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    p = subprocess.Popen([sys.executable, "studies/study_small.py", "--dry=True", f"--work={work}",
                          "--phase=calibration", *LAPTOP], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while not list((work / "runs").glob("calib_s1_t1024.*")) and p.poll() is None and time.time() - t0 < 300:
        time.sleep(0.05)  # its first fine-tune started: the pre-training paused and said so
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 143 and "paused at step 2" in out, out[-3000:]
    out = ok(run(work, "--phase=calibration", *LAPTOP))
    assert re.findall(r"started (\S+)", out)[0] == "calib_s1" and "rerun2" not in out
    first, again = (ss.read_record(str(work / "records" / f"calib_s1{x}.jsonl")) for x in ("", ".rerun1"))
    assert [(r["step"], r["loss"]) for r in again[1]] == [(r["step"], r["loss"]) for r in first[1]]
    assert not (work / "records" / "calib_s1.rerun2.jsonl").exists()
    one = sorted(f for f in os.listdir(work / "records") if f.startswith("calib_s1_t1024."))[0]
    os.remove(work / "records" / one)  # its model made by this rerun in an earlier call: the record names the rerun
    out = ok(run(work, "--phase=calibration", *LAPTOP))
    assert re.findall(r"started (\S+)", out) == [one[:-5]]
    assert json.loads((work / "records" / one).read_text())["pretrained_by"] == "calib_s1.rerun1"


def test_a_cpu_run_cut_by_a_signal_resumes_from_its_checkpoint(tmp_path):
    """SIGTERM while a pre-training runs: train.py saves, the runner stops in one line (143) and records nothing of
    it; the next call resumes it from its checkpoint (its remaining steps estimated), and its record holds every eval
    of both calls."""
    work = tmp_path / "w"
    args = ["--phase=pilot", "--device=cpu", "--pilot_lrs=1e-3", "--pilot_glue_lrs=1e-3", "--pilot_tokens=102400",
            "--tasks=rte", "--glue_seeds=1", "--train_args=" + ss.DRY["train_args"].replace(
                "--eval_interval=2", "--eval_interval=25") + " --save_interval=5"]  # 200 steps
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    env.pop("STUDY_JOBS_FORKED", None)  # the signal reaches a train.py job started as a study starts it
    p = subprocess.Popen([sys.executable, "studies/study_small.py", "--dry=True", f"--work={work}", *args], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt, t0 = work / "runs" / "pilot_lr1e-3_s1" / "ckpt.pt", time.time()
    log = ckpt.parent / "log.jsonl"
    while not (log.exists() and '"type": "eval", "step": 25,' in log.read_text()) and p.poll() is None and \
            time.time() - t0 < 300:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 143 and "Traceback" not in out, out[-3000:]
    assert not (work / "records" / "pilot_lr1e-3_s1.jsonl").exists() and ckpt.exists()
    cut = ss.read_evals(str(ckpt.parent))[-1]["step"]
    assert 0 < cut < 200
    out = ok(run(work, *args))
    assert re.search(r"pilot_lr1e-3_s1, ~\d+ s", out)
    head, evals = ss.read_record(str(work / "records" / "pilot_lr1e-3_s1.jsonl"))
    assert [r["step"] for r in evals] == list(range(0, 201, 25)) and head["timing"]["resumed"] is True
    assert head["config"]["max_iters"] == 200
    assert (work / "runs" / "pilot_lr1e-3_s1" / "job.txt").read_text().count("parameters;") == 2  # two starts


def test_a_clone_of_one_commit_runs_the_jobs(tmp_path):
    """--clone=True: the command runs again from a clone of the commit (out_dir/code/<commit>), its paths in this
    tree; a tree with uncommitted changes is refused in one line."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", "--shared", ROOT, str(repo)], check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    work = tmp_path / "w"
    args = ["studies/study_small.py", "--dry=True", f"--work={work}", "--clone=True", "--phase=pilot",
            "--budget_s=1", "--stop_s=120", f"--out_dir={work}/runs"]
    p = run_script(*args, cwd=repo, timeout=300)
    assert f"running from {work}/runs/code/{sha[:12]} (commit {sha[:12]})" in p.stdout, p.stdout + p.stderr
    assert "left for the next run: pilot_lr1e-3_s1" in p.stdout and (work / "out" / "study_small.log").exists()
    with open(repo / "README.md", "a") as f:
        f.write("changed\n")
    p = run_script(*args, cwd=repo, timeout=300)
    one_line_error(p, "study_small: the tree has uncommitted changes: commit them")


def test_a_clone_cut_while_it_was_made_is_made_again(tmp_path, capsys):
    """#72 cause 6: a clone was trusted by its HEAD alone, which `git clone --no-checkout` sets before the checkout
    writes a file: one cut by a Ctrl-C then was reused, half made, on every later call. A marker is written once its
    checkout is complete (jobs.clone_at); a clone without it is removed and made again; a folder there that is no
    clone of this repository is refused and left as it is."""
    from studies import jobs
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dest = tmp_path / "code" / sha[:12]
    subprocess.run(["git", "clone", "--quiet", "--shared", "--no-checkout", ROOT, str(dest)], check=True)  # cut here
    assert not (dest / "train.py").exists()
    jobs.clone_at(sha, str(dest), "t")
    assert (dest / "train.py").exists() and (dest / ".git" / jobs.CLONE_MADE).read_text() == sha + "\n"
    (dest / ".git" / jobs.CLONE_MADE).unlink()  # cut while its checkout wrote the files: some are missing
    (dest / "model.py").unlink()
    jobs.clone_at(sha, str(dest), "t")
    assert "was cut while it was made: made again" in capsys.readouterr().out and (dest / "model.py").exists()
    jobs.clone_at(sha, str(dest), "t")  # whole: used as it is
    assert capsys.readouterr().out == ""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=f"t: {mine} is there but is no clone of {sha[:12]}: move it away"):
        jobs.clone_at(sha, str(mine), "t")
    assert os.listdir(mine) == ["notes.txt"]


def test_job_names_do_not_depend_on_the_order_of_a_list(tmp_path):
    """#72 cause 4: the same fine-tunes with --tasks, --calib_tasks or --pilot_tasks in another order were new jobs
    (sst2+stsb beside the recorded stsb+sst2) and ran again; study_glue refused its own records for --tasks or
    --glue_seeds in another order. A job's tasks are in one order (Table 3's, that of every committed name), and a
    record's request is compared with its lists as sets: the laptop study's records are every job of its plans, the
    summary the same, in whatever order the lists come."""
    p = run_script("studies/study_small.py", "studies/config/study_laptop.py", "--train=False",
                   f"--summary={tmp_path}/s.json", "--figures=", "--tasks=rte,stsb,mrpc,sst2", "--calib_tasks=sst2,stsb",
                   "--pilot_tasks=sst2,stsb", timeout=300)
    ok(p)
    committed = json.loads(open(os.path.join(ROOT, "assets", "study_laptop.json")).read())
    assert json.loads((tmp_path / "s.json").read_text()) == committed and len(committed["missing"]) == 1
    from studies import study_glue as sg
    rec = os.path.join(ROOT, "assets", "study_glue", "original_s2.glue.json")
    request = json.loads(open(rec).read())["request"]  # seeds 1,2,3; tasks sst2,mrpc,stsb,rte
    cmd = [f"--{k}={','.join(reversed(v.split(',')))}" for k, v in request.items()]
    assert sg.job_done("glue", ["--init_from=x/ckpt.pt", *cmd, "--out_dir=x/glue"], rec)
    with pytest.raises(SystemExit, match="original_s2.glue.json was made with other settings"):
        sg.job_done("glue", [a if not a.startswith("--tasks=") else "--tasks=rte,stsb,mrpc" for a in cmd], rec)


def test_records_of_several_commits_run_from_the_one_named(pilot, tmp_path):
    """A phase whose records name several commits (a runner changed between calls): refused in one line naming them,
    unless --commit= names the one to run from."""
    work = copy_work(pilot[0], tmp_path / "w")
    for k, f in enumerate(sorted(os.listdir(work / "records"))):
        path, fake = work / "records" / f, "ab"[k > 0] * 40
        if f.endswith(".jsonl"):
            lines = path.read_text().split("\n")
            lines[0] = json.dumps({**json.loads(lines[0]), "commit": fake})
            path.write_text("\n".join(lines))
        else:
            path.write_text(json.dumps({**json.loads(path.read_text()), "commit": fake}))
    args = ["--clone=True", "--phase=pilot", "--budget_s=1", "--stop_s=1", f"--out_dir={work}/runs"]
    one_line_error(run(work, *args), f"study_small: the pilot's records name several commits ({'a' * 40}, {'b' * 40})"
                                     ": set --commit= to the one to run from")
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = ok(run(work, *args, f"--commit={sha}"))
    assert f"running from {work}/runs/code/{sha[:12]} (commit {sha[:12]})" in out
    out = ok(run(work, *args, f"--commit={sha[:7]}"))  # abbreviated: the same clone, the next call too
    assert f"running from {work}/runs/code/{sha[:12]} (commit {sha[:12]})" in out
    one_line_error(run(work, *args, "--commit=0badc0de"), f"study_small: --commit=0badc0de, no commit of {ROOT}")


def test_on_a_cpu_a_long_pre_training_starts_if_some_of_it_fits_and_a_fine_tune_only_whole(monkeypatch, tmp_path):
    """device=cpu: a pre-training keeps its checkpoint here, so one longer than the call starts when MIN_CPU_S of
    training fits (the deadline cuts it, the next call resumes it); a fine-tune starts only if all of it fits, its
    estimate the sum of its tasks' times."""
    monkeypatch.chdir(tmp_path)
    for k, v in {"device": "cpu", "time_scale": 1.0, "budget_s": 1000.0, "T0": 0.0, "phase": "calibration",
                 "overlap": False}.items():
        monkeypatch.setattr(ss, k, v)
    clock = [0.0]
    monkeypatch.setattr(ss.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ss, "model_ready", lambda s: True)
    t = {**ss.TIMES["laptop"], "fixed_warm": 10.0, "tokens_per_s": 1000.0, "end": 0.0, "glue_stsb": 300.0,
         "glue_sst2": 500.0}
    r = ss.Runner({}, {"type": "cpu", "name": "C"}, t, 7.0, "d")
    pre = ss.Step("pretrain", "p", [], "p", "", 100, 5_000_000)  # 5,000 s of training
    q = ss.Step("pretrain", "q", [], "q", "", 100, 5_000_000)
    g = ss.Step("glue", "p.g", [], "", "", 100, 0, owner="i", tasks="stsb,sst2")  # 800 s
    r.steps = {s.name: s for s in (pre, q, g)}
    r.round = set(r.steps)
    job = lambda s: ss.Job(s.name, "", "", [], None)
    assert ss.estimate(pre, t, False) == 5010.0 and ss.estimate(g, t, False) == 800.0
    clock[0] = 1000.0 - 10.0 - ss.MIN_CPU_S
    assert r.may_start(job(pre), []) is True  # 610 s of 5,010 fit
    clock[0] += 1.0
    assert r.may_start(job(q), []) is False and "~5010 s estimated, 609 s left" in r.dropped["q"]
    clock[0] = 201.0
    assert r.may_start(job(g), []) is False  # 800 s do not fit in 799
    r.dropped.clear()
    clock[0] = 200.0
    assert r.may_start(job(g), []) is True


def test_the_calibrations_trend_extrapolates_only_a_measurable_rise():
    """Gains against log2(tokens): the line (numpy.polyfit as the reference) and where it reaches +2 points; none
    where the slope's 95% interval reaches 0, nor below 3 points."""
    pts = [(3_145_728, -0.6), (6_291_456, 0.1), (12_582_912, 0.5), (25_165_824, 1.2), (50_331_648, 1.6)]
    b, a = np.polyfit([math.log2(t) for t, _ in pts], [d for _, d in pts], 1)
    tr = ss.gain_trend(pts)
    assert tr["per_doubling"] == pytest.approx(b) and tr["points"] == 5
    assert tr["half95"] == pytest.approx(0.0954734, rel=1e-5)  # t(0.975, 3) x 0.03, worked out by hand
    assert tr["tokens_at_2"] == round(2 ** ((2 - a) / b)) and tr["tokens_at_2"] > 50_331_648
    flat = ss.gain_trend([(t, d) for (t, _), d in zip(pts, (0.3, -0.9, 1.1, -1.5, 0.8))])  # rising, within noise
    assert 0 < flat["per_doubling"] < flat["half95"] and flat["tokens_at_2"] is None
    assert ss.gain_trend(pts[:2]) is None


def test_a_calibration_of_two_corpora_against_one_untrained_model_with_probes(tmp_path):
    """--corpora: a second corpus's run planned, recorded and summarised beside data_dir's, against the same untrained
    model (its record naming its own data and U); --probes: every model point probed frozen, its record the numbers
    probe.py gives for that checkpoint run by hand, the summary and figure rebuilt byte for byte from the records."""
    other = tmp_path / "other-0.5"  # another corpus of the same vocabulary as the dry run's (studies/carry.py)
    ok(run_script("prepare_oscar.py", "--source=builtin", f"--out_dir={other}", "--max_docs=150", "--val_docs=30",
                  "--num_proc=1", "--vocab_size=2048"))
    work = tmp_path / "work"
    args = ("--phase=calibration", "--learning_rate=1e-3", "--glue_lr=1e-3", "--probes=True", f"--corpora={other}",
            "--points=1024", "--tasks=stsb,sst2", "--glue_seeds=1,2", "--budget_s=1200", "--stop_s=1200")
    out = ok(run(work, *args))
    rec = work / "records"
    names = sorted(p.name for p in rec.iterdir())
    probes = ["calib_other-0p5_s1_t1024.probe.json", "calib_s1_t1024.probe.json", "init_s1.probe.json"]
    assert [n for n in names if n.endswith(".probe.json")] == probes, out
    assert {"calib_s1.jsonl", "calib_other-0p5_s1.jsonl", "init_s1.jsonl"} <= set(names)
    assert sum(n.endswith("_lr1e-3_s1.json") or n.endswith("_lr1e-3_s2.json") for n in names) == 6  # 3 models x 2
    heads = {n: json.loads((rec / f"{n}.jsonl").read_text().splitlines()[0]) for n in ("calib_s1", "calib_other-0p5_s1")}
    assert heads["calib_other-0p5_s1"]["config"]["dataset"] == str(other)
    assert heads["calib_s1"]["data"] != heads["calib_other-0p5_s1"]["data"]  # each run's own data and U
    assert heads["calib_s1"]["unigram_loss"] != heads["calib_other-0p5_s1"]["unigram_loss"]

    snap = work / "runs" / "calib_other-0p5_s1" / "snapshots" / "ckpt_0000002.pt"  # 1024 tokens: step 2
    hand = tmp_path / "hand"
    ok(run_script("probe.py", f"--init_from={snap}", f"--data_dir={work / 'carry' / 'glue'}", f"--out_dir={hand}"))
    mine = json.loads((hand / "probe.json").read_text())
    theirs = json.loads((rec / probes[0]).read_text())
    for k in ("stsb_cosine", "sst2_logreg", "stsb_jaccard", "mrpc_majority", "rte_majority", "pretrained"):
        assert theirs[k] == mine[k], k
    assert theirs["model"] == "calib_other-0p5_s1_t1024" and theirs["step"] == 2

    c = json.loads((work / "summary.json").read_text())["calibration"]
    o = c["corpora"]["other-0p5"]
    assert o["points"][0] == c["points"][0]  # one untrained model, fine-tuned and probed once
    assert o["points"][1]["probe"] == {k: theirs[k] for k in ("stsb_cosine", "sst2_logreg")}
    assert o["gain"][0]["probe"] == {k: theirs[k] - c["points"][0]["probe"][k] for k in ("stsb_cosine", "sst2_logreg")}
    assert c["baselines"] == {"stsb_jaccard": mine["stsb_jaccard"], "mrpc_majority": mine["mrpc_majority"]["score"],
                              "rte_majority": mine["rte_majority"]["accuracy"]}
    assert "Calibration on other-0p5" in out and "frozen probes" in out

    again = ok(run(work, *args))
    assert "12 jobs, 12 recorded" in again and "started" not in again
    fresh = tmp_path / "fresh"
    shutil.copytree(rec, fresh)
    ok(run(work, *args, "--train=False", f"--records={fresh}", f"--summary={tmp_path}/s.json",
           f"--figures={tmp_path}/f"))
    for a, b in (("summary.json", "s.json"), ("study_small.png", "f.png"), ("study_small.svg", "f.svg")):
        assert (work / a).read_bytes() == (tmp_path / b).read_bytes(), a
    r = json.loads((fresh / probes[2]).read_text())
    (fresh / probes[2]).write_text(json.dumps({**r, "stsb_cosine": "50"}))  # a probe record read for its numbers
    one_line_error(run(work, *args, "--train=False", f"--records={fresh}", "--summary=", "--figures="),
                   "stsb_cosine must be a score in [-100, 100]")
    # a corpus of another vocabulary is one line before anything runs
    v = tmp_path / "v320"
    ok(run_script("prepare_oscar.py", "--source=builtin", f"--out_dir={v}", "--max_docs=50", "--val_docs=10",
                  "--num_proc=1", "--vocab_size=320"))
    p = run(work, *args[:4], f"--corpora={v}", *args[5:])
    one_line_error(p, "was made with a vocabulary of 320 ids")

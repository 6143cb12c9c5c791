"""Issue #55, the studies' causes (2, 1 in the study, 6): what a second adversarial battery found in the studies
(study.py, study_glue.py, jobs.py), one test (or a few) per cause. Each fails on the code before the fix: a traceback, a
result of another model counted, or a job run twice."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from studies import study_glue
from conftest import ROOT, interrupted, run_script
from studies import jobs
from test_train import one_line_error


# ---- 2: every record a study reads is checked by one reader, which names the file, line and field -------------------
def edit_json(change):
    def edit(path):
        obj = json.loads(path.read_text())
        change(obj)
        path.write_text(json.dumps(obj, indent=1) + "\n")  # as files.write_json lays it out
    return edit


def edit_line(n, change):
    def edit(path):
        lines = path.read_text().splitlines()
        r = json.loads(lines[n - 1])
        change(r)
        lines[n - 1] = json.dumps(r)
        path.write_text("\n".join(lines) + "\n")
    return edit


def without(*keys):
    def change(obj):
        for k in keys[:-1]:
            obj = obj[k]
        del obj[keys[-1]]
    return change


def setting(*keys, value):
    def change(obj):
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value
    return change


@pytest.mark.parametrize("name,edit,says", [
    ("original_s3.glue.json", edit_json(without("runs")), "runs is missing"),
    ("original_s3.glue.json", edit_json(without("runs", "rte", "1", "dev")), "runs.rte.1.dev is missing"),
    ("original_s3.glue.json", edit_json(setting("runs", "rte", "1", "dev", "rte", "score", value="50.5")),
     'runs.rte.1.dev.rte.score must be a finite number, got "50.5"'),
    ("step_times.json", edit_json(setting("ms_per_step", "original", value=0)),
     "ms_per_step.original must be a number > 0, got 0"),
    ("step_times.json", edit_json(without("ms_per_step")), "ms_per_step is missing"),
    ("original_s2.benchmark.json", edit_json(without("step_95")), "step_95 is missing"),
    ("original_s3.jsonl", edit_line(3, without("accuracy")), "line 3: accuracy is missing"),
    ("original_s3.jsonl", edit_line(4, setting("step", value="250")), 'line 4: step must be a step (a whole number')])
def test_2_a_study_record_without_what_the_study_reads_is_one_line(tmp_path, monkeypatch, name, edit, says):
    rec = tmp_path / "rec"
    shutil.copytree(os.path.join(ROOT, "assets", "study_glue"), rec)
    edit(rec / name)
    for key, value in dict(records=str(rec), train=False, summary="", figures="").items():
        monkeypatch.setattr(study_glue, key, value)
    with pytest.raises(SystemExit) as e:
        study_glue.main()
    assert str(e.value).startswith(f"study_glue: {rec / name}, line ") and says in str(e.value), str(e.value)
    assert "restore it (git checkout" in str(e.value) and "\n" not in str(e.value)
    if "got" in says:  # the line it names holds the value
        bad = str(e.value).split(", line ")[1].split(":")[0]
        assert says.split("got ")[1] in (rec / name).read_text().splitlines()[int(bad) - 1]


def test_2_a_base_config_without_max_iters_is_one_line(tmp_path):
    base = os.path.join(ROOT, "studies", "config", "study_glue.py")
    (tmp_path / "base.py").write_text("".join(line for line in open(base)
                                              if not line.startswith("max_iters")))
    p = run_script("studies/study_glue.py", f"--base={tmp_path / 'base.py'}", "--train=False", "--summary=",
                   "--figures=", timeout=300)
    one_line_error(p, f"study_glue: {tmp_path / 'base.py'}: max_iters is missing: set it in {tmp_path / 'base.py'}")


def test_1_a_study_glue_record_of_another_pre_training_run_is_not_reused(tmp_path, monkeypatch):
    """The pre-training run was trained again (its record moved away, a new run id): the GLUE record of the earlier
    run is not its result."""
    rec = tmp_path / "rec"
    shutil.copytree(os.path.join(ROOT, "assets", "study_glue"), rec)
    edit_line(1, setting("run_id", value="new run"))(rec / "original_s3.jsonl")
    edit_json(setting("protocol", "pretrained", value={"run_id": "old run", "step": 2000, "weights": "0f"}))(
        rec / "original_s3.glue.json")
    for key, value in dict(records=str(rec), train=False, summary="", figures="").items():
        monkeypatch.setattr(study_glue, key, value)
    with pytest.raises(SystemExit, match=r"original_s3.glue.json holds results of another pre-training run \(run old "
                                         r"run\) than .*original_s3.jsonl \(run new run\): move it away"):
        study_glue.main()
    edit_json(setting("protocol", "pretrained", "run_id", value="new run"))(rec / "original_s3.glue.json")
    study_glue.main()  # its own run's: a result


# ---- 6: a study's job is its launcher's for the job's life: two studies on the same folders never run it twice ------
def test_6_two_launchers_on_the_same_folders_run_a_job_once(tmp_path, capsys):
    ran, folder, script = tmp_path / "ran", tmp_path / "job", tmp_path / "job.py"
    script.write_text(f"import sys, time\nopen({str(ran)!r}, 'a').write('ran\\n')\ntry:\n    time.sleep(20)\n"
                      "except KeyboardInterrupt:\n    sys.exit(130)\n")
    job = f"jobs.Job('job', {str(folder)!r}, 'log.txt', [{str(script)!r}], lambda: 'recorded')"
    first = subprocess.Popen([sys.executable, "-c", f"from studies import jobs; jobs.run_jobs([{job}], 1, 1, 'first')"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not ran.exists() and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(SystemExit, match=r"job is in use by first.py, job \(pid"):  # while the first runs it
            jobs.run_jobs([jobs.Job("job", str(folder), "log.txt", [str(script)], lambda: "recorded")], 1, 1, "second")
        assert ran.read_text() == "ran\n"  # once
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    record = tmp_path / "record"
    record.write_text("as if the first had finished it")  # a launcher that planned it before, started after
    jobs.run_jobs([jobs.Job("job", str(folder), "log.txt", [str(script)], lambda: "recorded", recorded=record.exists)],
                  1, 1, "third")
    assert ran.read_text() == "ran\n" and "job: recorded meanwhile (another third), skipped" in capsys.readouterr().out


# ---- the third battery (#57): the third study's runner and the records every study reads ----------------------------
def test_57_a_record_with_a_step_twice_is_one_line(tmp_path):
    """Two evals of one step (a hand merge) with other losses: which is the run's is unknown, so the record is refused,
    not read with one of them (the later one flipped the third study's pilot pick)."""
    rec = tmp_path / "original_heat_s10.jsonl"
    shutil.copy(os.path.join(ROOT, "assets", "study", rec.name), rec)
    lines = rec.read_text().splitlines()
    last = json.loads(lines[-1])
    rec.write_text("\n".join(lines + [json.dumps({**last, "loss": last["loss"] - 1})]) + "\n")
    with pytest.raises(SystemExit, match=rf"{rec} holds step {last['step']} twice .*restore it"):
        jobs.read_record(str(rec), "study")
    rec.write_text("\n".join(lines) + "\n")
    assert jobs.read_record(str(rec), "study")[1][-1]["step"] == last["step"]


@pytest.mark.parametrize("arg", ["--pilot_lrs=abc", "--pilot_lrs=-1e-3", "--pilot_glue_lrs=0,1e-4",
                                 "--learning_rate=-1"])
def test_57_the_third_studys_learning_rates_are_checked(arg):
    p = run_script("studies/study_small.py", arg, "--glue_lr=1e-4", "--phase=pilot", "--predict=True", timeout=120)
    one_line_error(p, "must be")


def test_57_ctrl_c_during_the_third_studys_run_is_one_line(tmp_path):
    """--dry on the CPU: a Ctrl-C once its run has started ends it with one line and 130, never a traceback."""
    work = tmp_path / "dry"
    rc, out, err = interrupted("studies/study_small.py", "--dry=True", "--phase=pilot", f"--work={work}",
                               log=work / "out" / "study_small.log", ready="study_small: --dry", timeout=60)
    assert rc == 130, (rc, err[-2000:])
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("study_small: interrupted by signal 2")

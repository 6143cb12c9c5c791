"""studies/jobs.py: the launcher on tiny python scripts (order, what a job needs, how many at once, a failure or Ctrl-C
stopping the others, a folder in use), U by hand, and which settings make a record another run. The studies' whole
commands are tested in test_study.py and test_study_glue.py."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from configurator import script_defaults
from conftest import ROOT
from studies import jobs


def script(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text("import os, sys, time\n" + body)
    return str(path)


def job(tmp_path, name, body, done=lambda: "ok", needs=""):
    return jobs.Job(name, str(tmp_path / name), "log.txt", [script(tmp_path, name, body)], done, needs)


def log(tmp_path, name):
    return (tmp_path / name / "log.txt").read_text()


def sleeper(ready):
    """A job that says it runs (the file `ready`), then works until SIGINT, which it answers as train.py does."""
    return (f"try:\n    open({str(ready)!r}, 'w').close()\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
            "    print('stopped, saved')\n    sys.exit(130)\n")


def after(ready):  # a job's first lines: wait until the sleeper runs
    return f"while not os.path.exists({str(ready)!r}):\n    time.sleep(0.05)\n"


@pytest.fixture(params=["fork server", "new interpreter"])
def launcher(request, monkeypatch):
    """Both ways a job starts (jobs.launch): the suite's, a child of tests/forked.py's fork server
    (STUDY_JOBS_FORKED, tests/conftest.py), and a study's, a new interpreter."""
    if request.param == "new interpreter":
        monkeypatch.delenv("STUDY_JOBS_FORKED")


def test_jobs_run_in_order_at_most_at_once_each_after_what_it_needs(tmp_path, capsys, launcher):
    spans = tmp_path / "spans"
    span = f"t0 = time.time(); time.sleep(0.5)\nopen({str(spans)!r}, 'a').write(f'{{t0}} {{time.time()}}\\n')\n"
    rec = tmp_path / "a.rec"

    def done_a():
        rec.write_text("a")
        return "wrote a.rec"
    todo = [job(tmp_path, "a", span, done_a),
            job(tmp_path, "b", f"print('b saw', os.path.exists({str(rec)!r}))\n" + span, needs=str(rec)),
            job(tmp_path, "c", "time.sleep(3)\n" + span), job(tmp_path, "d", span)]
    jobs.run_jobs(todo, 2, 1, "t")
    out = [re.sub(r" in [0-9.]+ min", "", line) for line in capsys.readouterr().out.splitlines()]
    # b waits for a's record: c starts beside a; b once a is done, then d (c works 3 s longer than a: two new
    # interpreters' start-ups can differ by a second, and a c done first would start d before b could)
    assert out[:2] == ["  started a", "  started c"] and len(out) == 8
    assert out.index("  done a: wrote a.rec") < out.index("  started b") < out.index("  started d")
    assert log(tmp_path, "b").startswith("b saw True")
    t = sorted(tuple(map(float, line.split())) for line in spans.read_text().splitlines())
    assert len(t) == 4 and max(sum(s <= a < e for s, e in t) for a, _ in t) <= 2  # never more than 2 at once


def test_the_done_line_and_the_threads(tmp_path, capsys, launcher):
    jobs.run_jobs([job(tmp_path, "a", "print('threads', os.environ['OMP_NUM_THREADS'])\n", lambda: "record x")],
                  1, 3, "t")
    assert re.fullmatch(r"  started a\n  done a in [0-9]+\.[0-9] min: record x\n", capsys.readouterr().out)
    assert log(tmp_path, "a") == "threads 3\n"
    jobs.run_jobs([job(tmp_path, "a", "print('again')\n")], 1, 3, "t")
    assert log(tmp_path, "a") == "threads 3\nagain\n"  # appended: a resumed job keeps its earlier output


def test_a_failed_job_stops_the_others_and_nothing_more_starts(tmp_path, launcher):
    ready, done = tmp_path / "ready", []
    todo = [job(tmp_path, "sleeper", sleeper(ready), lambda: done.append("sleeper")),
            job(tmp_path, "fails", after(ready) + "print('step 3')\nprint('boom')\nsys.exit(3)\n"),
            job(tmp_path, "never", "print('ran')\n")]
    with pytest.raises(SystemExit, match=r"^t: fails failed \(exit 3\): boom$"):
        jobs.run_jobs(todo, 2, 1, "t")
    assert log(tmp_path, "sleeper") == "stopped, saved\n" and not done  # it got SIGINT and ended; no record
    assert not (tmp_path / "never").exists()


def test_ctrl_c_stops_the_running_jobs_then_goes_on_to_the_scripts_one_line(tmp_path, launcher):
    def interrupt():  # a Ctrl-C while the launcher writes a record
        raise KeyboardInterrupt
    ready = tmp_path / "ready"
    with pytest.raises(KeyboardInterrupt):  # interrupt.stops_cleanly makes it the script's one line and exit 130
        jobs.run_jobs([job(tmp_path, "sleeper", sleeper(ready)), job(tmp_path, "quick", after(ready), interrupt)], 2, 1,
                      "t")
    assert log(tmp_path, "sleeper") == "stopped, saved\n"


def test_a_job_whose_folder_is_in_use_is_not_started(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from lib.files import lock_dir; "
                               f"lock_dir({str(tmp_path / 'a')!r}, 'a test'); print('held', flush=True); "
                               "time.sleep(60)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)  # as a train.py would
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit, match="a is in use by a test"):
            jobs.run_jobs([job(tmp_path, "a", "print('ran')\n")], 1, 1, "t")
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "a" / "log.txt").exists()


def test_jobs_waiting_for_a_record_nobody_writes_stop_with_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^t: the jobs left wait for records that are not there: .*nowhere$"):
        jobs.run_jobs([job(tmp_path, "a", "print('ran')\n", needs=str(tmp_path / "nowhere"))], 1, 1, "t")


def test_unigram_loss_by_hand(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    # ordinary ids 0..3, specials 4..7; train: 0 x4, 1 x2, 2 x1, 3 x0 and specials; blocks of 8
    train = np.array([6, 0, 0, 0, 0, 1, 1, 2, 7, 4, 4, 4, 4, 4, 4, 4], dtype=np.uint16)
    val = np.array([6, 0, 1, 3, 7, 4, 4, 4, 6, 2, 2, 2, 2, 2, 2, 7], dtype=np.uint16)
    train.tofile(d / "train.bin")
    val.tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({"vocab_size": 8, "block_size": 8, "train_blocks": 2, "val_blocks": 2,
                                             "dtype": "uint16", "special": {"pad": 4, "cls": 6, "sep": 7, "mask": 5}}))
    p = np.array([5, 3, 2, 1]) / 11  # add-one smoothed counts of 0..3
    # eval blocks: the first eval_iters * batch_size = 1 block: tokens 0, 1, 3
    assert jobs.unigram_loss(str(d), 8, 1, 1) == pytest.approx(-np.log(p[[0, 1, 3]]).mean())
    assert jobs.unigram_loss(str(d), 8, 2, 1) == pytest.approx(-np.log(p[[0, 1, 3, 2, 2, 2, 2, 2, 2]]).mean())


def test_a_record_older_than_a_setting_counts_it_at_its_default(tmp_path):
    """A record made before train.py had a setting ran with its default: a base config that sets it to the default
    asks for the same run; to another value, for another run."""
    base = tmp_path / "b.py"
    base.write_text("learning_rate = 1e-3\nsave_interval = 25\nqk_lr_scale = 1.0\n")
    old = {k: v for k, v in script_defaults(os.path.join(ROOT, "train.py")).items()
           if k not in ("save_interval", "qk_lr_scale")}
    old["learning_rate"] = 1e-3
    assert jobs.differ(old, [str(base)]) == []
    assert jobs.differ(old, [str(base), "--qk_lr_scale=8.0"]) == ["qk_lr_scale 1.0 -> 8.0"]
    # where it ran is not what it is; its precision is
    assert jobs.differ({**old, "device": "cuda"}, [str(base), "--device=cpu", "--compile=False"]) == []
    assert jobs.differ({**old, "dtype": "bfloat16"}, [str(base), "--dtype=float32"]) == [
        "dtype 'bfloat16' -> 'float32'"]


def test_a_probe_record_is_read_for_its_ranges(tmp_path):
    """A probe's numbers are a Spearman x 100 (STS-B cosine, Jaccard) and accuracies in percent: 250 is no probe's
    (#63's rule for GLUE results, well-formed is not right), one line naming the field."""
    from studies.jobs import PROBE_RECORD, read_checked
    good = {"script": "probe.py", "stsb_cosine": 47.0, "sst2_logreg": 70.0, "stsb_jaccard": 65.3,
            "mrpc_majority": {"score": 74.8}, "rte_majority": {"accuracy": 52.7}}
    for field, value in (("stsb_cosine", 250.0), ("sst2_logreg", -1.0), ("stsb_jaccard", -101.0)):
        (tmp_path / "p.json").write_text(json.dumps({**good, field: value}, indent=1))
        with pytest.raises(SystemExit, match=rf"p.json, line \d+: {field} must be a (score|percentage) in"):
            read_checked(str(tmp_path / "p.json"), PROBE_RECORD, "t")
    (tmp_path / "p.json").write_text(json.dumps(good))
    assert read_checked(str(tmp_path / "p.json"), PROBE_RECORD, "t") == good

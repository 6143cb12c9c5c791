"""Issue #63, the studies' part (study.py, study_glue.py): a comma list naming an item twice plans and ran every job
twice; a GLUE record a study reads is checked as finetune_glue.py checks its results. Each fails on the code before the
fix (the rest of the issue: tests/test_faults_63.py)."""
import json
import os
import re
import shutil

import pytest

from conftest import ROOT, interrupted, run_script
from studies import study_glue
from test_train import one_line_error


@pytest.mark.parametrize("script,arg,says", [
    ("studies/study.py", "--seeds=2,2", "study: seeds names 2 twice ('2,2'): name each once"),
    ("studies/study.py", "--arms=original,original", "study: arms names original twice"),
    ("studies/study.py", "--sweep=0.5,0.50", "study: sweep names a drop twice ('0.5,0.50')"),
    ("studies/study.py", "--sweep=0.5,,0.6", "study: sweep must be a comma list of non-empty items"),
    ("studies/study_glue.py", "--glue_seeds=1,1", "study_glue: glue_seeds names 1 twice"),
    ("studies/study_glue.py", "--seeds=02,2", "study_glue: seeds names 2 twice"),
    ("studies/study_glue.py", "--arms=original,original", "study_glue: arms names original twice"),
    ("studies/study_glue.py", "--tasks=rte,", "study_glue: tasks must be a comma list of mrpc")])
def test_a_study_list_naming_an_item_twice_is_one_line_before_anything_runs(tmp_path, script, arg, says):
    p = run_script(script, arg, f"--records={tmp_path / 'rec'}", "--summary=", "--figures=", "--train=False",
                   timeout=300)
    one_line_error(p, says)
    assert not (tmp_path / "rec").exists()


def test_seeds_spelled_with_a_zero_are_the_study_glue_seeds_finetune_glue_records(tmp_path, monkeypatch):
    """--glue_seeds=01,02 asked finetune_glue.py for seeds 1 and 2, which it records as '1' and '2': the summary
    found no '01' and counted no model at all."""
    rec = tmp_path / "rec"
    shutil.copytree(os.path.join(ROOT, "assets", "study_glue"), rec)
    want = study_glue.glue_seeds
    for key, value in dict(records=str(rec), train=False, summary=str(tmp_path / "s.json"), figures="",
                           glue_seeds=",".join(f"0{s}" for s in want.split(","))).items():
        monkeypatch.setattr(study_glue, key, value)
    study_glue.main()
    assert study_glue.glue_seeds == want
    s = json.loads((tmp_path / "s.json").read_text())
    assert s['per_arm']['original']['glue4'], s['per_arm']['original']


@pytest.mark.parametrize("change,says", [
    (lambda runs: runs["rte"].update({"01": runs["rte"]["1"]}), "the result of rte seed 01 (a seed is written as"),
    (lambda runs: runs["rte"]["1"]["dev"]["rte"].update(score=101.0), "rte score 101.0 is not in [0, 100]")])
def test_a_glue_record_with_seed_01_or_a_score_of_101_is_one_line(tmp_path, monkeypatch, change, says):
    rec = tmp_path / "rec"
    shutil.copytree(os.path.join(ROOT, "assets", "study_glue"), rec)
    path = rec / "original_s3.glue.json"
    obj = json.loads(path.read_text())
    change(obj["runs"])
    path.write_text(json.dumps(obj, indent=1) + "\n")
    for key, value in dict(records=str(rec), train=False, summary="", figures="").items():
        monkeypatch.setattr(study_glue, key, value)
    with pytest.raises(SystemExit) as e:
        study_glue.main()
    assert str(e.value).startswith(f"study_glue: {path}: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and json.loads(path.read_text()) == obj


# ---- the third study's runner (studies/study_small.py) --------------------------------------------------------------
def small(*args, timeout=300):
    return run_script("studies/study_small.py", *args, timeout=timeout)


@pytest.mark.parametrize("arg,says", [
    ("--seeds=2,2", "study_small: seeds names 2 twice"), ("--glue_seeds=1,01", "study_small: glue_seeds names 1 twice"),
    ("--arms=original,original", "study_small: arms names original twice"),
    ("--pilot_lrs=1e-3,0.001", "pilot_lrs and pilot_glue_lrs must name each learning rate once"),
    ("--points=0", "points, pilot_tokens and tokens must be token counts > 0"),  # was a ZeroDivisionError
    ("--tokens=0", "points, pilot_tokens and tokens must be token counts > 0"),  # were planned as one eval interval
    ("--pilot_tokens=0", "points, pilot_tokens and tokens must be token counts > 0"),
    ("--glue_args=--seeds=3", "glue_args sets --seeds=3, which the study sets itself"),  # every job would be seed 3
    ("--train_args=--max_iters=9 --dropout=0.0", "train_args sets --max_iters=9, which the study sets itself"),
    ("--points=25M,25M", "study_small: points names 25M twice")])
def test_small_lists_and_points_are_one_line(tmp_path, arg, says):
    p = small(arg, "--phase=calibration", "--predict=True", "--learning_rate=1e-3", "--glue_lr=1e-4",
              f"--records={tmp_path / 'rec'}")
    one_line_error(p, says)


@pytest.mark.parametrize("key,under", [("records", ""), ("carry", ""), ("out", "/o"), ("work", ""), ("work", "/w")])
def test_a_small_path_setting_naming_a_file_or_nothing_is_one_line(tmp_path, key, under):
    """A path setting naming a file, or a folder under a file (was a traceback where it was made); --work= empty (an
    unset shell variable) would put the dry run's folders into the repository."""
    (tmp_path / "f").write_text("mine")
    p = small(f"--{key}={tmp_path / 'f'}{under}", "--train=False", *[f"--out={tmp_path / 'o'}"] * (key != "out"),
              *["--dry=True"] * (key == "work"))
    one_line_error(p, f"study_small: {key} must name a folder, and {tmp_path / 'f'} is a file")
    assert (tmp_path / "f").read_text() == "mine"
    if key == "work" and not under:
        one_line_error(small("--work=", "--dry=True", "--phase=pilot"), "work is empty (an unset shell variable?)")


def small_record(tmp_path, name, base):
    """A pre-training record named `name`, as run from the config `base` (from a committed record of the first study)."""
    lines = open(os.path.join(ROOT, "assets", "study", "original_heat_s10.jsonl")).read().splitlines()
    head = json.loads(lines[0])
    head["command"] = f"python train.py {base} --seed=1"
    path = tmp_path / "made" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return path


def tar_of(path, *members):
    import tarfile
    with tarfile.open(path, "w") as t:
        for p, name in members:
            t.add(p, arcname=name)
    return path


def test_unpack_refuses_a_name_twice_another_studys_run_and_a_folder_and_is_all_or_nothing(tmp_path, monkeypatch):
    from studies import study_small as ss
    recs = tmp_path / "recs"
    monkeypatch.setattr(ss, "records", str(recs))
    ours = [small_record(tmp_path, f"pilot_lr{i}e-3_s1.jsonl", ss.base) for i in (1, 2, 5)]
    other = small_record(tmp_path, "x.jsonl", "config/study.py")
    cases = [(tar_of(tmp_path / "twice.tar", (ours[0], ours[0].name), (ours[1], ours[0].name)),
              "holds pilot_lr1e-3_s1.jsonl twice (which is the run's?): nothing was unpacked"),  # the last was taken
             (tar_of(tmp_path / "other.tar", (ours[0], ours[0].name), (other, "pilot_lr2e-3_s1.jsonl")),
              "pilot_lr2e-3_s1.jsonl is a run of config/study.py, not of this study's")]
    for tar, says in cases:
        with pytest.raises(SystemExit, match=re.escape(says)):
            ss.unpack_archive(str(tar))
        assert not recs.exists()
    good = tar_of(tmp_path / "good.tar", *[(p, p.name) for p in ours])
    (recs / ours[1].name).mkdir(parents=True)  # a folder at a record's name: was a traceback
    with pytest.raises(SystemExit, match=f"{recs / ours[1].name} is a folder, where"):
        ss.unpack_archive(str(good))
    os.rmdir(recs / ours[1].name)
    from studies import carry
    real, calls = carry.atomic_write, []

    def full_disk(path, write, mode="wb"):  # the second record finds the disk full
        calls.append(path)
        if len(calls) == 2:
            raise SystemExit(f"cannot write {path}: No space left on device; it is unchanged")
        return real(path, write, mode)
    monkeypatch.setattr(carry, "atomic_write", full_disk)
    with pytest.raises(SystemExit, match="No space left on device; it is unchanged; nothing was unpacked"):
        ss.unpack_archive(str(good))
    assert os.listdir(recs) == []  # the first one written is taken back: all or nothing
    monkeypatch.setattr(carry, "atomic_write", real)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))  # each member is checked from a temporary file first
    try:
        with pytest.raises(SystemExit, match="cannot check .*good.tar's records in a temporary folder .*: nothing was "
                                             "unpacked"):
            ss.unpack_archive(str(good))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    ss.unpack_archive(str(good))
    assert sorted(os.listdir(recs)) == sorted(p.name for p in ours)


def test_a_diverged_record_of_a_run_that_cannot_diverge_is_refused(tmp_path):
    from studies import study_small as ss
    for name in ("init_s1.diverged.json", "pilot_lr1e-3_s1.diverged.json"):
        (tmp_path / name).write_text(json.dumps({"message": "train: the loss is nan at step 3"}))
    with pytest.raises(SystemExit, match="init_s1.diverged.json is not a whole study record"):
        ss.read_json_record(str(tmp_path / "init_s1.diverged.json"))  # the untrained model never trains
    assert ss.read_json_record(str(tmp_path / "pilot_lr1e-3_s1.diverged.json"))["message"].startswith("train:")


def test_prepare_refuses_a_corpus_that_is_not_the_studys(data_dir, tmp_path):
    from studies.carry import toy_glue
    toy_glue(str(tmp_path / "glue"))
    carry = tmp_path / "carry"
    p = small("--prepare=True", f"--carry={carry}", f"--data_dir={data_dir}", f"--glue_dir={tmp_path / 'glue'}")
    one_line_error(p, "holds the 'builtin' corpus, not 'english' (what <carry>/english is)")
    assert not carry.exists()


def test_ctrl_c_of_the_small_study_on_the_cpu_speaks_of_the_cpu_run(tmp_path):
    work = tmp_path / "dry"
    rc, out, err = interrupted("studies/study_small.py", "--dry=True", "--device=cpu", "--phase=pilot",
                               f"--work={work}", log=work / "out" / "study_small.log", ready="study_small: --dry")
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == ("study_small: interrupted by signal 2; the running job saved and stopped, "
                                            "the finished ones are recorded: the same command resumes it from its "
                                            "checkpoint")


def test_a_folder_at_a_records_name_is_one_line(tmp_path, monkeypatch):
    from studies import study_small as ss
    (tmp_path / "init_s1.jsonl").mkdir()
    monkeypatch.setattr(ss, "records", str(tmp_path))
    with pytest.raises(SystemExit, match=re.escape(f"{tmp_path / 'init_s1.jsonl'} is a folder, where a record")):
        ss.read_records()

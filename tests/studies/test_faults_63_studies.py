"""Issue #63, the studies' part (study.py, study_glue.py): a comma list naming an item twice plans and ran every job
twice; a GLUE record a study reads is checked as finetune_glue.py checks its results. Each fails on the code before the
fix (the rest of the issue: tests/test_faults_63.py)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from studies import study_glue
from test_train import one_line_error


@pytest.mark.parametrize("script,arg,says", [
    ("studies/study.py", "--seeds=2,2", "study: seeds names 2 twice ('2,2'): name each once"),
    ("studies/study.py", "--arms=original,original", "study: arms names original twice"),
    ("studies/study_glue.py", "--glue_seeds=1,1", "study_glue: glue_seeds names 1 twice"),
    ("studies/study_glue.py", "--seeds=02,2", "study_glue: seeds names 2 twice"),
    ("studies/study_glue.py", "--arms=original,original", "study_glue: arms names original twice"),
    ("studies/study_glue.py", "--tasks=rte,", "study_glue: tasks must be a comma list of mrpc")])
def test_a_study_list_naming_an_item_twice_is_one_line_before_anything_runs(tmp_path, script, arg, says):
    p = subprocess.run([sys.executable, script, arg, f"--records={tmp_path / 'rec'}", "--summary=", "--figures=",
                        "--train=False"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
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

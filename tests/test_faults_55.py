"""Issue #55: what a second adversarial battery found, one test (or a few) per cause. Each fails on the code before
the fix: a traceback, a silently wrong result, or a user's line deleted."""
import json
import os

from conftest import run_script
from test_train import TINY, one_line_error


# ---- 8: a user's file where train.py keeps a folder is one line, and kept ---------------------------------------
def test_8_a_file_named_snapshots_is_one_line_and_kept(data_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "snapshots").write_text("my notes")
    p = run_script("train.py", *TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2")
    one_line_error(p, "snapshots is a file, where train.py keeps its snapshots/ folder: move it away")
    assert (out / "snapshots").read_text() == "my notes" and sorted(os.listdir(out)) == [".lock", "snapshots"]

"""Issue #55: what a second adversarial battery found, one test (or a few) per cause. Each fails on the code before
the fix: a traceback, a silently wrong result, or a user's line deleted."""
import json
import os

import pytest

import finetune_glue as fg
from conftest import run_script
from lib.run import open_log
from test_train import TINY, one_line_error


# ---- 8: a user's file where train.py keeps a folder is one line, and kept ---------------------------------------
def test_8_a_file_named_snapshots_is_one_line_and_kept(data_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "snapshots").write_text("my notes")
    p = run_script("train.py", *TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2")
    one_line_error(p, "snapshots is a file, where train.py keeps its snapshots/ folder: move it away")
    assert (out / "snapshots").read_text() == "my notes" and sorted(os.listdir(out)) == [".lock", "snapshots"]


# ---- 7: a resume cuts back only the records it repeats: a user's lines stay -----------------------------------
def test_7_a_resume_keeps_every_log_line_it_did_not_write(tmp_path):
    path = tmp_path / "log.jsonl"
    head = {"type": "run", "step": 0, "run_id": "r", "config": {}, "data": None}
    rec = lambda kind, step: json.dumps({"type": kind, "step": step, "loss": 5.0})
    mine = [json.dumps({"type": "note", "step": "after the lr change", "text": "lr halved"}), "plain words, no JSON",
            json.dumps({"type": "eval", "step": 3.5, "loss": 1.0})]  # lines train.py did not write
    lines = [json.dumps(head), rec("eval", 0), rec("train", 1), rec("eval", 2), mine[0], rec("train", 3), mine[1],
             rec("eval", 4), mine[2]]
    path.write_text("\n".join(lines) + "\n" + rec("train", 5)[:20])  # a killed run's record, cut short
    open_log(str(path), head, resume_step=2)
    assert path.read_text().splitlines() == lines[:5] + mine[1:]  # steps 3 and 4 are repeated, the cut record goes
    path.write_text("\n".join(lines[:5]) + "\nmy last words")  # a user's line without its newline: kept whole
    open_log(str(path), head, resume_step=2)
    assert path.read_text().splitlines() == lines[:5] + ["my last words"]


# ---- 4: settings that would make the work meaningless are refused in one line -----------------------------------
SMALL_BENCH = ["--attention_types=original", "--modes=eager", "--hf_modes=", "--seq_lens=", "--warmup=1", "--steps=1",
               "--repeats=1", "--n_layer=1", "--n_head=2", "--n_embd=32", "--n_inner=64", "--block_size=32",
               "--matmul_size=64", "--dtypes=float32"]


@pytest.mark.parametrize("script,args,msg", [
    ("finetune_glue.py", ["--init_from=x.pt", "--max_seq_len=2"], "max_seq_len must hold [CLS] a [SEP] b [SEP]"),
    ("finetune_glue.py", ["--init_from=x.pt", "--max_seq_len=4", "--tasks=rte"], "at least 5 (3 for cola and sst2"),
    ("bench.py", SMALL_BENCH + ["--latency=1x"], "latency must be a comma list of batch x sequence shapes"),
    ("bench.py", SMALL_BENCH + ["--latency=0x128"], "latency must be a comma list of batch x sequence shapes"),
    ("bench.py", SMALL_BENCH + ["--mask_prob=0.01"], "mask_prob 0.01 predicts no position of a 32-token sequence")])
def test_4_settings_that_make_the_work_meaningless_are_refused(script, args, msg):
    one_line_error(run_script(script, "--device=cpu", *args), msg)


def test_4_an_input_too_short_for_a_pair_is_never_made():
    rows = [("the red dog sat on the mat", "a blue car on the road", 1)]
    with pytest.raises(SystemExit, match="max_seq_len 4 holds no pair: at least 5"):
        fg.encode(rows, 4)  # the cut went below 0: the inputs came out longer than max_seq_len
    assert fg.encode(rows, 5)["len"].tolist() == [5] and fg.encode(rows[:1], 9)["len"].tolist() == [9]

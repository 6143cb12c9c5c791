"""Issue #43: the faults a careless or unlucky user meets (kill -9, full disks, edited files, odd settings), one test
per cause. Each fails on the code before the fix: data deleted or mixed, a silently wrong result, or a traceback."""
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import configurator
from conftest import ROOT, run_script, vocab_size
import finetune_glue as fg
from lib import checkpoint
from lib import dataloader
from lib import files
from lib.run import Run
from model import Bert, BertConfig
from test_prepare import run as prepare
from test_run import RUN
from test_train import TINY, one_line_error, read_log, run_train


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def limited(nbytes):
    """preexec_fn: files of this process may not grow past nbytes (EFBIG, as a full disk gives ENOSPC)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def run_limited(nbytes, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, preexec_fn=limited(nbytes))


# ---- 1, 2: only this project's own temporaries of dead processes are removed; an empty out_dir is refused ----
def test_1_only_own_temporaries_of_dead_processes_are_removed(tmp_path):
    out, dead = tmp_path / "run", dead_pid()
    (out / "snapshots").mkdir(parents=True)
    (out / "log.jsonl").write_text('{"type": "eval", "step": 100, "loss": 3.0}\n')  # another run's: refused
    mine = ["results.tmp.2", f"ckpt.pt.tmp.{os.getpid()}", "ckpt.pt.tmp.x", "snapshots/notes.tmp.7"]
    stale = [f"ckpt.pt.tmp.{dead}", f"log.jsonl.tmp.{dead}", f"snapshots/ckpt_0000010.pt.tmp.{dead}"]
    for name in mine + stale:
        (out / name).write_bytes(b"x")
    with pytest.raises(SystemExit, match="holds another run"):
        Run(str(out), dict(RUN), set())
    files.unlock_dir(str(out))
    assert all((out / n).exists() for n in mine) and not any((out / n).exists() for n in stale)


def test_2_an_empty_out_dir_is_refused_not_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="the output folder is empty"):
        Run("", dict(RUN, out_dir=""), set())
    assert os.listdir(tmp_path) == []
    with pytest.raises(SystemExit, match="the output folder is empty"):
        files.lock_dir(" ", "finetune_glue.py")


# ---- 3: prepare_oscar.py never overwrites train.bin/val.bin it did not make ------------------------------------
def test_3_prepare_keeps_another_tools_data(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.bin").write_bytes(b"nanoGPT's own")
    (out / "val.bin").write_bytes(b"tokens")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(30)))
    kw = dict(files=str(tmp_path / "c.jsonl"), block_size=8, val_docs=5)
    with pytest.raises(SystemExit, match="holds train.bin and val.bin but no meta.json.*--overwrite=True"):
        prepare(tmp_path, **kw)
    assert (out / "train.bin").read_bytes() == b"nanoGPT's own" and (out / "val.bin").read_bytes() == b"tokens"
    (out / f"meta.json.tmp.{dead_pid()}").write_text("{")  # a build killed mid-way: its temporary goes
    assert prepare(tmp_path, **kw, overwrite=True)["val_blocks"] > 0
    assert sorted(os.listdir(out)) == [".lock", "meta.json", "train.bin", "val.bin"]


# ---- 4, 12: a checkpoint names its run; a run that saved nothing starts again ---------------------------------
def test_4_another_runs_checkpoint_is_not_resumed_over_a_runs_log(data_dir, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={a}", "--max_iters=4", "--eval_interval=2")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={b}", "--max_iters=2", "--eval_interval=2", "--seed=7")
    log = open(os.path.join(a, "log.jsonl"), "rb").read()
    shutil.copy(os.path.join(b, "ckpt.pt"), os.path.join(a, "ckpt.pt"))  # b's checkpoint, in a's folder
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={a}", "--init_from=resume", "--max_iters=6",
                  check=False)
    one_line_error(p, "is not the checkpoint of the run that")
    assert open(os.path.join(a, "log.jsonl"), "rb").read() == log  # a's history is whole
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={b}", "--init_from=resume", "--max_iters=4")  # its own


def test_12_a_run_that_saved_nothing_starts_again(data_dir, tmp_path):
    out = str(tmp_path / "run")
    args = [*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2"]
    run_train(*args)
    os.remove(os.path.join(out, "ckpt.pt"))  # as if killed before its first save: its log.jsonl only
    p = run_train(*args)  # a requeued job, the same command
    assert "holds no checkpoint of this run yet (nothing saved): starting it from step 0" in p.stdout
    assert [r["step"] for r in read_log(out, "eval")] == [0, 2]  # one history, not two
    os.remove(os.path.join(out, "ckpt.pt"))
    assert "starting it from step 0" in run_train(*args, "--init_from=resume").stdout
    os.remove(os.path.join(out, "ckpt.pt"))
    one_line_error(run_train(*args, "--seed=9", check=False), "holds another run (log.jsonl)")  # not this run's
    empty = [*TINY, f"--dataset={data_dir}", f"--out_dir={tmp_path}/new", "--max_iters=2", "--init_from=resume"]
    assert "starting it from step 0" in run_train(*empty).stdout  # a requeued resume that never started


# ---- 5: a resume on other data is refused ------------------------------------------------------------------
def test_5_a_resume_on_changed_data_is_refused(data_dir, tmp_path):
    d, out = tmp_path / "data", str(tmp_path / "run")
    shutil.copytree(data_dir, d)
    run_train(*TINY, f"--dataset={d}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    val = np.fromfile(d / "val.bin", dtype=np.uint16)
    val[::-1].tofile(d / "val.bin")  # rebuilt with other content, the same size
    p = run_train(*TINY, f"--dataset={d}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4", check=False)
    one_line_error(p, "is not the data")
    val.tofile(d / "val.bin")
    run_train(*TINY, f"--dataset={d}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")


# ---- 6, 7: settings are refused, never dropped; ranges are checked ------------------------------------------
def test_6_config_values_that_are_not_plain_literals_are_refused(tmp_path):
    g = {"out_dir": "out", "max_iters": 200_000, "learning_rate": 1e-3}
    for text, msg in (("import pathlib\nout_dir = pathlib.Path('x')", "'out_dir' must be str"),
                      ("import numpy as np\nmax_iters = np.int64(6)", "'max_iters' must be int"),
                      ("learning_rate = float('inf')", "'learning_rate' must be a finite number"),
                      ('out_dir = "\xff"'.encode("latin-1"), "error in config file")):
        (tmp_path / "c.py").write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(SystemExit, match=msg):
            configurator.configure(dict(g), [str(tmp_path / "c.py")])
    (tmp_path / "c.py").write_bytes(b"import math\nmax_iters = int(math.sqrt(36))  # \xff")  # a helper: the file's own
    assert configurator.configure(dict(g), [str(tmp_path / "c.py")])["max_iters"] == 6  # a bad byte in a comment
    with pytest.raises(SystemExit, match="must be a finite number"):
        configurator.configure(dict(g), ["--learning_rate=1e999"])


# (7: peak_flops, seed, target_loss and min_iters are in test_train.py's test_out_of_range_settings_are_one_line)


# ---- 8: a full disk while a checkpoint is written is one line, the earlier one kept -----------------------------
def test_8_a_full_disk_during_a_checkpoint_write_is_one_line(data_dir, tmp_path):
    out = str(tmp_path / "run")
    args = [*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--eval_interval=2", "--save_interval=2"]
    p = run_limited(1 << 19, *args, "--max_iters=2")  # the first save: the log fits, the checkpoint does not
    one_line_error(p, "ckpt.pt: File too large; it is unchanged")
    assert not os.path.exists(os.path.join(out, "ckpt.pt")) and sorted(os.listdir(out)) == [
        ".lock", "log.jsonl", "snapshots"]
    run_train(*args, "--max_iters=2")  # it saved nothing: the same command starts it again
    p = run_limited(1 << 19, *args, "--max_iters=4", "--init_from=resume")  # a later save, on a resume
    one_line_error(p, "ckpt.pt: File too large; it is unchanged")
    assert checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"), resume=True)["iter_num"] == 2
    assert not [n for n in os.listdir(out) if ".tmp." in n]


# ---- 9: a dataset's contents are checked ---------------------------------------------------------------------
def test_9_token_ids_and_meta_json_are_checked(data_dir, tmp_path):
    def damaged(name, change):
        d = tmp_path / name
        shutil.copytree(data_dir, d)
        change(d)
        return str(d)

    def set_meta(**kw):
        def change(d):
            meta = json.loads((d / "meta.json").read_text())
            for k, v in kw.items():
                meta[k] = {**meta[k], **v} if isinstance(v, dict) else v
            (d / "meta.json").write_text(json.dumps(meta))
        return change

    def poke(split, value):
        def change(d):
            t = np.fromfile(d / f"{split}.bin", dtype=np.uint16)
            t.reshape(-1, 64)[:, 5] = value  # in every block: the first batch drawn holds it
            t.tofile(d / f"{split}.bin")
        return change
    v = vocab_size(data_dir)  # 2048: 3000 fits uint16, not it
    for name, change, msg in (("val", poke("val", 3000), f"val.bin holds token id 3000 >= vocab_size {v}"),
                              ("mask", set_meta(special={"mask": 99999}), "meta.json is incomplete or corrupt"),
                              ("type", set_meta(special={"cls": "50258"}), "meta.json is incomplete or corrupt"),
                              ("vocab", set_meta(vocab_size="50304"), "meta.json is incomplete or corrupt")):
        with pytest.raises(SystemExit, match=msg):
            dataloader.PretrainingData(damaged(name, change), v, 64, 8, 0.15, 1)
    d = damaged("train", poke("train", 60000))
    one_line_error(run_train(*TINY, f"--dataset={d}", f"--out_dir={tmp_path}/out", check=False),
                   f"train.bin holds token id 60000 >= vocab_size {v}: the dataset is corrupt")


# ---- 10: a damaged byte in a file that is read is one line, or kept -------------------------------------------
def test_10_a_non_utf8_byte_in_log_jsonl_is_kept_and_the_run_resumes(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=4", "--eval_interval=2")
    path = os.path.join(out, "log.jsonl")
    lines = open(path, "rb").read().splitlines(keepends=True)
    lines[2] = b'{"type": "note", "text": "caf\xe9"}\n'  # one damaged record, in the history a resume keeps
    open(path, "wb").writelines(lines)
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=6")
    kept = open(path, "rb").read().splitlines(keepends=True)
    assert kept[2] == lines[2] and [json.loads(x)["step"] for x in kept if b'"eval"' in x] == [0, 2, 4, 6]


def prose_records(tmp_path, damage):
    rec = tmp_path / "rec"
    shutil.rmtree(rec, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "assets", "study_prose"), rec)
    path = rec / "original_s2.jsonl"
    path.write_bytes(damage(path.read_bytes()))
    return run_script("studies/study.py", "studies/config/study_prose_plan.py", "--train=False", f"--records={rec}",
                      f"--summary={tmp_path}/s.json", "--figures=", timeout=300)


def test_10_14_a_damaged_or_cut_study_record_is_one_line_and_no_summary(tmp_path):
    for damage, msg in ((lambda b: b.replace(b'"cpu": "', b'"cpu": "\xff', 1), "is not a whole study record"),
                        (lambda b: b[:-20], "is not a whole study record (ValueError: its last line is cut)"),
                        (lambda b: b"".join(b.splitlines(keepends=True)[:30]), "end before the cap")):
        p = prose_records(tmp_path, damage)
        one_line_error(p, msg)
        assert not (tmp_path / "s.json").exists()


# ---- 11: settings passed on to libraries are checked; a hand-edited result is named ----------------------------
def test_11_top_k_and_seeds_are_checked(tmp_path):
    model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=8, n_inner=16, block_size=16))
    torch.save({"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 1}, tmp_path / "m.pt")
    p = run_script("sample.py", f"--init_from={tmp_path}/m.pt", "--text=a [MASK] b", "--top_k=60000")
    one_line_error(p, "top_k must be in [1, 50256], got 60000")
    assert "filled in" in run_script("sample.py", f"--init_from={tmp_path}/m.pt", "--text=a [MASK] b").stdout
    p = run_script("finetune_glue.py", f"--init_from={tmp_path}/m.pt", "--seeds=1,99999999999", "--device=cpu")
    one_line_error(p, "seeds must be a comma list of integers below 10**9")


def test_11_a_hand_edited_null_glue_result_is_named(tmp_path):
    from test_glue import run as run_glue, save_ckpt, synthetic
    synthetic(tmp_path / "glue", 64, 32)
    out = tmp_path / "out"
    args = [f"--init_from={save_ckpt(tmp_path / 'ckpt.pt')}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte",
            "--seeds=1", "--epochs=1", f"--out_dir={out}"]
    assert run_glue(*args).returncode == 0
    res = json.loads((out / "glue_results.json").read_text())
    res["runs"]["rte"]["1"] = None
    (out / "glue_results.json").write_text(json.dumps(res))
    one_line_error(run_glue(*args), "glue_results.json: the result of rte seed 1 is damaged (edited by hand?)")
    assert json.loads((out / "glue_results.json").read_text())["runs"]["rte"]["1"] is None  # left as it is
    assert fg.damaged({"stsb": {"2": {"dev": {"stsb": {"score": float("nan")}}}}}) == \
        "stsb seed 2 (its stsb score is missing or not a finite number)"  # and why


# ---- 13: a garbage checkpoint is one line without torch's advice; a benchmark goes on without it ----------------
def test_13_a_garbage_checkpoint_is_named_without_unsafe_advice(tmp_path):
    (tmp_path / "g.pt").write_bytes(b"garbage, not a checkpoint")
    with pytest.raises(SystemExit) as e:
        checkpoint.load_checkpoint(str(tmp_path / "g.pt"))
    assert "not a readable checkpoint" in str(e.value) and "weights_only" not in str(e.value)


def test_13_a_benchmark_scores_the_readable_snapshots_and_names_the_other(tmp_path):
    from test_glue import run as run_glue, save_ckpt, synthetic
    synthetic(tmp_path / "glue", 64, 32)
    train_out = tmp_path / "train"
    os.makedirs(train_out / "snapshots")
    for step in (100, 300):
        save_ckpt(train_out / "snapshots" / f"ckpt_{step:07d}.pt", iter_num=step, seed=step)
    (train_out / "snapshots" / "ckpt_0000200.pt").write_bytes(b"garbage")
    p = run_glue(f"--benchmark={train_out}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte", "--seeds=1",
                 "--epochs=1", f"--out_dir={tmp_path / 'bench'}")
    assert p.returncode == 1 and "Traceback" not in p.stderr and "weights_only" not in p.stdout + p.stderr
    assert "1 checkpoint(s) refused and skipped" in p.stderr and "ckpt_0000200.pt" in p.stderr
    b = json.loads((tmp_path / "bench" / "benchmark.json").read_text())
    assert [r["step"] for r in b["records"]] == [100, 300]


# ---- compatibility: a checkpoint and a log made before run ids and data fingerprints still resume ---------------
def test_an_old_checkpoint_and_log_without_run_id_still_resume(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    del ck["run_id"], ck["data"]
    torch.save(ck, os.path.join(out, "ckpt.pt"))
    path = os.path.join(out, "log.jsonl")
    lines = open(path).readlines()[1:]  # without the run record
    open(path, "w").writelines(lines)
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")
    assert "predates data fingerprints: its data cannot be checked" in p.stdout
    head = json.loads(open(path).readline())
    assert head["type"] == "run" and head["run_id"] == torch.load(os.path.join(out, "ckpt.pt"))["run_id"]
    assert open(path).readlines()[1:len(lines) + 1] == lines  # the old history kept, the run record on top


# ---- what a fresh battery of a new user's cases found ----------------------------------------------------------
def test_new_cases_empty_names_a_negative_sample_cap_and_an_empty_checkpoint(tmp_path):
    one_line_error(run_script("finetune_glue.py", f"--init_from={tmp_path}/m.pt", "--max_train_samples=-5",
                              "--device=cpu"), "max_train_samples >= 0")  # a negative cap dropped the last rows
    one_line_error(run_script("studies/study.py", "--records=", "--train=False"), "records and out_dir must name folders")
    one_line_error(run_script("studies/study.py", "--sweep=0.5,a", "--train=False"), "sweep must be a comma list of drops")
    with pytest.raises(SystemExit, match="the dataset setting is empty"):
        dataloader.dataset_dir("")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"not a readable checkpoint \(empty or cut short\)"):
        checkpoint.load_checkpoint(str(tmp_path / "empty.pt"))

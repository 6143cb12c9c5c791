"""Is this the same run? train.py's resume policy (run.open_run) and the identity it and study.py share
(run.run_changes), called directly: no subprocess, no training."""
import json
import os

import pytest
import torch

from lib.files import lock_dir, locked, unlock_dir
from lib.run import NothingToDo, open_run, run_changes
from model import Bert, BertConfig

MODEL = dict(n_layer=1, n_head=2, n_embd=16, n_inner=32, block_size=16, dropout=0.0, attention_type="pairwise",
             hybrid_pattern="original,additive", sub_ln=False, s_init_std=1.0, symmetric_init=False, score_scale=1.0,
             freeze_s=False)
RUN = dict(init_from="scratch", out_dir="out", device="cpu", dtype="auto", compile=True, seed=1, learning_rate=1e-3,
           max_iters=100, target_loss=0.0, min_iters=0, decay_lr=False, **MODEL)


def cli(*keys):  # settings given on the command line, as configure() records them
    return {k: f"--{k}" for k in keys}


def save_run(folder, iter_num=100, eval_loss=None, **changes):
    """A full checkpoint as train.py writes it, of a run with RUN's settings plus changes."""
    config = {**RUN, **changes}
    model_args = {**vars(BertConfig(**{k: config[k] for k in MODEL})), "vocab_size": 50304}
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": Bert(BertConfig(**model_args)).state_dict(), "model_args": model_args, "iter_num": iter_num,
                "config": config, "optimizer": {"state": {}, "param_groups": []}, "rng": [], "last_eval": iter_num,
                "eval_loss": eval_loss}, os.path.join(folder, "ckpt.pt"))


def test_run_changes_ignores_where_a_run_is_made_and_where_it_ends():
    assert run_changes(RUN, {**RUN, "device": "cuda", "dtype": "bfloat16", "out_dir": "x", "compile": False}) == []
    assert run_changes(RUN, {**RUN, "target_loss": 4.5, "min_iters": 50}) == []  # where it stops
    assert run_changes(RUN, {**RUN, "max_iters": 500}) == []  # constant lr: a longer run has the same past
    assert run_changes({**RUN, "decay_lr": True}, {**RUN, "decay_lr": True, "max_iters": 500}) == [
        "max_iters 100 -> 500"]  # a decaying schedule of another length is another run
    assert run_changes(RUN, {**RUN, "seed": 2, "learning_rate": 3e-4}) == ["seed 1 -> 2", "learning_rate 0.001 -> 0.0003"]
    assert run_changes(RUN, {**RUN, "dtype": "float32"}, ignore=("device",)) == ["dtype 'auto' -> 'float32'"]
    assert run_changes({"seed": 1}, {**RUN, "seed": 1}) == []  # a setting the old run did not have yet: no verdict


def test_a_new_run_needs_a_folder_without_another_run(tmp_path):
    ckpt, model_args, changed = open_run(str(tmp_path / "new"), dict(RUN), {})
    assert ckpt is None and changed == [] and model_args["attention_type"] == "pairwise"
    (tmp_path / "logged").mkdir()
    (tmp_path / "logged" / "log.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"holds another run \(log.jsonl\)"):
        open_run(str(tmp_path / "logged"), dict(RUN), {})
    save_run(tmp_path / "other", seed=7)
    with pytest.raises(SystemExit, match=r"holds another run \(ckpt.pt\).*--init_from=resume"):
        open_run(str(tmp_path / "other"), dict(RUN), {})
    save_run(tmp_path / "short", iter_num=50)  # the same settings, not finished: to be resumed, not restarted
    with pytest.raises(SystemExit, match="holds this run, saved at step 50: continue it with --init_from=resume"):
        open_run(str(tmp_path / "short"), dict(RUN), {})
    with pytest.raises(SystemExit, match="n_embd"):  # an impossible model: one line
        open_run(str(tmp_path / "bad"), {**RUN, "n_embd": 15}, {})


def test_the_same_finished_run_again_is_nothing_to_do(tmp_path):
    save_run(tmp_path / "done")
    with pytest.raises(NothingToDo, match="already holds this run, finished at step 100"):  # train.py: exit 0
        open_run(str(tmp_path / "done"), {**RUN, "device": "cuda", "compile": False}, {})
    save_run(tmp_path / "stopped", iter_num=60, eval_loss=4.0, target_loss=4.2, min_iters=50)  # met its target
    with pytest.raises(NothingToDo, match="--target_loss=0"):  # how to go on past it
        open_run(str(tmp_path / "stopped"), {**RUN, "target_loss": 4.2, "min_iters": 50}, {})
    with pytest.raises(SystemExit, match="holds this run, saved at step 60"):  # a lower target is not met yet
        open_run(str(tmp_path / "stopped"), {**RUN, "target_loss": 3.9, "min_iters": 50}, {})


def test_a_resume_takes_the_runs_own_settings_and_refuses_another_model(tmp_path, capsys):
    save_run(tmp_path / "run", iter_num=40, seed=3, learning_rate=5e-4, dtype="bfloat16")
    config = {**RUN, "init_from": "resume", "max_iters": 200}
    ckpt, model_args, changed = open_run(str(tmp_path / "run"), config, cli("init_from", "max_iters"))
    assert ckpt["iter_num"] == 40 and changed == []  # constant lr: extending it is an exact continuation
    assert config["seed"] == 3 and config["learning_rate"] == 5e-4 and config["max_iters"] == 200
    assert config["dtype"] == "bfloat16"  # its precision, unless asked otherwise
    config = {**RUN, "init_from": "resume", "learning_rate": 1e-4, "dtype": "float32"}
    _, _, changed = open_run(str(tmp_path / "run"), config, cli("init_from", "learning_rate", "dtype"))
    assert changed == ["learning_rate 0.0005 -> 0.0001"] and config["dtype"] == "float32"
    save_run(tmp_path / "fp16", iter_num=40, dtype="float16")
    for device, dtype in (("cpu", "auto"), ("cuda", "float16")):  # fp16 goes on on a GPU only
        config = {**RUN, "init_from": "resume", "device": device}
        open_run(str(tmp_path / "fp16"), config, cli("init_from", "device"))
        assert config["dtype"] == dtype
    with pytest.raises(SystemExit, match=r"another model: --n_layer=2 \(the run's: 1\), --attention_type=original "
                                         r"\(the run's: 'pairwise'\)\. To resume it: python train.py c.py "
                                         r"--init_from=resume --max_iters=9; or start a new out_dir"):
        open_run(str(tmp_path / "run"), {**RUN, "init_from": "resume", "n_layer": 2, "attention_type": "original"},
                 {"init_from": "--init_from=resume", "n_layer": "--n_layer=2", "attention_type":
                  "--attention_type=original", "max_iters": "--max_iters=9"},
                 "train.py c.py --init_from=resume --n_layer=2 --max_iters=9 --attention_type=original")
    # a config file's settings yield to the run's own (nanoGPT's convention), its model's too; the command line's
    # model settings are refused, its others make another run
    config = {**RUN, "init_from": "resume", "dropout": 0.1, "learning_rate": 1e-3, "seed": 4}
    _, _, changed = open_run(str(tmp_path / "run"), config, {"dropout": "c.py", "learning_rate": "c.py",
                                                             "seed": "--seed=4", "init_from": "--init_from=resume"})
    assert (config["dropout"], config["learning_rate"], config["seed"]) == (0.0, 5e-4, 4) and changed == ["seed 3 -> 4"]
    assert "resuming with the run's own settings: learning_rate 0.0005 (c.py: 0.001), dropout 0.0 (c.py: 0.1)" in \
        capsys.readouterr().out
    config = {**RUN, "init_from": "resume"}  # nothing saved yet: a requeued `--init_from=resume` job starts the run
    assert open_run(str(tmp_path / "none"), config, cli("init_from"))[0] is None and config["init_from"] == "scratch"
    save_run(tmp_path / "other", seed=9)
    os.remove(tmp_path / "other" / "ckpt.pt")
    (tmp_path / "other" / "log.jsonl").write_text('{"type": "eval", "step": 5, "loss": 3.0}\n')  # another run's
    with pytest.raises(SystemExit, match="no checkpoint"):
        open_run(str(tmp_path / "other"), {**RUN, "init_from": "resume"}, cli("init_from"))


def test_a_resume_checks_the_runs_own_settings_and_a_start_again_keeps_the_runs_id(tmp_path, capsys):
    """#72's battery: a checkpoint's own settings were taken unchecked (a dataset of 5: a traceback later); a run
    started again with no ckpt.pt but its snapshots there (killed before its first save, or ckpt.pt removed) took a
    new run id, under which its snapshots were made again; a log whose head holds no settings was taken for this
    run's and replaced."""
    from lib.run import Run
    save_run(tmp_path / "run", iter_num=40, dataset=5)  # edited: a number where train.py writes a folder
    with pytest.raises(SystemExit, match=r"ckpt.pt's own setting dataset is '5', not a str \(edited"):
        open_run(str(tmp_path / "run"), {**RUN, "init_from": "resume", "dataset": "data/x"}, cli("init_from"))
    snap = tmp_path / "snap"
    os.makedirs(snap / "snapshots")
    (snap / "snapshots" / "ckpt_0000020.pt").write_bytes(b"a snapshot")
    with pytest.raises(SystemExit, match=r"holds another run \(snapshots/\)"):  # whose? no log says
        open_run(str(snap), dict(RUN), {})
    (snap / "log.jsonl").write_text(json.dumps({"type": "run", "run_id": "abc", "config": RUN}) + "\n")
    run = Run(str(snap), {**RUN, "init_from": "resume"}, cli("init_from"))
    assert not run.resumed and run.run_id == "abc" and "under its run id, its snapshots made again" in \
        capsys.readouterr().out
    unlock_dir(str(snap))
    (tmp_path / "log").mkdir()
    log = '{"type": "run", "config": {}}\nmy notes\n'
    (tmp_path / "log" / "log.jsonl").write_text(log)
    with pytest.raises(SystemExit, match=r"holds another run \(log.jsonl\)"):
        open_run(str(tmp_path / "log"), dict(RUN), {})
    assert (tmp_path / "log" / "log.jsonl").read_text() == log


def test_locked_releases_its_folder_and_removes_it_if_it_made_it_and_left_it_empty(tmp_path):
    """A script refused before it wrote anything leaves no folder of its own (docs/safety.md): locked() released the
    lock first, so the exit-time tidy, which removes only the folders still held, left <out>/.lock behind."""
    with locked(str(tmp_path / "a" / "b"), "test"):
        assert "test (pid" in (tmp_path / "a" / "b" / ".lock").read_text()
    assert not (tmp_path / "a").exists()  # made for it, left empty: gone, with the parent made for it
    (tmp_path / "c").mkdir()
    with locked(str(tmp_path / "c"), "test"):
        pass
    assert os.listdir(tmp_path / "c") == [".lock"]  # a user's folder stays
    lock_dir(str(tmp_path / "c"), "again")  # free again after the block
    unlock_dir(str(tmp_path / "c"))

"""lib/checkpoint.py: a checkpoint written whole on a full disk, and read back checked."""
import os
import subprocess

import pytest
import torch

from lib import checkpoint
from lib import files
from model import Bert, BertConfig


def test_a_full_disk_inside_torch_save_is_one_line_and_stale_temporaries_go(tmp_path):
    import resource
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"iter_num": 1}, path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # a file may not grow past 100 kB: as a full disk
    try:  # torch's zip writer reports it as 'unexpected pos ...': the OSError is what reaches the user
        with pytest.raises(SystemExit, match=r"cannot write .*ckpt.pt: File too large; it is unchanged"):
            checkpoint.save_checkpoint({"iter_num": 2, "w": torch.zeros(100_000)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert os.listdir(tmp_path) == ["ckpt.pt"] and torch.load(path, weights_only=True)["iter_num"] == 1
    (tmp_path / "snapshots").mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"ckpt.pt.tmp.{dead.pid}", f"snapshots/ckpt_0000010.pt.tmp.{dead.pid}", "notes.tmp.txt",
                 "results.tmp.2", f"ckpt.pt.tmp.{os.getpid()}"):
        (tmp_path / name).write_bytes(b"x")
    files.remove_stale_temporaries(str(tmp_path), (r"ckpt\.pt",))
    files.remove_stale_temporaries(str(tmp_path / "snapshots"), (r"ckpt_\d+\.pt",))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", f"ckpt.pt.tmp.{os.getpid()}", "notes.tmp.txt",
                                            "results.tmp.2", "snapshots"]  # a live writer's and a user's: kept
    assert os.listdir(tmp_path / "snapshots") == []


def test_checkpoint_loader_checks(tmp_path):
    model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=8, n_inner=16, vocab_size=11, block_size=8))
    good = {"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 5}
    cases = {"garbage.pt": b"not a checkpoint", "other.pt": {"weights": 1}, "snapshot.pt": good,
             "nan.pt": {**good, "model": {**good["model"], "head_bias": torch.full((11,), float("nan"))}},
             "wrong.pt": {**good, "model_args": {**good["model_args"], "n_embd": 16, "n_inner": 16}}}
    for name, obj in cases.items():
        if isinstance(obj, bytes):
            (tmp_path / name).write_bytes(obj)
        else:
            torch.save(obj, tmp_path / name)
    for name, msg in (("garbage.pt", "not a readable checkpoint"), ("other.pt", "not a train.py checkpoint"),
                      ("nan.pt", "non-finite"), ("wrong.pt", "do not fit its model_args"), ("missing.pt", "no checkpoint")):
        with pytest.raises(SystemExit, match=msg):
            checkpoint.load_checkpoint(str(tmp_path / name))
    assert checkpoint.load_checkpoint(str(tmp_path / "snapshot.pt"))["iter_num"] == 5  # fine to fine-tune or export
    with pytest.raises(SystemExit, match="model-only snapshot: it cannot be resumed"):
        checkpoint.load_checkpoint(str(tmp_path / "snapshot.pt"), resume=True)


@pytest.mark.parametrize("field,value", [("iter_num", 3.0), ("iter_num", -4), ("iter_num", True), ("last_eval", "5"),
                                         ("eval_loss", float("nan")), ("config", [1]), ("run_id", 7),
                                         ("schedules", [[0, "lr"]]), ("schedules", {"0": {}}), ("rng", {"cpu": 1}),
                                         ("rng", [{"cpu": [1, 2]}]), ("spent", -1.0), ("optimizer", {}),
                                         ("optimizer", {"state": {}, "param_groups": "x"}), ("probe", "junk"),
                                         ("rng", [{"cpu": torch.zeros(8, dtype=torch.uint8)}]), ("last_eval", 9),
                                         ("probe", (9, [torch.zeros(2)]))])
def test_a_checkpoint_whose_run_state_is_not_train_pys_is_one_line_naming_the_field(tmp_path, field, value):
    """Every field of the run's state that train.py reads back (lib/run.py) is checked for its type and range when
    the checkpoint is loaded, not where it is used: a traceback there otherwise (an optimizer state of no groups, a
    generator state of the wrong size, a probe that is no (step, scores)), or a resume that evaluates a step again
    (an eval after the step it was saved at)."""
    model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=8, n_inner=16, vocab_size=11, block_size=8))
    good = {"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 5, "last_eval": 5,
            "eval_loss": 2.5, "config": {}, "run_id": "abc", "schedules": [[0, {}]], "spent": 1.0,
            "rng": [{"cpu": torch.get_rng_state(), "cuda": None}], "probe": (5, [torch.zeros(2)]),
            "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]}}
    torch.save(good, tmp_path / "good.pt")
    assert checkpoint.load_checkpoint(str(tmp_path / "good.pt"), resume=True)["iter_num"] == 5
    torch.save({**good, field: value}, tmp_path / "bad.pt")
    with pytest.raises(checkpoint.Unreadable, match=rf"bad.pt: its {field} .* is not what train.py writes"):
        checkpoint.load_checkpoint(str(tmp_path / "bad.pt"), resume=True)

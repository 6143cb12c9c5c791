"""lib/files.py: a file is written whole or not at all."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from lib import checkpoint
from lib import files


def test_atomic_write_survives_crash_and_full_disk(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"iter_num": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("simulated crash while writing")

    with pytest.raises(RuntimeError, match="simulated crash"):
        checkpoint.save_checkpoint({"iter_num": 2, "w": torch.zeros(1000), "x": Boom()}, path)

    def full_disk(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(SystemExit, match=r"cannot write .*ckpt.pt: No space left on device; it is unchanged"):
        files.atomic_write(path, full_disk)
    assert torch.load(path, weights_only=True)["iter_num"] == 1  # the previous checkpoint is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # and no temporary file is left behind


def test_a_folder_refused_at_start_is_not_left_behind(tmp_path):
    """A script that took an output folder and exits having written nothing in it (missing data, say) leaves no
    folder behind, nor the parents it made for it; a folder with anything in it, or one that was there before,
    stays."""
    code = ("import sys; from lib.files import lock_dir; lock_dir(sys.argv[1], 'x.py'); "
            "len(sys.argv) > 2 and open(sys.argv[1] + '/f', 'w').close(); raise SystemExit('refused')")
    run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], cwd=ROOT, capture_output=True, text=True)
    assert run(str(tmp_path / "a" / "b")).returncode == 1 and os.listdir(tmp_path) == []
    run(str(tmp_path / "c"), "write")
    assert sorted(os.listdir(tmp_path / "c")) == [".lock", "f"]
    (tmp_path / "d").mkdir()
    run(str(tmp_path / "d"))
    assert os.listdir(tmp_path / "d") == [".lock"]

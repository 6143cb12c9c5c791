"""lib/files.py: a file is written whole or not at all."""
import os

import pytest
import torch

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

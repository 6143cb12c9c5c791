import os
import subprocess
import sys

import pytest
import torch

# the project is a set of top-level scripts (nanoGPT style): make them importable from the tests
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(min(2, torch.get_num_threads()))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The built-in corpus, as the quick start makes it (a few hundred documents are plenty here)."""
    out = tmp_path_factory.mktemp("data") / "builtin"
    subprocess.run([sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--max_docs=300", "--val_docs=30",
                    "--num_proc=1"], cwd=ROOT, check=True, capture_output=True)
    return str(out)

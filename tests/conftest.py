import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # the project is a set of top-level scripts (nanoGPT style): importable from the tests
torch.set_num_threads(min(2, torch.get_num_threads()))


def run_script(*args, cwd=ROOT, timeout=600, env=None):
    """python ARGS in the repository (or cwd), one torch thread (tiny models: no oversubscription), output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The built-in corpus, as the quick start makes it (a few hundred documents are plenty here)."""
    out = tmp_path_factory.mktemp("data") / "builtin"
    subprocess.run([sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--max_docs=300", "--val_docs=30",
                    "--num_proc=1"], cwd=ROOT, check=True, capture_output=True)
    return str(out)

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # the project is a set of top-level scripts (nanoGPT style): importable from the tests
torch.set_num_threads(min(2, torch.get_num_threads()))


def run_script(*args, cwd=ROOT, timeout=600, env=None):
    """python ARGS in the repository (or cwd), one torch thread (tiny models: no oversubscription), output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def interrupted(*args, log, ready, timeout=120):
    """python ARGS in the repository (one torch thread), sent SIGINT (a Ctrl-C) once the file `log` holds the text
    `ready`: (its exit code, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not (os.path.exists(log) and ready in open(log, errors="replace").read()) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The built-in corpus, as the quick start makes it (a few hundred documents are plenty here)."""
    out = tmp_path_factory.mktemp("data") / "builtin"
    subprocess.run([sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--max_docs=300", "--val_docs=30",
                    "--num_proc=1"], cwd=ROOT, check=True, capture_output=True)
    return str(out)

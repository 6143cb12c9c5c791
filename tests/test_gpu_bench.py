"""tests/gpu_bench.sh, issue #54's prepared GPU command, cannot rot unseen: its arguments, its budget, and its dry mode
end to end on the CPU (three bench.py parts at toy shapes with every row of the GPU run but its compile settings, a
JSON per part, the summary, at most 8 files in $OUT, as the device tool brings back). ~1 minute on 2 idle cores."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("timeout")), reason="needs bash, timeout")


def gpu_bench(*args, env=None):
    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", "tests/gpu_bench.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.parametrize("args", [["--parts=5"], ["--parts="], ["--parts=1;2"], ["--gpu"], ["dry"]])
def test_bad_arguments_are_refused_before_anything_runs(args):
    p = gpu_bench(*args)
    assert p.returncode == 2 and p.stdout == "" and ("bad --parts" in p.stderr or "usage:" in p.stderr), p.stderr


def test_parts_that_do_not_fit_the_budget_are_not_started(tmp_path):
    p = gpu_bench("--dry", env={"OUT": str(tmp_path), "GPU_BENCH_BUDGET": "50"})
    summary = p.stdout.split("== summary")[1].splitlines()[1:]
    assert p.returncode == 1 and all(": SKIP (its 100s exceed the budget left)" in s for s in summary[:3]), summary
    assert summary[3] == "again: bash tests/gpu_bench.sh --parts=1,2,3 --dry"


def test_the_dry_run_end_to_end(tmp_path):
    p = gpu_bench("--dry", env={"OUT": str(tmp_path), "GPU_BENCH_BUDGET": "900",
                                "GPU_BENCH_TIMEOUTS": "300,300,300,300"})  # a loaded machine takes longer
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    summary = p.stdout.split("== summary")[1].splitlines()[1:]
    assert [s.split(" in ")[0].split(":")[0] for s in summary] == ["1 bert-base seq 512 batch 32", "2 bert-base seq "
                                                                   "128 batch 128", "3 bert-small seq 128 batch 128"]
    assert all(": PASS in " in s and "HF eager " in s and "; original eager" in s and "best " in s
               and "0 skipped, 0 failed" in s for s in summary), summary
    files = sorted(os.listdir(tmp_path))
    assert files == ["base128.json", "base512.json", "gpu_bench.log", "part1.log", "part2.log", "part3.log",
                     "small128.json"] and len(files) <= 8  # what the device tool brings back
    assert (tmp_path / "gpu_bench.log").read_text() == p.stdout
    runs = {name: json.loads((tmp_path / name).read_text()) for name in files if name.endswith(".json")}
    a = "original+sdpa_backend=fastest+fused_qkv"
    assert [r["spec"] for r in runs["base512.json"]["rows"]] == [
        "eager", "original", a, a + "+accum=8", "original+sdpa_backend=cudnn"]  # C without its compile settings: A
    assert runs["base512.json"]["shape"]["block_size"] == 64 and runs["base128.json"]["shape"]["batch_size"] == 4
    assert all(r["ms_by_category"] for r in runs["base512.json"]["rows"])  # part 1's --profile
    for run in runs.values():
        assert run["attention_kernels"] and run["failed"] == [] and run["skipped"] == []
        fastest = [r for r in run["rows"] if "fastest" in r["spec"]]
        assert fastest and all(r["settings"]["sdpa_backend"] in ("auto", "cudnn", "flash", "efficient")
                               for r in fastest)
        assert [r["tokens_per_step"] for r in run["rows"] if "accum" in r["spec"]] == \
            [run["shape"]["batch_size"] * run["shape"]["block_size"] * (8 if run is runs["base512.json"] else 2)]


def test_the_gpu_rows_are_valid_bench_rows():
    """The rows the GPU run asks for (with their compile settings, which --dry drops) parse as bench.py rows."""
    lists = subprocess.run(["bash", "-c", 'eval "$(sed -n "/^A=/,/^BASE=/p" tests/gpu_bench.sh)"; '
                            'printf "%s\\n" "$ROWS1" "$ROWS2" "$ROWS3" "$ROWS4" "$HF1" "$HF2" "$HF3" "$HF4"'],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    import bench
    from model import ATTENTION_TYPES

    assert len(lists) == 8 and "compile_mode=reduce-overhead+compile_optimizer" in lists[0]
    for ours in lists[:4]:
        for spec in ours.split(","):
            bench.parse_row(spec, [*ATTENTION_TYPES], "ours")
    for hf in lists[4:]:
        for spec in hf.split(","):
            bench.parse_row(spec, ("eager", "compiled"), "hf")
    assert lists[4] == lists[5] == "eager,compiled"  # Hugging Face eager and compiled beside ours at bert-base


def test_a_part_past_its_timeout_still_reports_the_rows_it_built(tmp_path):
    """The part's timeout (SIGTERM) stops bench.py's building; the shell waits, the rows built are timed and written,
    the summary says FAIL (timeout) with the figures and names the part to run again."""
    p = gpu_bench("--dry", "--parts=1", env={"OUT": str(tmp_path), "GPU_BENCH_TIMEOUTS": "60,100,100,100",
                                             "GPU_BENCH_EXTRA": "--warmup=3000"})  # building takes > 60 s then
    # (the 5 rows at 1,500: 49 s on a 2-core Intel Xeon, ~130 s on a slower 2 cores where the first took ~15 s; at
    # 3,000 the fast one's 5 take ~100 s and a slow one's first ~35 s: 60 s falls between on both)
    summary = p.stdout.split("== summary")[1].splitlines()[1:]
    assert p.returncode == 1 and summary[0].startswith("1 bert-base seq 512 batch 32: HF, baseline, levers, profile: "
                                                       "FAIL (timeout 60s) in "), summary
    assert summary[1] == "again: bash tests/gpu_bench.sh --parts=1 --dry"
    run = json.loads((tmp_path / "base512.json").read_text())  # written after the SIGTERM
    assert run["rows"] and all(r["ms_per_step"] > 0 for r in run["rows"])
    assert run["skipped"] and all("SIGTERM" in s["why"] for s in run["skipped"])
    assert len(run["rows"]) + len(run["skipped"]) == 5  # HF eager and the 4 rows of part 1 on the CPU
    assert f"{len(run['rows'])} built, {len(run['skipped'])} skipped, 0 failed" in summary[0]

"""A newcomer's first hour: --help everywhere, a quick start that can be run twice, sample.py."""
import ast
import itertools
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, run_script

SCRIPTS = ["train.py", "prepare_oscar.py", "finetune_glue.py", "bench.py", "plot.py", "study.py", "sample.py",
           "export_hf.py"]


def config_keys(script):
    """The keys of a script's config block (between its first two '# ----' lines), in order."""
    with open(os.path.join(ROOT, script)) as f:
        source = f.read()
    lines = source.splitlines()
    start, end = [i + 1 for i, line in enumerate(lines) if line.startswith("# " + "-" * 70)][:2]
    keys = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and start < node.lineno < end:
            for t in node.targets:
                keys += [n.id for n in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return keys


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_key_with_its_comment(script):
    for flag in ("--help", "-h"):
        p = subprocess.run([sys.executable, script, flag], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.startswith(f"usage: python {script}"), p.stderr
        lines = [line.split() for line in p.stdout.splitlines() if line.startswith("  --")]
        names = [[t.split("=")[0][2:] for t in itertools.takewhile(lambda t: t.startswith("--"), w)] for w in lines]
        assert [n for group in names for n in group] == config_keys(script)
        for words, group in zip(lines, names):  # a, b = ... shares one line and one explanation
            assert len(words) > len(group), f"{script}: no explanation for {' '.join(words)}"


def run(args, cwd):
    return run_script(*args, cwd=cwd)


def test_quick_start_runs_twice_and_keeps_the_first_run(tmp_path):
    """The README's main command (prepare the built-in corpus, train config/tiny_pair.py), twice in a copy of
    the repository; shorter here (a few steps, no compile) but through the same code paths."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", "data", "out*", "__pycache__", "assets"))
    train = ["train.py", "config/tiny_pair.py", "--max_iters=4", "--eval_interval=2", "--compile=False"]
    for attempt in (1, 2):
        p = run(["prepare_oscar.py", "--max_docs=200", "--val_docs=20"], repo)
        assert p.returncode == 0, p.stderr
        assert ("already holds this dataset: nothing to do" in p.stdout) == (attempt == 2)
        p = run(train, repo)
        assert p.returncode == 0, p.stderr
        if attempt == 1:
            first = (repo / "out" / "tiny_pair" / "ckpt.pt").read_bytes()
            log = (repo / "out" / "tiny_pair" / "log.jsonl").read_text()
            assert "done: step 4" in p.stdout and "next: python sample.py" in p.stdout
            assert "note: warmup_iters (30) > max_iters (4): the learning rate never reaches 0.002" in p.stdout
    assert "already holds this run, finished at step 4: nothing to do" in p.stdout
    assert (repo / "out" / "tiny_pair" / "ckpt.pt").read_bytes() == first  # the first run is intact
    assert (repo / "out" / "tiny_pair" / "log.jsonl").read_text() == log
    p = run(train + ["--learning_rate=1e-3"], repo)  # another run into the same out_dir: refused, not mixed
    assert p.returncode == 1 and "holds another run" in p.stderr

    ckpt = repo / "out" / "tiny_pair" / "ckpt.pt"
    p = run(["sample.py", f"--init_from={ckpt}", "--text=The [MASK] of the [MASK] is here.", "--top_k=3"], repo)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("pairwise BERT, step 4: The [MASK] of the [MASK] is here.")
    assert lines[1].startswith("[MASK] 1: '") and lines[1].count("%") == 3 and lines[2].startswith("[MASK] 2: ")
    assert lines[3].startswith("filled in: The") and "[MASK]" not in lines[3]
    p = run(["sample.py", f"--init_from={ckpt}", "--text=No mask here."], repo)
    assert p.returncode == 1 and "has no [MASK] to fill in" in p.stderr and "Traceback" not in p.stderr

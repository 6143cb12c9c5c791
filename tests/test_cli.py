"""A newcomer's first hour: --help everywhere, a quick start that can be run twice, sample.py."""
import ast
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, run_script

SCRIPTS = ["train.py", "prepare_oscar.py", "finetune_glue.py", "bench.py", "plot.py", "sample.py", "export_hf.py",
           "studies/study.py"]


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
        p = run_script(script, flag, timeout=60)  # forked: torch imported once, not per script
        assert p.returncode == 0 and p.stdout.startswith(f"usage: python {script}"), p.stderr
        with open(os.path.join(ROOT, script)) as f:  # the docstring's lines as written: a shell line continuation
            assert f.read().split('"""')[1].strip() in p.stdout  # (a backslash) is not joined to the next line
        lines = [line.split() for line in p.stdout.splitlines() if line.startswith("  --")]
        names = [[t.split("=")[0][2:] for t in itertools.takewhile(lambda t: t.startswith("--"), w)] for w in lines]
        assert [n for group in names for n in group] == config_keys(script)
        for words, group in zip(lines, names):  # a, b = ... shares one line and one explanation
            assert len(words) > len(group), f"{script}: no explanation for {' '.join(words)}"


def run(args, cwd):
    return run_script(*args, cwd=cwd)


def learnt_lines_read_the_loss(stdout, repo):
    """The run's last lines: its eval loss beside the untrained model's (step 0 in log.jsonl) and U, the loss of
    guessing each token from its frequency alone (studies/jobs.py's unigram_loss on config/tiny.py's eval blocks)."""
    from studies.jobs import unigram_loss
    from plot import read_evals
    evals = read_evals(str(repo / "out" / "tiny_pair"))
    first, last = evals[0], evals[-1]
    u = unigram_loss(str(repo / "data" / "builtin"), 128, 16, 20)
    assert first["step"] == 0 and last["step"] == 4 and last["loss"] > u  # 4 steps: still far above U
    assert stdout.rstrip().splitlines()[-2:] == [
        f"learnt: eval loss {first['loss']:.2f} untrained (step 0), {last['loss']:.2f} at step 4: "
        f"{last['loss'] - u:.2f} nats above U = {u:.2f}",
        "        (U: the loss of guessing each masked token from its frequency in the training data alone, without "
        "context)"]


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
            learnt_lines_read_the_loss(p.stdout, repo)
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


def test_untrained_guesses_are_the_runs_step_0(data_dir, tmp_path):
    """sample.py --untrained=True shows the run's model before its first update: rebuilt from the checkpoint, its
    eval loss on the run's eval set is the step-0 eval loss that train.py logged (float32)."""
    import sample
    from lib.checkpoint import load_checkpoint
    from lib.dataloader import PretrainingData
    out = tmp_path / "run"
    p = run_script("train.py", "config/tiny_pair.py", f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2",
                   "--eval_interval=2", "--eval_iters=2", "--compile=False", "--dtype=float32", "--seed=7")
    assert p.returncode == 0, p.stderr[-2000:]
    ck = load_checkpoint(str(out / "ckpt.pt"))
    with open(out / "log.jsonl") as f:
        logged = [r["loss"] for r in map(json.loads, f) if r["type"] == "eval"]
    data = PretrainingData(data_dir, ck["model_args"]["vocab_size"], 128, 16, 0.15, 7)
    for model, want in ((sample.untrained_model(ck), logged[0]), (None, logged[-1])):
        if model is None:  # the trained model, read the same way: the comparison can tell them apart
            model = sample.Bert(sample.BertConfig(**ck["model_args"]))
            model.load_state_dict(ck["model"])
        model.eval()
        total = n = 0
        with torch.no_grad():
            for x, y, pos in data.eval_set(2):
                k = (y != -100).sum().item()
                total, n = total + model(x, y, pos)[1].item() * k, n + k
        assert total / n == pytest.approx(want, abs=1e-5)
    assert abs(logged[0] - logged[-1]) > 1e-3  # 100 x the tolerance above (2 steps at 2,048 ids: ~0.0097)
    p = run(["sample.py", f"--init_from={out / 'ckpt.pt'}", "--text=Return the [MASK] of the list.",
             "--untrained=True", "--top_k=2"], ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1].startswith("[MASK] 1, untrained (step 0): '") and lines[1].count("%") == 2
    assert lines[2].startswith("[MASK] 1, step 2: '") and lines[3].startswith("filled in: Return the")
    torch.save({k: v for k, v in ck.items() if k != "config"}, tmp_path / "bare.pt")
    p = run(["sample.py", f"--init_from={tmp_path / 'bare.pt'}", "--text=a [MASK]", "--untrained=True"], ROOT)
    assert p.returncode == 1 and "needs a train.py checkpoint" in p.stderr and "Traceback" not in p.stderr


def test_a_moved_config_fails_in_one_line_that_names_the_new_one():
    """The studies' configs moved to studies/config/: the old path names the new one."""
    p = run_script("train.py", "config/study_glue.py")
    assert p.returncode != 0 and "use studies/config/study_glue.py" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_top_folder_holds_the_implementations_scripts_alone():
    """The scripts at the top are the implementation's (the README's file table); the studies run from studies/."""
    git = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)  # a user's scratch file: not
    files = git.stdout.splitlines() if git.returncode == 0 else os.listdir(ROOT)  # the repository's (no git: all)
    top = sorted(f for f in files if f.endswith(".py") and "/" not in f)
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("## The files"):].split("\n## ")[0]
    named = [f for row in table.splitlines() if row.startswith("| `") for f in re.findall(r"`(\w+\.py)`",
                                                                                          row.split(" | ")[0])]
    assert top == sorted(named) and "train.py" in top


def test_ci_installs_and_runs_the_readmes_test_command():
    """.ci/run installs the packages the README's test command names and runs its pytest line, so that the two
    cannot drift apart (CI runs what a newcomer is told to run)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    block = readme.split("Run the tests")[1].split("```bash\n")[1].split("```")[0].replace("\\\n", " ")
    installs, _, pytest_line = block.partition("python -m pytest")
    assert f"python3 -m pytest {pytest_line.strip()}\n" in ci, (pytest_line, ci)
    ci_installs = {w for line in ci.splitlines() if "pip install" in line for w in line.split("#")[0].split()}
    for package in installs.split():
        if not package.startswith("-") and package not in ("pip", "install", "&&", "requirements.txt"):
            assert package in ci_installs, package


def test_the_suite_keeps_home_and_caches_to_itself(own_caches, tmp_path):
    """What the scripts cache as they run (matplotlib's fonts, torch.compile's kernels, the GPT-2 files) lands in the
    suite's own folder (conftest.own_caches): the user's home and tiktoken's cache are as they were (torch.compile's
    /tmp/torchinductor_<user> is left out of the comparison: any other torch program on the machine writes there)."""
    import getpass
    home = own_caches["HOME"] or os.path.expanduser("~" + getpass.getuser())
    theirs = [home, own_caches["TIKTOKEN_CACHE_DIR"] or os.path.join(own_caches["TMPDIR"] or "/tmp", "data-gym-cache")]

    def snapshot():  # every entry two levels down, with its time of change: a file added below changes its folder's
        return {os.path.join(d, *p): os.stat(os.path.join(d, *p)).st_mtime_ns for d in theirs if os.path.isdir(d)
                for p in [()] + [(a,) for a in os.listdir(d)] + [(a, b) for a in os.listdir(d) if
                                                                 os.path.isdir(os.path.join(d, a))
                                                                 for b in os.listdir(os.path.join(d, a))]}
    before = snapshot()
    code = ("import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; plt.plot([1, 2]); "
            f"plt.savefig({str(tmp_path / 'x.png')!r}); import torch; print(torch.compile(lambda x: x * 2)"
            "(torch.ones(2)).sum().item()); from lib.tokenizer import get_tokenizer; get_tokenizer()")
    p = run_script("-c", code)
    assert p.returncode == 0 and p.stdout.strip() == "4.0", p.stderr[-2000:]
    assert snapshot() == before
    assert os.listdir(os.environ["MPLCONFIGDIR"]) and os.listdir(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    p = run_script("-c", code, fresh=True)  # a fresh interpreter too
    assert p.returncode == 0 and snapshot() == before, p.stderr[-2000:]

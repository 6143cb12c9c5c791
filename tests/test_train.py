import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import train
from model import Bert, BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--n_inner=64", "--block_size=64", "--batch_size=8",
        "--gradient_accumulation_steps=2", "--warmup_iters=5", "--learning_rate=1e-2", "--eval_iters=4",
        "--log_interval=1", "--compile=False", "--checkpoint_interval=0"]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The built-in corpus, as the quick start makes it (a few hundred documents are plenty here)."""
    out = tmp_path_factory.mktemp("data") / "builtin"
    subprocess.run([sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--max_docs=300", "--val_docs=30",
                    "--num_proc=1"], cwd=ROOT, check=True, capture_output=True)
    return str(out)


def run_train(*args, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def read_log(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


# ---- schedule, masking, checkpoint files (no training) ---------------------------------------------
def test_lr_schedule_key_points(monkeypatch):
    monkeypatch.setattr(train, "learning_rate", 1e-4)
    monkeypatch.setattr(train, "warmup_iters", 10_000)
    monkeypatch.setattr(train, "max_iters", 200_000)
    assert train.get_lr(0) == 0.0
    assert train.get_lr(5_000) == pytest.approx(5e-5)
    assert train.get_lr(10_000) == pytest.approx(1e-4)  # the peak, at the end of warm-up
    assert train.get_lr(105_000) == pytest.approx(5e-5)  # half way down the linear decay
    assert train.get_lr(200_000) == 0.0 and train.get_lr(250_000) == 0.0


def test_masking_statistics_and_reproducibility():
    n_ordinary, mask_id, specials = 1000, 1003, [1000, 1001, 1002, 1003]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, n_ordinary, (512, 128), generator=g)
    x[:, 0], x[:, 60], x[:, -5:] = 1001, 1002, 1000  # [CLS], [SEP], trailing [PAD]
    inputs, targets = train.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    sel = targets != -100
    eligible = x < n_ordinary
    assert not sel[~eligible].any()  # special tokens and padding are never selected
    assert torch.equal(targets[sel], x[sel])
    assert (sel.sum(1) == round(0.15 * 128)).all()  # a fixed count per row: static head shape
    assert abs(sel.sum().item() / eligible.sum().item() - 0.15) < 0.01
    masked = (inputs == mask_id) & sel
    kept = (inputs == x) & sel
    randomised = sel & ~masked & ~kept
    n = sel.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    assert abs(randomised.sum().item() / n - 0.1) < 0.01
    assert abs(kept.sum().item() / n - 0.1) < 0.011  # includes random draws that hit the same token
    assert (inputs[randomised] < n_ordinary).all()
    assert torch.equal(inputs[~sel], x[~sel])  # unselected positions are untouched
    again = train.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    other = train.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(2))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
    assert not torch.equal(other[1], targets)


def test_masking_short_rows_select_only_real_tokens():
    x = torch.full((2, 40), 1000)  # mostly padding: fewer eligible tokens than the per-row count
    x[:, :3] = torch.tensor([5, 6, 7])
    _, targets = train.mask_tokens(x, 0.15, 1000, 1003, torch.Generator().manual_seed(0))
    assert ((targets != -100).sum(1) == 3).all()


def test_checkpoint_survives_crash_mid_write(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    train.save_checkpoint({"iter_num": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("simulated crash while writing")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train.save_checkpoint({"iter_num": 2, "w": torch.zeros(1000), "x": Boom()}, path)
    assert train.load_checkpoint(path)["iter_num"] == 1  # the previous checkpoint is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # and no temporary file is left behind
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match="not a readable checkpoint"):
        train.load_checkpoint(str(tmp_path / "bad.pt"))


# ---- end to end, on the built-in corpus ---------------------------------------------------------------
@pytest.mark.parametrize("attention_type", ["original", "symmetric", "pairwise", "hybrid"])
def test_loss_falls_for_each_operator(data_dir, tmp_path, attention_type):
    out = str(tmp_path / "out")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", f"--attention_type={attention_type}",
              "--max_iters=30", "--eval_interval=15", "--checkpoint_interval=15")
    evals = read_log(out, "eval")
    assert [r["step"] for r in evals] == [0, 15, 30]
    assert evals[-1]["loss"] < evals[0]["loss"] - 1.5, evals
    assert evals[-1]["accuracy"] > 0.02
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] == 30 and ckpt["model_args"]["attention_type"] == attention_type
    snaps = sorted(os.listdir(os.path.join(out, "snapshots")))
    assert snaps == ["ckpt_0000015.pt", "ckpt_0000030.pt"]
    model = Bert(BertConfig(**ckpt["model_args"]))
    model.load_state_dict(torch.load(os.path.join(out, "snapshots", snaps[0]), weights_only=True)["model"])


def test_exact_resume_after_sigterm(data_dir, tmp_path):
    args = [*TINY, f"--dataset={data_dir}", "--max_iters=24", "--eval_interval=8", "--dropout=0.1"]
    full = str(tmp_path / "full")
    run_train(*args, f"--out_dir={full}")

    part = str(tmp_path / "part")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "train.py", *args, f"--out_dir={part}"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = os.path.join(part, "log.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:  # pre-empt it once a few steps are done
        if os.path.exists(log) and len(read_log(part, "train")) >= 3:
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    out_text, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    stopped_at = torch.load(os.path.join(part, "ckpt.pt"), weights_only=True)["iter_num"]
    assert 3 <= stopped_at < 24, "the run was not interrupted"
    assert "stopped by signal" in out_text

    run_train(*args, f"--out_dir={part}", "--init_from=resume")
    for kind in ("train", "eval"):
        a, b = read_log(full, kind), read_log(part, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b]
        assert [r["loss"] for r in a] == [r["loss"] for r in b]  # bit for bit


def test_ddp_two_processes_match_one(data_dir, tmp_path):
    args = [*TINY, f"--dataset={data_dir}", "--max_iters=6", "--eval_interval=3", "--dropout=0.0",
            "--gradient_accumulation_steps=4"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    run_train(*args, f"--out_dir={one}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *args, f"--out_dir={two}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 process(es) x 2 micro-steps" in p.stdout
    for kind in ("train", "eval"):
        a, b = read_log(one, kind), read_log(two, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b]
        np.testing.assert_allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=1e-5)
    assert read_log(one, "train")[-1]["loss"] < read_log(one, "train")[0]["loss"]


# ---- bad input: one clear line, nothing overwritten ------------------------------------------------------
def test_bad_input_messages(data_dir, tmp_path):
    p = run_train(*TINY, "--dataset=no_such_corpus", f"--out_dir={tmp_path}/x", check=False)
    assert p.returncode != 0 and "no dataset in data/no_such_corpus: make it with `python prepare_oscar.py" in p.stderr
    assert "Traceback" not in p.stderr
    p = run_train(*TINY, f"--dataset={data_dir}", "--block_size=48", f"--out_dir={tmp_path}/x", check=False)
    assert "must divide the dataset's block size" in p.stderr and "Traceback" not in p.stderr
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"precious")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", check=False)
    assert "exists: continue it with --init_from=resume" in p.stderr
    assert (out / "ckpt.pt").read_bytes() == b"precious"  # untouched
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", check=False)
    assert "is not a readable checkpoint" in p.stderr and "Traceback" not in p.stderr
    p = run_train(*TINY, "--attention_type=asym", f"--dataset={data_dir}", f"--out_dir={tmp_path}/y", check=False)
    assert "attention_type must be one of" in p.stderr
    for bad, msg in [("--eval_interval=0", "must be at least 1"), ("--device=gpu", "is not available here"),
                     ("--batch_size=100000", "prepare more data or use a batch_size <=")]:
        p = run_train(*TINY, bad, f"--dataset={data_dir}", f"--out_dir={tmp_path}/z", check=False)
        assert msg in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr[-500:])

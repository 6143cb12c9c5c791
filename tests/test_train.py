import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, run_script, vocab_size
from lib import checkpoint
from lib.step import linear_schedule
from model import Bert, BertConfig
from studies.jobs import unigram_loss

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--n_inner=64", "--block_size=64", "--batch_size=8",
        "--gradient_accumulation_steps=2", "--warmup_iters=5", "--learning_rate=1e-2", "--eval_iters=4",
        "--log_interval=1", "--compile=False", "--checkpoint_interval=0"]


def run_train(*args, check=True):
    p = run_script("train.py", *args)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def read_log(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


# ---- end to end, on the built-in corpus ---------------------------------------------------------------
@pytest.mark.parametrize("attention_type,dtype", [("original", "float32"), ("symmetric", "float32"),
                                                  ("pairwise", "float32"), ("hybrid", "float32"),
                                                  ("original", "bfloat16"), ("pairwise", "bfloat16")])
def test_loss_falls_for_each_operator(data_dir, tmp_path, attention_type, dtype):
    out = str(tmp_path / "out")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", f"--attention_type={attention_type}",
                  "--max_iters=30", "--eval_interval=15", "--checkpoint_interval=15", f"--dtype={dtype}")
    assert f"cpu, {dtype} (as asked)" in p.stdout
    for r in read_log(out, "train"):  # throughput in one format at any speed: 18,060, never 1.806e+04
        assert f"step {r['step']}: loss {r['loss']:.4g}, lr {r['lr']:.4g}, tokens_per_s {r['tokens_per_s']:,.0f}\n" \
            in p.stdout
    evals = read_log(out, "eval")
    assert [r["step"] for r in evals] == [0, 15, 30]
    u = unigram_loss(data_dir, 64, 8, 4)  # the token frequencies' loss: the plateau a BERT first reaches
    assert evals[-1]["loss"] < evals[0]["loss"] - 0.5 * (evals[0]["loss"] - u), (evals, u)
    assert evals[-1]["accuracy"] > 0.02
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] == 30 and ckpt["model_args"]["attention_type"] == attention_type
    snaps = sorted(os.listdir(os.path.join(out, "snapshots")))
    assert snaps == ["ckpt_0000015.pt", "ckpt_0000030.pt"]
    model = Bert(BertConfig(**ckpt["model_args"]))
    model.load_state_dict(torch.load(os.path.join(out, "snapshots", snaps[0]), weights_only=True)["model"])


HEAT = ["--score_scale=8.0", "--score_scale_warmup=12", "--qk_lr_scale=0.5", "--qk_init_scale=2.0"]  # start or step


FAST = ["--compile=True", "--compile_optimizer=True", "--fused_qkv=True", "--fused_loss=True",  # issue #54
        "--attention_dropout=0.2"]


@pytest.mark.parametrize("dtype,extra", [("float32", []), ("bfloat16", []), ("float32", HEAT), ("float32", FAST)])
def test_exact_resume_after_sigterm(data_dir, tmp_path, dtype, extra):
    args = [*TINY, f"--dataset={data_dir}", "--max_iters=24", "--eval_interval=8", "--dropout=0.1", f"--dtype={dtype}",
            *extra]
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
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]  # saved, then told the scheduler it was stopped
    stopped_at = torch.load(os.path.join(part, "ckpt.pt"), weights_only=True)["iter_num"]
    assert 3 <= stopped_at < 24, "the run was not interrupted"
    assert "stopped by signal" in out_text

    no_dtype = [a for a in args if not a.startswith("--dtype")]  # the resume keeps the run's own, whatever auto says
    p = run_train(*no_dtype, f"--out_dir={part}", "--init_from=resume")
    assert f"cpu, {dtype} (the run's)" in p.stdout and "not an exact continuation" not in p.stdout
    for kind in ("train", "eval"):
        a, b = read_log(full, kind), read_log(part, kind)
        assert [r["step"] for r in a] == [r["step"] for r in b]
        assert [r["loss"] for r in a] == [r["loss"] for r in b]  # bit for bit
    change = lambda run: [r.get("score_change") for r in read_log(run, "eval")]
    assert change(full) == change(part)
    assert all(len(r["score_change"]) == 2 for r in read_log(part, "eval")[1:])  # from the second eval on, per layer


def test_ddp_two_processes_match_one(data_dir, tmp_path):  # compiled, as a GPU node runs it: DDP, then compile
    args = [*TINY, f"--dataset={data_dir}", "--max_iters=6", "--eval_interval=3", "--dropout=0.0",
            "--gradient_accumulation_steps=4", "--compile=True"]
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


def test_a_signal_under_torchrun_waits_for_rank_0s_save(data_dir, tmp_path):
    """Only rank 1 is signalled: both processes stop at the same step, rank 0 saves (made slow here), and rank 1
    leaves only after that save (an early exit makes torchrun stop the group while rank 0 is still writing)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(  # rank 0's rename of ckpt.pt takes 2 s, and says when it ended
        "import os, time\n"
        "if os.environ.get('RANK') == '0':\n"
        "    _replace = os.replace\n"
        "    def replace(a, b):\n"
        "        if not str(b).endswith('ckpt.pt'):\n"
        "            return _replace(a, b)\n"
        "        time.sleep(2.0)\n"
        "        _replace(a, b)\n"
        "        open(str(b) + '.saved_at', 'w').write(repr(time.time()))\n"
        "    os.replace = replace\n")
    out = str(tmp_path / "run")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "train.py", *TINY, f"--dataset={data_dir}", "--max_iters=400", "--eval_interval=200",
                          "--save_interval=1000", f"--out_dir={out}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline, exited = time.time() + 240, {}
    while time.time() < deadline and not (os.path.exists(f"{out}/log.jsonl") and len(read_log(out, "train")) >= 3):
        time.sleep(0.05)
    workers = {}
    for pid in map(int, subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()):
        with open(f"/proc/{pid}/environ", "rb") as f:
            env_of = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        workers[int(env_of[b"RANK"])] = pid
    os.kill(workers[1], signal.SIGTERM)
    while time.time() < deadline and len(exited) < 2:
        for rank, pid in workers.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    gone = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has exited
            except FileNotFoundError:
                gone = True
            if gone and rank not in exited:
                exited[rank] = time.time()
        time.sleep(0.01)
    text = p.communicate(timeout=120)[0]
    saved_at = float(open(f"{out}/ckpt.pt.saved_at").read())
    assert exited[1] >= saved_at, (exited, saved_at, text[-2000:])  # rank 1 waited for the save
    assert f"stopped by signal {signal.SIGTERM}" in text
    step = torch.load(f"{out}/ckpt.pt", weights_only=True)["iter_num"]
    assert 3 <= step < 400
    assert p.returncode != 0  # torchrun reports its processes' exit 143 as a failure (docs/safety.md)


def test_save_interval_a_killed_run_resumes_from_its_last_save(data_dir, tmp_path):
    """ckpt.pt every save_interval steps, apart from the evals: a run killed outright (no chance to save) resumes
    from its last save and repeats exactly what the uninterrupted run did."""
    args = [*TINY, f"--dataset={data_dir}", "--max_iters=40", "--eval_interval=8", "--save_interval=5",
            "--dtype=float32"]
    run_train(*args, f"--out_dir={tmp_path}/full")
    part = str(tmp_path / "part")
    p = subprocess.Popen([sys.executable, "train.py", *args, f"--out_dir={part}"], cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(f"{part}/log.jsonl") and len(read_log(part, "train")) >= 12:
            p.kill()  # SIGKILL: nothing is saved on the way out
            break
        time.sleep(0.02)
    p.wait(timeout=60)
    step = torch.load(f"{part}/ckpt.pt", weights_only=True)["iter_num"]
    assert step % 5 == 0 and 10 <= step < 40, step  # the last multiple of save_interval (not an eval step)
    p = run_train(*args, f"--out_dir={part}", "--init_from=resume")
    assert f"resuming {part}/ckpt.pt at step {step}" in p.stdout
    for kind in ("train", "eval"):
        a, b = read_log(f"{tmp_path}/full", kind), read_log(part, kind)
        assert [(r["step"], r["loss"]) for r in a] == [(r["step"], r["loss"]) for r in b]


# ---- bad input: one clear line, nothing overwritten ------------------------------------------------------
def test_bad_input_messages(data_dir, tmp_path):
    p = run_train(*TINY, "--dataset=no_such_corpus", f"--out_dir={tmp_path}/x", check=False)
    assert p.returncode != 0 and "no dataset in data/no_such_corpus: make it with `python prepare_oscar.py" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x").exists()  # nothing written: no folder left
    p = run_script(os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "base_pair.py"), cwd=tmp_path)
    assert "no dataset in data/oscar: make it with `python prepare_oscar.py --source=oscar`" in p.stderr
    assert p.returncode != 0 and not (tmp_path / "out").exists()
    p = run_train(*TINY, f"--dataset={data_dir}", "--block_size=48", f"--out_dir={tmp_path}/x", check=False)
    assert "must divide the dataset's block size" in p.stderr and "Traceback" not in p.stderr
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"precious")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", check=False)
    assert "holds another run (ckpt.pt): continue it with --init_from=resume" in p.stderr
    assert (out / "ckpt.pt").read_bytes() == b"precious"  # untouched
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", check=False)
    assert "is not a readable checkpoint" in p.stderr and "Traceback" not in p.stderr
    p = run_train(*TINY, "--attention_type=asym", f"--dataset={data_dir}", f"--out_dir={tmp_path}/y", check=False)
    assert "attention_type must be one of" in p.stderr
    (tmp_path / "notes.txt").write_text("mine")
    p = run_train(*TINY, f"--dataset={tmp_path / 'notes.txt'}", f"--out_dir={tmp_path}/w", check=False)
    one_line_error(p, "notes.txt is a file, not a prepare_oscar.py dataset's folder")  # was: --out_dir=<the file>
    for bad, msg in [("--eval_interval=0", "save_interval must be >= 1"), ("--device=gpu", "is not available here"),
                     ("--batch_size=100000", "prepare more data or use a batch_size <=")]:
        p = run_train(*TINY, bad, f"--dataset={data_dir}", f"--out_dir={tmp_path}/z", check=False)
        assert msg in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr[-500:])


# ---- no run or result is ever lost or silently wrong -------------------------------------------------------
def one_line_error(p, msg):
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]


def test_a_diverged_model_is_never_saved(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=4", "--eval_interval=2")
    good = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    # diverge at once (lr 1e30), with no loss check before the next snapshot
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--learning_rate=1e30",
                  "--warmup_iters=0", "--max_iters=20", "--eval_interval=100", "--log_interval=100",
                  "--checkpoint_interval=6", check=False)
    one_line_error(p, f"the weights are not finite (NaN/inf) at step 6; nothing was saved. Last good checkpoint: {out}")
    kept = checkpoint.load_checkpoint(os.path.join(out, "ckpt.pt"), resume=True)  # finite, unchanged
    assert kept["iter_num"] == 4 and all(torch.equal(kept["model"][k], v) for k, v in good["model"].items())
    assert os.listdir(os.path.join(out, "snapshots")) == []


def test_fp16_loss_scale_collapse_stops_the_run(data_dir, tmp_path):
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={tmp_path}/fp16", "--dtype=float16", "--warmup_iters=0",
                  "--learning_rate=1e30", "--max_iters=60", "--eval_interval=100", "--gradient_accumulation_steps=1",
                  check=False)
    one_line_error(p, "the fp16 loss scale collapsed to")


def test_another_runs_files_are_never_touched(data_dir, tmp_path):
    out = tmp_path / "run"
    (out / "snapshots").mkdir(parents=True)
    (out / "log.jsonl").write_text('{"type": "eval", "step": 100, "loss": 3.0}\n')
    (out / "snapshots" / "ckpt_0000100.pt").write_bytes(b"weights")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", check=False)
    one_line_error(p, "holds another run (log.jsonl, snapshots/): continue it with --init_from=resume")
    assert (out / "log.jsonl").read_text().startswith('{"type": "eval", "step": 100')
    assert (out / "snapshots" / "ckpt_0000100.pt").read_bytes() == b"weights"
    (tmp_path / "file").write_text("x")
    one_line_error(run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={tmp_path}/file/run", check=False),
                   "cannot use")  # an out_dir under a regular file


def test_one_run_per_out_dir(data_dir, tmp_path):
    out = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", f"from lib import files; import time; files.lock_dir({out!r}, 'train.py "
                               "config/x.py'); print('held', flush=True); time.sleep(60)"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2", check=False)
        one_line_error(p, f"{out} is in use by train.py config/x.py (pid {holder.pid} on ")
    finally:
        holder.kill()
        holder.wait()
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2")  # the dead holder's lock is free


def test_dataset_files_are_checked_before_any_compute(data_dir, tmp_path):
    import shutil
    cases = {"short": lambda d: open(d / "train.bin", "r+b").truncate(os.path.getsize(d / "train.bin") - 2),
             "no_val": lambda d: os.remove(d / "val.bin"),
             "bad_meta": lambda d: (d / "meta.json").write_text("{not json"),
             "keys": lambda d: (d / "meta.json").write_text('{"vocab_size": 50304}'),
             "dtype": lambda d: (d / "meta.json").write_text((d / "meta.json").read_text().replace(
                 '"dtype": "uint16"', '"dtype": "int32"'))}
    for name, damage in cases.items():
        d = tmp_path / name
        shutil.copytree(data_dir, d)
        damage(d)
        p = run_train(*TINY, f"--dataset={d}", f"--out_dir={tmp_path}/out_{name}", check=False)
        one_line_error(p, {"short": "the dataset is incomplete or corrupt", "no_val": "val.bin is missing",
                           "bad_meta": "cannot read dataset metadata", "keys": "meta.json is incomplete",
                           "dtype": "says dtype 'int32'; train.py reads uint16"}[name])
        assert not os.path.exists(f"{tmp_path}/out_{name}"), name  # refused before anything was written: no folder


def test_resume_refuses_another_architecture(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                  "--attention_type=pairwise", "--n_layer=3", check=False)
    one_line_error(p, "the command line asks for another model: --n_layer=3 (the run's: 2), --attention_type=pairwise "
                      "(the run's: 'original'). To resume it: python train.py --n_head=2")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                  "--qk_lr_scale=8.0", check=False)  # other parameter groups: the optimizer state cannot fit
    one_line_error(p, "resume with the run's own qk_lr_scale (1.0)")
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    os.makedirs(tmp_path / "edited")
    torch.save({**ck, "config": {**ck["config"], "eval_interval": 0}}, tmp_path / "edited" / "ckpt.pt")
    p = run_train(f"--out_dir={tmp_path / 'edited'}", "--init_from=resume", "--max_iters=4", check=False)
    one_line_error(p, f"eval_interval, eval_iters, log_interval and save_interval must be >= 1 (the settings of "
                      f"{tmp_path / 'edited' / 'ckpt.pt'}: edited or damaged")  # its own settings, checked as given
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")


def test_the_data_decides_a_new_models_vocabulary(data_dir, tmp_path):
    """Data of a smaller vocabulary (prepare_oscar.py --vocab_size=16384) makes a model of that vocabulary; resumed on
    data of another, it is refused in one line; sample.py and finetune_glue.py tokenise with it (the full
    vocabulary's [PAD] or [MASK] id would be past its embedding)."""
    small, out = tmp_path / "small", tmp_path / "run"
    p = run_script("prepare_oscar.py", f"--out_dir={small}", "--max_docs=300", "--val_docs=30", "--num_proc=1",
                   "--vocab_size=16384")
    assert p.returncode == 0, p.stderr[-2000:]
    run_train(*TINY, f"--dataset={small}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["model_args"]["vocab_size"] == 16384 and ck["model"]["encoder.wte.weight"].shape == (16384, 32)
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                  check=False)
    v = vocab_size(data_dir)
    one_line_error(p, f"{data_dir} was made with a vocabulary of {v} ids (prepare_oscar.py --vocab_size), the model "
                      "has 16384: resume it on data of its own vocabulary")
    p = run_script("sample.py", f"--init_from={out / 'ckpt.pt'}", "--text=The [MASK] of the list.", "--top_k=3")
    assert p.returncode == 0 and "filled in: The" in p.stdout, p.stderr[-2000:]
    glue = tmp_path / "glue" / "RTE"
    glue.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (glue / name).write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(
            f"{i}\tA dog runs in the park {i}.\tAn animal is outside.\t{'not_' * (i % 2)}entailment\n" for i in range(8)))
    p = run_script("finetune_glue.py", f"--init_from={out / 'ckpt.pt'}", f"--data_dir={glue.parent}", "--tasks=rte",
                   "--seeds=1", "--epochs=1", "--max_seq_len=32", "--device=cpu", "--dtype=float32",
                   f"--out_dir={tmp_path / 'glue_out'}")
    assert p.returncode == 0 and "rte seed 1: rte" in p.stdout, p.stderr[-2000:]


@pytest.mark.parametrize("bad,msg", [("--mask_prob=0", "mask_prob must be in (0, 1)"),
                                     ("--mask_prob=0.001", "predicts no token"),
                                     ("--dropout=1.0", "dropout must be in [0, 1)"),
                                     ("--attention_dropout=1.0", "attention_dropout must be None or in [0, 1)"),
                                     ("--attention_dropout='x'", "attention_dropout must be None or in [0, 1)"),
                                     ("--compile_mode=fast", "compile_mode must be one of default, reduce-overhead"),
                                     ("--sdpa_backend=fa3", "sdpa_backend must be one of auto, cudnn, flash"),
                                     ("--learning_rate=-1e-3", "learning_rate, eps and qk_lr_scale must be > 0"),
                                     ("--qk_lr_scale=0", "learning_rate, eps and qk_lr_scale must be > 0"),
                                     ("--score_scale_warmup=-1", "score_scale_warmup must be >= 0"),
                                     ("--init_from=last", "init_from must be"),
                                     ("--peak_flops=-1e12", "peak_flops, max_minutes, max_iters and pause_at must be"),
                                     ("--target_loss=-1", "target_loss, peak_flops, max_minutes, max_iters and pause_at"),
                                     ("--pause_at=-1", "max_iters and pause_at must be >= 0"),
                                     ("--seed=-1", "seed must be in [0, 2**32)"),
                                     ("--seed=99999999999999999999", "seed must be in [0, 2**32)"),
                                     ("--n_head=0", "n_layer, n_head, n_embd, n_inner, block_size must be >= 1"),
                                     ("--dtype=fp8", "dtype must be auto")])
def test_out_of_range_settings_are_one_line(data_dir, tmp_path, bad, msg):
    one_line_error(run_train(*TINY, "--max_iters=10", bad, f"--dataset={data_dir}", f"--out_dir={tmp_path}/x",
                             check=False), msg)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="watches /proc/<pid>/maps")
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])  # after torch's libraries begin to load (so the handler is set)
def test_ctrl_c_during_start_up_is_one_line(data_dir, tmp_path, delay):  # `import torch` swallowed a SystemExit
    p = subprocess.Popen([sys.executable, "train.py", *TINY, f"--dataset={data_dir}", f"--out_dir={tmp_path}/x"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while p.poll() is None and time.time() < deadline:
        with open(f"/proc/{p.pid}/maps") as f:
            if "torch" in f.read():
                break
        time.sleep(0.005)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted by signal 2 before training started" in err and "Traceback" not in err
    assert not os.path.exists(f"{tmp_path}/x/ckpt.pt")  # it did not go on to train


def test_a_closed_output_stops_the_run_saved_and_quietly(data_dir, tmp_path):
    """#72 cause 5: a stdout whose reader has gone (`train.py ... | head`) was a BrokenPipeError traceback, the run dead
    with nothing saved. lib/interrupt.py takes it as SIGPIPE, for every script: the output dropped, the run stopped as
    on a signal (saved first), no line (its reader has gone), exit 141; it resumes from there."""
    out = tmp_path / "x"
    p = subprocess.Popen([sys.executable, "train.py", *TINY, "--max_iters=100000", f"--dataset={data_dir}",
                          f"--out_dir={out}"], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not p.stdout.readline().startswith("step 2:"):  # `| head`: it read a few lines, then went
        pass
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]
    step = checkpoint.load_checkpoint(str(out / "ckpt.pt"))["iter_num"]
    assert 2 < step < 100, step  # saved where it stopped, a few steps on
    p = run_train(*TINY, "--max_iters=100000", f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume",
                  f"--pause_at={step + 2}")
    assert f"resuming {out}/ckpt.pt at step {step}" in p.stdout and f"paused at step {step + 2}" in p.stdout


def test_help_lists_every_setting():
    p = run_script("train.py", "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: python train.py")
    keys = [w.split("=")[0][2:] for line in p.stdout.splitlines() if line.startswith("  --")  # a, b = ... share
            for w in itertools.takewhile(lambda w: w.startswith("--"), line.split())]  # one line: its leading --k=v
    with open(os.path.join(ROOT, "train.py")) as f:
        src = f.read()
    block = src.split("# " + "-" * 77)[1]  # the config block
    import re
    want = re.findall(r"^(\w+(?:, \w+)*) = ", block, re.M)
    assert keys == [k for names in want for k in names.split(", ")]
    assert "  --mask_prob=0.15" in p.stdout and "fraction of each sequence's tokens that is predicted" in p.stdout


def test_a_failing_compiler_is_one_line_then_eager(data_dir, tmp_path):
    bin_dir = tmp_path / "bin"  # C and C++ compilers that always fail, first on the PATH
    bin_dir.mkdir()
    for cc in ("g++", "gcc", "c++", "cc"):
        (bin_dir / cc).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / cc).chmod(0o755)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{bin_dir}:{os.environ['PATH']}", "CXX": str(bin_dir / "g++")}
    p = subprocess.run([sys.executable, "train.py", *TINY, "--compile=True", f"--dataset={data_dir}",
                        f"--out_dir={tmp_path}/run", "--max_iters=2", "--eval_interval=2"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "compiling the model" in p.stdout and "torch.compile failed (" in p.stdout and "running eagerly" in p.stdout
    assert "Traceback" not in p.stderr and "done: step 2" in p.stdout


def test_resume_takes_the_runs_own_settings(data_dir, tmp_path):
    """The hint a finished run prints: a higher --max_iters with --init_from=resume, no config file needed; and the
    README's resume, the config file again: its settings yield to the run's own (made with overrides), while an
    override that asks for another model is refused, naming it and the command that resumes."""
    cfg, out = tmp_path / "my.py", str(tmp_path / "run")
    cfg.write_text(f'dataset = "{data_dir}"\nn_layer, n_head, n_embd, n_inner = 1, 2, 32, 64\nblock_size = 64\n'
                   'batch_size = 8\ngradient_accumulation_steps = 1\nlearning_rate = 1e-2\nwarmup_iters = 2\n'
                   'eval_interval = 2\neval_iters = 2\nlog_interval = 2\ncheckpoint_interval = 0\ncompile = False\n'
                   f'max_iters = 4\nout_dir = "{out}"\ndropout = 0.1\n')
    run_train(str(cfg), "--learning_rate=5e-3", "--dropout=0.0")
    p = run_train(f"--out_dir={out}", "--init_from=resume", "--max_iters=6")  # train.py's defaults would be bert-base
    assert "resuming" in p.stdout and "max_iters 4 -> 6" in p.stdout and "done: step 6" in p.stdout
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["config"]["dataset"] == data_dir and ckpt["config"]["batch_size"] == 8 and ckpt["iter_num"] == 6
    assert [r["step"] for r in read_log(out, "eval")] == [0, 2, 4, 6]
    p = run_train(str(cfg), "--init_from=resume", "--dropout=0.1", "--max_iters=8", check=False)
    one_line_error(p, f"the command line asks for another model: --dropout=0.1 (the run's: 0.0). To resume it: python "
                      f"train.py {cfg} --init_from=resume --max_iters=8; or start a new out_dir")
    p = run_train(str(cfg), "--init_from=resume", "--max_iters=8")
    assert f"own settings: dropout 0.0 ({cfg}: 0.1), learning_rate 0.005 ({cfg}: 0.01)" in p.stdout, p.stdout
    assert "done: step 8" in p.stdout
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert (ckpt["config"]["learning_rate"], ckpt["model_args"]["dropout"], ckpt["iter_num"]) == (5e-3, 0.0, 8)


def test_a_constant_lr_run_extends_exactly(data_dir, tmp_path):
    """decay_lr=False: a run's past does not depend on max_iters, so a resume to a higher max_iters is the same
    run as one that was that long from the start (the study extends runs this way)."""
    args = [*TINY, f"--dataset={data_dir}", "--eval_interval=4", "--decay_lr=False", "--dtype=float32"]
    run_train(*args, "--max_iters=12", f"--out_dir={tmp_path}/long")
    run_train(*args, "--max_iters=8", f"--out_dir={tmp_path}/short")
    p = run_train(f"--out_dir={tmp_path}/short", "--init_from=resume", "--max_iters=12", "--compile=False")
    assert "not an exact continuation" not in p.stdout
    for kind in ("train", "eval"):
        a, b = read_log(f"{tmp_path}/long", kind), read_log(f"{tmp_path}/short", kind)
        assert [(r["step"], r["loss"], r.get("lr")) for r in a] == [(r["step"], r["loss"], r.get("lr")) for r in b]
    assert read_log(f"{tmp_path}/long", "train")[-1]["lr"] == 1e-2  # constant, not decayed


def test_target_loss_stops_a_run_and_its_resume(data_dir, tmp_path):
    """A run ends at the first eval at or after min_iters whose loss is <= target_loss, with that eval saved; its
    resume with the same settings stays stopped; --target_loss=0 trains it on."""
    args = [*TINY, f"--dataset={data_dir}", "--eval_interval=2", "--decay_lr=False", "--dtype=float32",
            "--max_iters=20", "--target_loss=7.55", "--min_iters=6", f"--out_dir={tmp_path}/r"]  # step 0: ln 2048
    p = run_train(*args)
    evals = read_log(f"{tmp_path}/r", "eval")
    first = next(r["step"] for r in evals if r["loss"] <= 7.55)
    assert first < 6 and evals[-1]["step"] == 6, evals  # met before min_iters: stopped at the first eval after it
    assert "at or below target_loss" in p.stdout and "--target_loss=0" in p.stdout
    assert torch.load(f"{tmp_path}/r/ckpt.pt", weights_only=True)["iter_num"] == 6
    p = run_train(*args, "--init_from=resume")
    assert torch.load(f"{tmp_path}/r/ckpt.pt", weights_only=True)["iter_num"] == 6 and "done: step 6" in p.stdout
    p = run_train(*args, "--init_from=resume", "--target_loss=0")
    assert "not an exact continuation" not in p.stdout and read_log(f"{tmp_path}/r", "eval")[-1]["step"] == 20


def test_pause_at_stops_a_run_saved_and_its_resume_goes_on_as_if_never_paused(data_dir, tmp_path):
    """--pause_at=K: the run stops at step K, saved (exit 0, no end-of-run summary); the resume goes on past K without
    it (a call's setting, not the run's), and the whole logs the uninterrupted run's losses; a resume that asks for the
    same pause again goes on too."""
    args = [*TINY, f"--dataset={data_dir}", "--eval_interval=3", "--dtype=float32", "--max_iters=9"]
    run_train(*args, f"--out_dir={tmp_path}/a")
    p = run_train(*args, f"--out_dir={tmp_path}/b", "--pause_at=6")
    assert "paused at step 6 (pause_at)" in p.stdout and "done: step" not in p.stdout
    assert torch.load(f"{tmp_path}/b/ckpt.pt", weights_only=True)["iter_num"] == 6
    p = run_train(*args, f"--out_dir={tmp_path}/b", "--init_from=resume", "--pause_at=6")
    assert "not an exact continuation" not in p.stdout and "paused" not in p.stdout
    losses = lambda d, kind: [(r["step"], r["loss"]) for r in read_log(d, kind)]
    for kind in ("train", "eval"):
        assert losses(f"{tmp_path}/b", kind) == losses(f"{tmp_path}/a", kind)
    assert [r["step"] for r in read_log(f"{tmp_path}/b", "eval")] == [0, 3, 6, 9]
    run_train(*args, f"--out_dir={tmp_path}/c", "--pause_at=6", "--checkpoint_interval=6")
    snap = tmp_path / "c" / "snapshots" / "ckpt_0000006.pt"
    made = (snap.read_bytes(), snap.stat().st_mtime_ns)
    p = run_train(*args, f"--out_dir={tmp_path}/c", "--init_from=resume", "--learning_rate=2e-3")
    assert "not an exact continuation" in p.stdout  # the snapshot at the pause is the first call's, as it was made
    assert (snap.read_bytes(), snap.stat().st_mtime_ns) == made


def run_train_clocked(*args, tick=0.5):
    """train.py with a controlled budget clock: every training step takes exactly `tick` seconds of it."""
    code = ("import itertools, runpy, sys; from lib import step; c = itertools.count(); "
            f"step.clock = lambda: next(c) * {tick}; sys.argv = ['train.py'] + {list(args)!r}; "
            "runpy.run_path('train.py', run_name='__main__')")
    p = run_script("-c", code)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_a_gpu_sized_run_on_a_cpu_is_told_so_and_one_minute_is_one(data_dir, tmp_path):
    """A run whose steps would take days on a CPU says so at the start (from the model's FLOPs); a small one does
    not. A budget of 1 minute is said in the singular. A GPU attention kernel asked for on a CPU is named as not used."""
    p = run_train_clocked(*TINY, f"--dataset={data_dir}", "--max_iters=1000000000", "--eval_interval=1000",
                          "--max_minutes=1", f"--out_dir={tmp_path}/r", "--device=cpu", tick=30)  # 2 steps
    assert re.search(r"note: the 1,000,000,000 steps to go are \S+ FLOPs: ~[\d,]+ days on a CPU", p.stdout), p.stdout
    assert "budget: 1 minute of training steps" in p.stdout and "its budget of 1 minute spent" in p.stdout
    assert "sdpa_backend" not in p.stdout
    p = run_train(*TINY, f"--dataset={data_dir}", "--max_iters=2", f"--out_dir={tmp_path}/s", "--device=cpu",
                  "--sdpa_backend=flash")
    assert "days on a CPU" not in p.stdout
    assert "note: sdpa_backend=flash is a GPU kernel: on cpu PyTorch picks its own" in p.stdout


def test_a_time_budget_drives_the_schedule_stops_saves_and_resumes(data_dir, tmp_path):
    """--max_minutes: the learning rate follows the fraction of the budget spent on training steps (whichever of it
    and step / max_iters is further), the run ends when the budget is spent with an eval and a save, and a resume
    continues from the time its checkpoint says was spent."""
    out = f"{tmp_path}/r"
    args = [*TINY, f"--dataset={data_dir}", "--eval_interval=100", "--max_iters=100", "--warmup_iters=10",
            "--dtype=float32", f"--out_dir={out}"]
    p = run_train_clocked(*args, "--max_minutes=0.05")  # 3 s at 0.5 s a step: 6 steps
    expect = lambda k, minutes: linear_schedule(max(k, k * 0.5 / (60 * minutes) * 100), 1e-2, 10, 100)
    assert [(r["step"], r["lr"]) for r in read_log(out, "train")] == [
        (k + 1, pytest.approx(expect(k, 0.05))) for k in range(6)]  # step 1's lr: already past the warm-up
    ck = torch.load(f"{out}/ckpt.pt", weights_only=True)
    assert ck["iter_num"] == 6 and ck["spent"] == 3.0
    assert [(r["step"], r["spent"]) for r in read_log(out, "eval")] == [(0, 0.0), (6, 3.0)]  # the end is evaluated
    assert "its budget of 0.05 minutes spent" in p.stdout
    p = run_train_clocked(*args, "--max_minutes=0.05")  # the same command again: finished, nothing to do
    assert "nothing to do" in p.stdout and "a higher --max_minutes" in p.stdout
    run_train_clocked(*args, "--max_minutes=0.1", "--init_from=resume")  # 3 s more
    lrs = [(r["step"], r["lr"]) for r in read_log(out, "train")]
    assert lrs[6:] == [(k + 1, pytest.approx(expect(k, 0.1))) for k in range(6, 12)]  # spent went on from 3 s
    assert torch.load(f"{out}/ckpt.pt", weights_only=True)["iter_num"] == 12


def test_max_iters_0_saves_the_untrained_model(data_dir, tmp_path):
    """--max_iters=0: no step; the model as initialised from the seed is evaluated and saved (a GLUE baseline: what
    pre-training bought), the same weights as step 0 of a run with that seed."""
    run_train(*TINY, f"--dataset={data_dir}", "--max_iters=0", "--dtype=float32", f"--out_dir={tmp_path}/u")
    ck = torch.load(f"{tmp_path}/u/ckpt.pt", weights_only=True)
    assert ck["iter_num"] == 0 and not read_log(f"{tmp_path}/u", "train")
    assert [r["step"] for r in read_log(f"{tmp_path}/u", "eval")] == [0]
    run_train(*TINY, f"--dataset={data_dir}", "--max_iters=1", "--dtype=float32", f"--out_dir={tmp_path}/t")
    first = read_log(f"{tmp_path}/t", "eval")[0]
    assert first["step"] == 0 and first["loss"] == read_log(f"{tmp_path}/u", "eval")[0]["loss"]

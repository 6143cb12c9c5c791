import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lib import dataloader
from lib import device
from lib import checkpoint
from lib import files
from model import Bert, BertConfig
from lib.step import distribute_and_compile, linear_schedule
from conftest import ROOT, run_script

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


# ---- schedule, masking, checkpoint files (no training) ---------------------------------------------
def test_lr_schedule_key_points():
    lr = lambda it: linear_schedule(it, 1e-4, 10_000, 200_000)
    assert lr(0) == 0.0
    assert lr(5_000) == pytest.approx(5e-5)
    assert lr(10_000) == pytest.approx(1e-4)  # the peak, at the end of warm-up
    assert lr(105_000) == pytest.approx(5e-5)  # half way down the linear decay
    assert lr(200_000) == 0.0 and lr(250_000) == 0.0
    assert linear_schedule(3, 1e-5, 0, 10) == pytest.approx(7e-6)  # no warm-up: decay from the start
    assert linear_schedule(5, 1e-3, 10, 100, decay=False) == pytest.approx(5e-4)  # warm-up as before
    assert linear_schedule(10, 1e-3, 10, 100, decay=False) == linear_schedule(
        10**6, 1e-3, 10, 100, decay=False) == 1e-3  # then constant, past max_iters too


def test_masking_statistics_and_reproducibility():
    n_ordinary, mask_id, specials = 1000, 1003, [1000, 1001, 1002, 1003]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, n_ordinary, (512, 128), generator=g)
    x[:, 0], x[:, 60], x[:, -5:] = 1001, 1002, 1000  # [CLS], [SEP], trailing [PAD]
    inputs, targets, pos = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    sel = targets != -100
    assert pos.shape == (512 * round(0.15 * 128),)  # a static count: the head's rows
    assert torch.equal(torch.sort(pos).values, sel.view(-1).nonzero().squeeze(1))  # exactly the selected positions
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
    again = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    other = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(2))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
    assert not torch.equal(other[1], targets)


def test_masking_short_rows_select_only_real_tokens():
    x = torch.full((2, 40), 1000)  # mostly padding: fewer eligible tokens than the per-row count
    x[:, :3] = torch.tensor([5, 6, 7])
    _, targets, pos = dataloader.mask_tokens(x, 0.15, 1000, 1003, torch.Generator().manual_seed(0))
    assert ((targets != -100).sum(1) == 3).all()
    assert pos.numel() == 2 * 6 and (targets.view(-1)[pos] != -100).sum() == 6  # 3 padding rows per sequence


def test_frequency_only_loss_by_hand():
    """U, worked out by hand (as lib/jobs.py's unigram_loss), and the same from evenly spaced train blocks when the
    train split is larger than max_tokens."""
    # ordinary ids 0..3, specials 4..7; train: 0 x4, 1 x2, 2 x1, 3 x0 and specials; blocks of 4
    train = np.array([[6, 0, 0, 0], [0, 1, 1, 2], [7, 4, 4, 4], [4, 4, 4, 4]], dtype=np.uint16)
    val = np.array([[6, 0, 1, 3], [7, 4, 4, 4]], dtype=np.uint16)
    p = np.array([5, 3, 2, 1]) / 11  # add-one smoothed counts of 0..3
    assert dataloader.frequency_only_loss(train, val, 4) == pytest.approx(-np.log(p[[0, 1, 3]]).mean())
    u = dataloader.frequency_only_loss(train, val, 4, max_tokens=8)  # blocks 0 and 2: 0 x3
    assert u == pytest.approx(-np.log(np.array([4, 1, 1, 1])[[0, 1, 3]] / 7).mean())


def test_atomic_write_survives_crash_and_full_disk(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"iter_num": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("simulated crash while writing")

    with pytest.raises(RuntimeError, match="simulated crash"):
        checkpoint.save_checkpoint({"iter_num": 2, "w": torch.zeros(1000), "x": Boom()}, path)

    def full_disk(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(SystemExit, match=r"cannot write .*ckpt.pt: No space left on device; it is unchanged"):
        files.atomic_write(path, full_disk)
    assert torch.load(path, weights_only=True)["iter_num"] == 1  # the previous checkpoint is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # and no temporary file is left behind


def test_a_full_disk_inside_torch_save_is_one_line_and_stale_temporaries_go(tmp_path):
    import resource
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"iter_num": 1}, path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # a file may not grow past 100 kB: as a full disk
    try:  # torch's zip writer reports it as 'unexpected pos ...': the OSError is what reaches the user
        with pytest.raises(SystemExit, match=r"cannot write .*ckpt.pt: File too large; it is unchanged"):
            checkpoint.save_checkpoint({"iter_num": 2, "w": torch.zeros(100_000)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert os.listdir(tmp_path) == ["ckpt.pt"] and torch.load(path, weights_only=True)["iter_num"] == 1
    (tmp_path / "snapshots").mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"ckpt.pt.tmp.{dead.pid}", f"snapshots/ckpt_0000010.pt.tmp.{dead.pid}", "notes.tmp.txt",
                 "results.tmp.2", f"ckpt.pt.tmp.{os.getpid()}"):
        (tmp_path / name).write_bytes(b"x")
    files.remove_stale_temporaries(str(tmp_path), (r"ckpt\.pt",))
    files.remove_stale_temporaries(str(tmp_path / "snapshots"), (r"ckpt_\d+\.pt",))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", f"ckpt.pt.tmp.{os.getpid()}", "notes.tmp.txt",
                                            "results.tmp.2", "snapshots"]  # a live writer's and a user's: kept
    assert os.listdir(tmp_path / "snapshots") == []


def test_checkpoint_loader_checks(tmp_path):
    model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=8, n_inner=16, vocab_size=11, block_size=8))
    good = {"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 5}
    cases = {"garbage.pt": b"not a checkpoint", "other.pt": {"weights": 1}, "snapshot.pt": good,
             "nan.pt": {**good, "model": {**good["model"], "head_bias": torch.full((11,), float("nan"))}},
             "wrong.pt": {**good, "model_args": {**good["model_args"], "n_embd": 16, "n_inner": 16}}}
    for name, obj in cases.items():
        if isinstance(obj, bytes):
            (tmp_path / name).write_bytes(obj)
        else:
            torch.save(obj, tmp_path / name)
    for name, msg in (("garbage.pt", "not a readable checkpoint"), ("other.pt", "not a train.py checkpoint"),
                      ("nan.pt", "non-finite"), ("wrong.pt", "do not fit its model_args"), ("missing.pt", "no checkpoint")):
        with pytest.raises(SystemExit, match=msg):
            checkpoint.load_checkpoint(str(tmp_path / name))
    assert checkpoint.load_checkpoint(str(tmp_path / "snapshot.pt"))["iter_num"] == 5  # fine to fine-tune or export
    with pytest.raises(SystemExit, match="model-only snapshot: it cannot be resumed"):
        checkpoint.load_checkpoint(str(tmp_path / "snapshot.pt"), resume=True)


def test_dtype_follows_the_device(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # counts emulation: True on a V100 or T4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    assert device.resolve_dtype("auto", "cpu")[0] == "float32" and device.resolve_dtype("auto", "mps")[0] == "float32"
    assert device.resolve_dtype("auto", "cuda")[0] == "float16"
    assert device.resolve_dtype("bfloat16", "cpu") == ("bfloat16", "as asked")  # what the user asked for stands
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    dtype, why = device.resolve_dtype("auto", "cpu")
    assert dtype == "bfloat16" and "natively" in why and "--dtype=float32" in why
    assert device.resolve_dtype("auto", "mps")[0] == "float32" and device.resolve_dtype("float32", "cpu")[0] == "float32"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # Ampere and later
    assert device.resolve_dtype("auto", "cuda") == ("bfloat16", "auto: the GPU computes bf16 natively (compute "
                                                                 "capability 8.0)")
    with pytest.raises(SystemExit, match="dtype must be"):
        device.resolve_dtype("fp8", "cuda")


@pytest.mark.parametrize("name,dtype,tflops", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4), ("NVIDIA H100 80GB HBM3", "float32", 494.7),  # TF32, not bf16
    ("NVIDIA H100 NVL", "bfloat16", 835.5), ("NVIDIA H100 PCIe", "float16", 756), ("NVIDIA A10", "bfloat16", 125),
    ("NVIDIA A100-SXM4-80GB", "float32", 156), ("NVIDIA A10G", "bfloat16", 0), ("NVIDIA GH200 480GB", "bfloat16", 0),
    ("NVIDIA L40S", "bfloat16", 362), ("NVIDIA L4", "bfloat16", 121), ("NVIDIA A40", "bfloat16", 149.7),
    ("NVIDIA RTX A4000", "bfloat16", 0), ("Tesla V100-SXM2-16GB", "float16", 125), ("Tesla T4", "bfloat16", 0)])
def test_gpu_peak_by_name_and_precision(name, dtype, tflops):
    """Datasheet peaks in the run's precision; an unknown GPU (or a look-alike name) gives 0: MFU left out."""
    assert device.gpu_peak_flops(name, dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("flags,native", [("fpu sse avx512f avx512bw avx512_bf16 avx512_vnni", True),
                                          ("fpu sse amx_bf16 amx_tile", True),
                                          ("fpu sse avx2 avx512f avx512bw avx512_vnni", False)])  # emulated bf16
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, flags, native):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert device.cpu_has_native_bf16(str(info)) is native
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd" + (" bf16 i8mm" if native else " asimddp") + "\n")
    assert device.cpu_has_native_bf16(str(arm)) is native
    assert device.cpu_has_native_bf16(str(tmp_path / "none")) is False  # not Linux: float32


FAULTS = """
import resource, sys, torch
from lib import device
if sys.argv[1] == "1":
    device.set_up("cpu", "float32")  # as every script that trains or times does
faults = []
for _ in range(30):  # a step's pattern: two large buffers made, written, freed
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.empty(16_000_000).fill_(1.0); b = torch.empty(8_000_000).fill_(2.0); del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(sum(faults[-8:]))  # the heap takes ~10 rounds to grow to what the pattern needs
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="not glibc: the allocator is left as it is")
def test_freed_memory_is_kept_on_a_cpu():
    """Once the heap has grown, a step's large buffers come back without page faults; by default glibc returns each
    to the kernel and every one faults again (how many depends on the page size, so compared, not counted)."""
    kept, default = (int(run_script("-c", FAULTS, flag).stdout) for flag in ("1", "0"))
    assert default > 100 and kept < default / 100


# ---- end to end, on the built-in corpus ---------------------------------------------------------------
@pytest.mark.parametrize("attention_type,dtype", [("original", "float32"), ("symmetric", "float32"),
                                                  ("pairwise", "float32"), ("hybrid", "float32"),
                                                  ("original", "bfloat16"), ("pairwise", "bfloat16")])
def test_loss_falls_for_each_operator(data_dir, tmp_path, attention_type, dtype):
    out = str(tmp_path / "out")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", f"--attention_type={attention_type}",
                  "--max_iters=30", "--eval_interval=15", "--checkpoint_interval=15", f"--dtype={dtype}")
    assert f"cpu, {dtype} (as asked)" in p.stdout
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


HEAT = ["--score_scale=8.0", "--score_scale_warmup=12", "--qk_lr_scale=0.5", "--qk_init_scale=2.0"]  # start or step


@pytest.mark.parametrize("dtype,extra", [("float32", []), ("bfloat16", []), ("float32", HEAT)])
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
    assert f"cpu, {dtype} (as asked)" in p.stdout and "not an exact continuation" not in p.stdout
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


def test_ddp_wraps_the_model_before_compiling_it(monkeypatch, tmp_path):
    """DDP, then compile (PyTorch's advice: the compiled graph is split at DDP's buckets, so the gradient all-reduce
    overlaps the backward); evals use the plain model, compiled on its own, without DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager"))  # the structure only
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        raw = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
        idx = torch.randint(0, 97, (2, 16))
        batch = (idx, torch.where(torch.rand(2, 16) < 0.3, idx, -100), None)
        model, ddp_model, eval_model = distribute_and_compile(raw, True, True, "cpu", 0, batch)
        assert isinstance(ddp_model, DDP) and ddp_model.module is raw
        assert model._orig_mod is ddp_model  # compiled around DDP, not DDP around a compiled model
        assert eval_model._orig_mod is raw
        model, ddp_model, eval_model = distribute_and_compile(raw, False, True, "cpu", 0, batch)
        assert ddp_model is None and model._orig_mod is raw and eval_model is model
    finally:
        dist.destroy_process_group()


def test_compiling_for_a_gpu_works_where_the_cpu_path_sets_inductor_options(monkeypatch):
    """compile_model's CPU-only branch imports an inductor module; a GPU run takes the other branch, which must still
    reach torch.compile (it once raised UnboundLocalError there, as the first GPU run showed)."""
    from lib.step import compile_model

    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: seen.append(m) or m)
    raw = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
    assert compile_model(raw, "cuda") is raw and compile_model(raw, "cpu") is raw and seen == [raw, raw]


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
    assert "Traceback" not in p.stderr
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
        assert os.listdir(f"{tmp_path}/out_{name}") == [".lock"], name  # refused before anything was written


def test_resume_refuses_another_architecture(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                  "--attention_type=pairwise", "--n_layer=3", check=False)
    one_line_error(p, "the settings ask for another model: n_layer 3 (checkpoint: 2), attention_type 'pairwise' "
                      "(checkpoint: 'original')")
    p = run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                  "--qk_lr_scale=8.0", check=False)  # other parameter groups: the optimizer state cannot fit
    one_line_error(p, "resume with the run's own qk_lr_scale (1.0)")
    run_train(*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--init_from=resume", "--max_iters=4")


@pytest.mark.parametrize("bad,msg", [("--mask_prob=0", "mask_prob must be in (0, 1)"),
                                     ("--mask_prob=0.001", "predicts no token"),
                                     ("--dropout=1.0", "dropout must be in [0, 1)"),
                                     ("--learning_rate=-1e-3", "learning_rate, eps and qk_lr_scale must be > 0"),
                                     ("--qk_lr_scale=0", "learning_rate, eps and qk_lr_scale must be > 0"),
                                     ("--score_scale_warmup=-1", "score_scale_warmup must be >= 0"),
                                     ("--init_from=last", "init_from must be"),
                                     ("--peak_flops=-1e12", "peak_flops, max_minutes and max_iters must be >= 0"),
                                     ("--target_loss=-1", "target_loss, peak_flops, max_minutes and max_iters must be >= 0"),
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


def test_help_lists_every_setting():
    p = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True)
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
    """The hint a finished run prints: a higher --max_iters with --init_from=resume, no config file needed."""
    cfg = tmp_path / "my.py"
    cfg.write_text(f'dataset = "{data_dir}"\nn_layer, n_head, n_embd, n_inner = 1, 2, 32, 64\nblock_size = 64\n'
                   'batch_size = 8\ngradient_accumulation_steps = 1\nlearning_rate = 1e-2\nwarmup_iters = 2\n'
                   'eval_interval = 2\neval_iters = 2\nlog_interval = 2\ncheckpoint_interval = 0\ncompile = False\n'
                   'max_iters = 4\n')
    out = str(tmp_path / "run")
    run_train(str(cfg), f"--out_dir={out}")
    p = run_train(f"--out_dir={out}", "--init_from=resume", "--max_iters=6")  # train.py's defaults would be bert-base
    assert "resuming" in p.stdout and "max_iters 4 -> 6" in p.stdout and "done: step 6" in p.stdout
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["config"]["dataset"] == data_dir and ckpt["config"]["batch_size"] == 8 and ckpt["iter_num"] == 6
    assert [r["step"] for r in read_log(out, "eval")] == [0, 2, 4, 6]


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
            "--max_iters=20", "--target_loss=10.7", "--min_iters=6", f"--out_dir={tmp_path}/r"]
    p = run_train(*args)
    evals = read_log(f"{tmp_path}/r", "eval")
    first = next(r["step"] for r in evals if r["loss"] <= 10.7)
    assert first < 6 and evals[-1]["step"] == 6, evals  # met before min_iters: stopped at the first eval after it
    assert "at or below target_loss" in p.stdout and "--target_loss=0" in p.stdout
    assert torch.load(f"{tmp_path}/r/ckpt.pt", weights_only=True)["iter_num"] == 6
    p = run_train(*args, "--init_from=resume")
    assert torch.load(f"{tmp_path}/r/ckpt.pt", weights_only=True)["iter_num"] == 6 and "done: step 6" in p.stdout
    p = run_train(*args, "--init_from=resume", "--target_loss=0")
    assert "not an exact continuation" not in p.stdout and read_log(f"{tmp_path}/r", "eval")[-1]["step"] == 20


def run_train_clocked(*args, tick=0.5):
    """train.py with a controlled budget clock: every training step takes exactly `tick` seconds of it."""
    code = ("import itertools, runpy, sys; from lib import step; c = itertools.count(); "
            f"step.clock = lambda: next(c) * {tick}; sys.argv = ['train.py'] + {list(args)!r}; "
            "runpy.run_path('train.py', run_name='__main__')")
    p = run_script("-c", code)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


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

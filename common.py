"""
What several scripts share, written once: the MLM masking, the schedule, precision, the optimizer step,
torch.compile, checkpoints and their checks, safe file writing, the out_dir lock, and reading train.py's log.
Every failure a user can cause ends in one line (SystemExit), never a traceback.
"""
import fcntl
import json
import math
import os
import socket
import warnings
from contextlib import nullcontext

import numpy as np
import torch

from model import Bert, BertClassifier, BertConfig


def oneline(e):
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


# ----------------------------------------------------------------------------- training pieces
def mask_tokens(x, mask_prob, n_ordinary, mask_id, generator):
    """BERT masking of a (B, T) block of token ids. Selects round(mask_prob * T) positions per row, uniformly
    among ordinary tokens (ids < n_ordinary: special tokens and padding are never selected); of those 80%
    become [MASK], 10% a random ordinary token, 10% stay. A fixed count per row (as in Cramming) keeps the
    number of predicted positions static for torch.compile. Returns (inputs, targets with -100 elsewhere,
    pos): pos are the flat positions of the selected rows (B * round(mask_prob * T) of them, sorted; a row
    with fewer ordinary tokens than that also lists unselected positions, whose target is -100)."""
    B, T = x.shape
    eligible = x < n_ordinary
    scores = torch.rand(B, T, generator=generator).masked_fill_(~eligible, -1.0)
    picked = scores.topk(round(mask_prob * T), dim=1).indices.sort(dim=1).values
    selected = torch.zeros_like(eligible).scatter_(1, picked, True) & eligible
    u = torch.rand(B, T, generator=generator)
    random_tokens = torch.randint(0, n_ordinary, (B, T), generator=generator)
    inputs = torch.where(selected & (u < 0.8), mask_id, x)
    inputs = torch.where(selected & (u >= 0.8) & (u < 0.9), random_tokens, inputs)
    pos = (picked + T * torch.arange(B)[:, None]).reshape(-1)
    return inputs, torch.where(selected, x, -100), pos


def linear_schedule(step, lr, warmup, total, decay=True):
    """Linear warm-up from 0 to lr over `warmup` steps, then linear decay to 0 at `total` (as the paper and the
    Hugging Face Trainer it ran: get_linear_schedule_with_warmup), or with decay=False constant at lr: then a
    run's past does not depend on its length, and it can be extended by a resume."""
    if step < warmup:
        return lr * step / warmup
    return lr * max(0.0, (total - step) / max(1, total - warmup)) if decay else lr


def cpu_has_native_bf16(cpuinfo="/proc/cpuinfo"):
    """True if this CPU computes bf16 matmuls in hardware (x86 AVX512-BF16 or AMX; Arm's BF16 extension on Linux):
    there a bf16 step is ~2x a float32 one. Elsewhere torch emulates bf16, slower than float32."""
    try:
        with open(cpuinfo) as f:
            flags = set(" ".join(line.split(":", 1)[1] for line in f if line.startswith(("flags", "Features"))).split())
    except OSError:  # not Linux (macOS, Windows): not detected, float32
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(dtype, device_type):
    """(dtype, why). 'auto' -> bfloat16 on a GPU that has it, float16 on an older GPU, bfloat16 on a CPU with
    native bf16, float32 elsewhere (an older CPU, MPS). What the user asks for stands."""
    if dtype == "auto":
        if device_type == "cuda":
            if torch.cuda.is_bf16_supported():
                return "bfloat16", "auto: the GPU has bf16"
            return "float16", "auto: the GPU has no bf16"
        if device_type == "cpu" and cpu_has_native_bf16():
            return "bfloat16", "auto: the CPU computes bf16 natively (--dtype=float32 for full precision)"
        return "float32", f"auto: no native bf16 on this {device_type.upper()}"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return dtype, "as asked"


def autocast(device_type, dtype):
    return nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))


def check_device(device):
    device_type, _, index = device.partition(":")
    n_gpu = torch.cuda.device_count() if device_type == "cuda" and torch.cuda.is_available() else 0
    if not ((device_type == "cpu" and not index) or (device_type == "mps" and torch.backends.mps.is_available()) or
            (device_type == "cuda" and n_gpu and (not index or (index.isdigit() and int(index) < n_gpu)))):
        raise SystemExit(f"device {device!r} is not available here: use cpu, cuda (cuda:0..cuda:{max(n_gpu - 1, 0)} "
                         "with a GPU) or mps")
    return device_type


def optimizer_step(optimizer, scaler, params, grad_clip):
    """Unscale (fp16), clip, step (the scaler skips a step whose gradients overflowed), zero the gradients."""
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def compile_model(model, device_type, batch=None, ctx=nullcontext()):
    """torch.compile. Compiling is lazy, so with a batch (inputs, targets, positions) it is tried at once on one
    forward and backward: a compiler that is missing or fails is then one line here, and the eager model is
    returned, instead of a traceback at the first step (torch._dynamo's suppress_errors does not cover a missing
    C++ compiler). The trial's gradients are dropped; it draws from the RNG (dropout)."""
    if device_type == "cpu":  # dropout from ATen's RNG inside compiled graphs: ~7% faster steps on CPU
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    compiled = torch.compile(model)
    if batch is None:
        return compiled
    try:
        with ctx:  # the autocast of the run: the graph compiled here is the one the steps use
            loss = compiled(*batch)[1]
        loss.backward()
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        print(f"torch.compile failed ({oneline(e)[:160]}); running eagerly", flush=True)
        return model
    finally:
        model.zero_grad(set_to_none=True)
    return compiled


def gpu_peak_flops(name):
    """Dense bf16 peak by GPU name (datasheet); MFU is reported against it."""
    for key, flops in (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
                       ("L40S", 362e12), ("L40", 181e12), ("A10", 125e12)):
        if key in name:
            return flops
    return 0.0


def all_finite(tensors):
    """True if every float tensor is free of NaN and inf: one host sync however many tensors."""
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


# ----------------------------------------------------------------------------- files
def atomic_write(path, write, mode="wb"):
    """Write a file whole or not at all: write(f) fills path.tmp.<pid>, which is flushed to disk and renamed over
    path. On any failure (a full disk, Ctrl-C) the temporary file is removed and path is as it was; a failure of
    the disk itself ends in one line."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SystemExit(f"cannot write {path}: {e.strerror or e}; it is unchanged") from None
        raise


def write_json(path, obj):
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1) + "\n"), mode="w")


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"cannot read {what} {path} ({oneline(e)}); it was left as it is")


def save_checkpoint(obj, path):
    def write(f):
        try:
            torch.save(obj, f)
        except RuntimeError as e:  # torch's writer reports a full disk as a RuntimeError: one line, as for OSError
            if "writ" in str(e) and "fail" in str(e):
                raise OSError(f"the write failed (a full disk?): {oneline(e)[:120]}") from None
            raise
    atomic_write(path, write)


def remove_stale_temporaries(path):
    """Removes the *.tmp.<pid> files that writes killed mid-way left in path (and path/snapshots): call it only
    while holding path's lock, so that no live writer owns them."""
    for folder in (path, os.path.join(path, "snapshots")):
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if ".tmp." in name and name.rsplit(".tmp.", 1)[1].isdigit():
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


# train.py settings that say how a run is made, not what it is: a resume or a study may differ in them
MACHINE_KEYS = ("init_from", "out_dir", "device", "dtype", "compile")


def load_checkpoint(path, resume=False):
    """A train.py checkpoint (or a finetune_glue.py classifier, which has num_labels), checked: readable, with a
    model that fits its model_args and finite weights (and, to resume, the optimizer state). Pickled code is
    never run (weights_only). Any problem: one line."""
    try:
        with warnings.catch_warnings():  # a refused file: our one line, not torch's warnings first
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"no checkpoint at {path}")
    except Exception as e:
        raise SystemExit(f"{path} is not a readable checkpoint ({oneline(e)})")
    if not isinstance(ck, dict) or not {"model", "model_args", "iter_num"} <= ck.keys():
        raise SystemExit(f"{path} is not a train.py checkpoint (it needs model, model_args and iter_num)")
    try:
        with torch.device("meta"):  # shapes only: no memory, no init
            cfg = BertConfig(**ck["model_args"])
            model = BertClassifier(cfg, ck["num_labels"]) if "num_labels" in ck else Bert(cfg)
            want = {k: v.shape for k, v in model.state_dict().items()}
        if want != {k: v.shape for k, v in ck["model"].items()}:
            raise ValueError("the weights do not fit its model_args")
    except (TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"{path}: {oneline(e)}")
    if not all_finite(ck["model"].values()):
        raise SystemExit(f"{path} holds non-finite (NaN/inf) weights: use an earlier snapshot")
    if resume and not {"optimizer", "rng", "config"} <= ck.keys():
        raise SystemExit(f"{path} is a model-only snapshot: it cannot be resumed (no optimizer state), but it can be "
                         "fine-tuned (finetune_glue.py --init_from=) or exported (export_hf.py --init_from=)")
    return ck


def load_dataset(data_dir, vocab_size, block_size):
    """(train, val, meta) of a prepare_oscar.py dataset: (N, block_size) uint16 memmaps, after checking every number
    the run relies on (meta.json, the model's vocab_size unless None, the files' sizes) before any compute. Any
    problem: one line."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise SystemExit(f"no dataset in {data_dir}: make it with `python prepare_oscar.py --source=... "
                         f"--out_dir={data_dir}` (the built-in corpus: `python prepare_oscar.py`)")
    meta, rebuild = read_json(path, "dataset metadata"), "rebuild it with prepare_oscar.py ... --overwrite=True"
    try:
        meta["special"]["mask"], min(meta["special"].values())
        if meta["vocab_size"] != (vocab_size or meta["vocab_size"]) or meta["block_size"] % block_size:
            raise SystemExit(f"{data_dir} was made for vocab_size {meta['vocab_size']} and blocks of "
                             f"{meta['block_size']}; the model has vocab_size {vocab_size} and block_size {block_size}, "
                             "which must divide the dataset's block size")
        data = []
        for split in ("train", "val"):
            file, want = os.path.join(data_dir, f"{split}.bin"), meta[f"{split}_blocks"] * meta["block_size"] * 2
            size = os.path.getsize(file) if os.path.exists(file) else None
            if meta.get("dtype", "uint16") != "uint16":
                raise SystemExit(f"{path} says dtype {meta['dtype']!r}; train.py reads uint16 token ids: {rebuild}")
            if size != want or want == 0:
                raise SystemExit(f"{file} {'is missing' if size is None else f'has {size} bytes'}, meta.json says "
                                 f"{want} bytes ({meta[f'{split}_blocks']} blocks of {meta['block_size']} uint16 "
                                 f"tokens): the dataset is incomplete or corrupt; {rebuild}")
            data.append(np.memmap(file, dtype=np.uint16, mode="r").reshape(-1, block_size))
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise SystemExit(f"{path} is incomplete ({oneline(e)}); {rebuild}")
    return data[0], data[1], meta


_held = {}  # out_dir -> file descriptor of its lock, held until the process exits


def lock_dir(path, who):
    """Creates path if needed and holds it for this process: an exclusive flock on path/.lock, whose text names
    the holder. The operating system releases it when the process ends in any way, so the lock of a dead
    process is free again. Another live holder: one line naming it."""
    if os.path.abspath(path) in _held:  # this process has it already
        return
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SystemExit(f"cannot use {path} as an output folder: {e.strerror}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 300).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise SystemExit(f"{path} is in use by {holder}: wait for it to end, or choose another output folder")
    os.ftruncate(fd, 0)
    os.write(fd, f"{who} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
    _held[os.path.abspath(path)] = fd


def unlock_dir(path):
    """Releases a lock_dir of this process before it ends (for use as a library)."""
    fd = _held.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)


def read_evals(run):
    """The eval records of a train.py run (its out_dir or log.jsonl), sorted by step. A half-written last line
    (a killed run) is skipped; anything else malformed is a one-line error."""
    path = os.path.join(run, "log.jsonl") if os.path.isdir(run) else run
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"cannot read {path} ({getattr(e, 'strerror', None) or e}): not a train.py out_dir?")
    evals = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line) if line.strip() else {}
        except ValueError:
            if n == len(lines):
                continue
            raise SystemExit(f"{path}, line {n}: not JSON; is this a train.py log.jsonl?")
        if isinstance(r, dict) and r.get("type") == "eval":
            if not isinstance(r.get("step"), int) or not isinstance(r.get("loss"), (int, float)) or \
                    not math.isfinite(r["loss"]):
                raise SystemExit(f"{path}, line {n}: an eval record needs a step and a finite loss")
            evals.append(r)
    if not evals:
        if lines and not any(line.strip().startswith("{") for line in lines):
            raise SystemExit(f"{path} is not JSON lines: is this a train.py log.jsonl?")
        raise SystemExit(f"{path} has no eval records: run train.py past its first eval_interval")
    return sorted(evals, key=lambda r: r["step"])


def first_step_below(evals, level):
    """The study's criterion: the first eval step whose loss is <= level (None if never)."""
    return next((r["step"] for r in evals if r["loss"] <= level), None)

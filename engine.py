"""
How a step runs: the device and its precision, torch.compile, the learning-rate schedule and the optimizer
step. Shared by every script that trains or times (train.py, finetune_glue.py, bench.py).
"""
import os
import sys
from contextlib import nullcontext

import torch

from configurator import oneline


# ----------------------------------------------------------------------------- device and precision
def check_device(device):
    device_type, _, index = device.partition(":")
    n_gpu = torch.cuda.device_count() if device_type == "cuda" and torch.cuda.is_available() else 0
    if not ((device_type == "cpu" and not index) or (device_type == "mps" and torch.backends.mps.is_available()) or
            (device_type == "cuda" and n_gpu and (not index or (index.isdigit() and int(index) < n_gpu)))):
        raise SystemExit(f"device {device!r} is not available here: use cpu, cuda (cuda:0..cuda:{max(n_gpu - 1, 0)} "
                         "with a GPU) or mps")
    return device_type


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


def set_up_processes(device, gradient_accumulation_steps):
    """One process, or one of several started by torchrun: (ddp, rank, local_rank, world, device, flag_group). Under
    torchrun the process group is made here (NCCL on GPUs, gloo on CPUs), each process takes its local GPU, and
    flag_group is a gloo side channel for the stop flag (no GPU sync)."""
    if int(os.environ.get("RANK", -1)) == -1:
        return False, 0, 0, 1, device, None
    import torch.distributed as dist

    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if gradient_accumulation_steps % world:
        raise SystemExit(f"train: gradient_accumulation_steps ({gradient_accumulation_steps}) must be a multiple of "
                         f"the number of processes ({world})")
    device = f"cuda:{local_rank}" if device.startswith("cuda") else device
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return True, rank, local_rank, world, device, dist.new_group(backend="gloo")


def set_up(device, dtype):
    """The device checked, the precision chosen, TF32 allowed for float32 matmuls on a GPU: (device_type, dtype,
    why, autocast context)."""
    device_type = check_device(device)
    if device_type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)  # RNG states and the device name are this GPU's
    dtype, why = resolve_dtype(dtype, device_type)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return device_type, dtype, why, autocast(device_type, dtype)


def one_line_out_of_memory(hint):
    """An out-of-memory error on the GPU ends in `hint`, one line, instead of a traceback."""
    def hook(kind, value, tb):
        if issubclass(kind, torch.OutOfMemoryError):
            print(hint, file=sys.stderr)
        else:
            sys.__excepthook__(kind, value, tb)
    sys.excepthook = hook


def gpu_peak_flops(name):
    """Dense bf16 peak by GPU name (datasheet); MFU is reported against it."""
    for key, flops in (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
                       ("L40S", 362e12), ("L40", 181e12), ("A10", 125e12)):
        if key in name:
            return flops
    return 0.0


# ----------------------------------------------------------------------------- compile, schedule, step
def compile_model(model, device_type, batch=None, ctx=nullcontext()):
    """torch.compile. Compiling is lazy, so with a batch (inputs, targets, positions) it is tried at once on one
    forward and backward: a compiler that is missing or fails is then one line here, and the eager model is
    returned, instead of a traceback at the first step (torch._dynamo's suppress_errors does not cover a missing
    C++ compiler). The trial's gradients are dropped; it draws from the RNG (dropout)."""
    if device_type == "cpu":  # dropout from ATen's RNG inside compiled graphs: faster steps on CPU
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


def linear_schedule(step, lr, warmup, total, decay=True):
    """Linear warm-up from 0 to lr over `warmup` steps, then linear decay to 0 at `total` (as the paper and the
    Hugging Face Trainer it ran: get_linear_schedule_with_warmup), or with decay=False constant at lr: then a
    run's past does not depend on its length, and it can be extended by a resume."""
    if step < warmup:
        return lr * step / warmup
    return lr * max(0.0, (total - step) / max(1, total - warmup)) if decay else lr


def set_lr(optimizer, lr):
    """The schedule's learning rate in every parameter group, times the group's own lr_scale if it has one."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def optimizer_step(optimizer, scaler, params, grad_clip):
    """Unscale (fp16), clip, step (the scaler skips a step whose gradients overflowed), zero the gradients."""
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

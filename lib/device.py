"""
Where a run computes: the device checked, the precision it computes in (bf16, fp16 or float32, by what the
hardware does natively), the processes of a torchrun job, and the GPU's datasheet peak for MFU. Shared by every
script that trains or times (train.py, finetune_glue.py, bench.py, sample.py).
"""
import ctypes
import os
import re
import sys
from contextlib import nullcontext

import torch


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


def resolve_dtype(dtype, device_type, asked="as asked"):
    """(dtype, why). 'auto' -> bfloat16 on a GPU that has it, float16 on an older GPU, bfloat16 on a CPU with
    native bf16, float32 elsewhere (an older CPU, MPS). Any other stands, and why is `asked` (a resume: "the run's")."""
    if dtype == "auto":
        if device_type == "cuda":  # by the compute capability: is_bf16_supported() also counts emulated bf16
            major, minor = torch.cuda.get_device_capability()
            if major >= 8:
                return "bfloat16", f"auto: the GPU computes bf16 natively (compute capability {major}.{minor})"
            return "float16", (f"auto: no native bf16 on this GPU (compute capability {major}.{minor} < 8.0): fp16 "
                               "with a loss scaler")
        if device_type == "cpu" and cpu_has_native_bf16():
            return "bfloat16", "auto: the CPU computes bf16 natively (--dtype=float32 for full precision)"
        return "float32", f"auto: no native bf16 on this {device_type.upper()}"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return dtype, asked


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


def set_up(device, dtype, oom_hint=None, asked="as asked"):
    """The device checked, the precision chosen, deterministic algorithms on a CPU (two runs of the same settings give
    the same numbers to the bit, compiled too), TF32 allowed for float32 matmuls on a GPU, and an out-of-memory
    error on the GPU made one line (oom_hint) if given: (device_type, dtype, why, autocast context, the GPU's
    datasheet peak FLOP/s in that precision or 0). asked: why a dtype other than auto (resolve_dtype)."""
    device_type = check_device(device)
    if device_type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)  # RNG states and the device name are this GPU's
    if device_type == "cpu":
        keep_freed_memory()
        # bit-reproducible runs: a compiled step adds the embedding's gradient (a scatter) with atomic adds, in whatever
        # order the threads come; in deterministic mode inductor calls ATen's ordered kernel instead. ATen's switch
        # alone: torch.use_deterministic_algorithms also imports inductor to set its flag (~3 s of every start on a
        # CPU, compiling or not); lib/step.compile_model sets that flag where inductor is loaded anyway
        torch._C._set_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # not needed for that, and it costs time
    dtype, why = resolve_dtype(dtype, device_type, asked)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if oom_hint:
        one_line_out_of_memory(oom_hint)
    peak = gpu_peak_flops(torch.cuda.get_device_name(), dtype) if device_type == "cuda" else 0.0
    return device_type, dtype, why, autocast(device_type, dtype), peak


def keep_freed_memory():
    """glibc hands freed blocks back to the kernel (those over 32 MiB at once, the heap's free top past a threshold),
    and the kernel page-faults and zeroes them again when the next step asks: the tied 30522 x 512 gradient and its
    bf16 copy at bert-small, the 50304-wide logits at the study's shape, 7-18% of a step (docs/performance.md).
    Served from the heap and kept there instead, as jemalloc or tcmalloc would (the usual advice for PyTorch on
    CPUs). Other C libraries (macOS, Windows, musl) are left as they are."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    if hasattr(libc, "mallopt"):
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no block of its own from the kernel
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: the heap's free top is kept up to 2 GiB


def one_line_out_of_memory(hint):
    """An out-of-memory error on the GPU ends in `hint`, one line, instead of a traceback."""
    def hook(kind, value, tb):
        if issubclass(kind, torch.OutOfMemoryError):
            print(hint, file=sys.stderr)
        else:
            sys.__excepthook__(kind, value, tb)
    sys.excepthook = hook


# Dense peaks from NVIDIA's datasheets, TFLOP/s per GPU (their sparsity figures halved): TF32 (what a float32 run's
# matmuls use here), fp16, bf16; 0: none, or not published (the AWS A10G, GH200). The first pattern found in
# torch.cuda.get_device_name() wins. The TF32 of H100 NVL and the H200s is half their bf16, as on every Hopper sheet.
GPU_PEAKS = ((r"H200 NVL", 417.5, 835.5, 835.5), (r"\bH200\b", 494.7, 989.5, 989.5),
             (r"H100 NVL", 417.5, 835.5, 835.5), (r"H100 PCIe", 378, 756, 756), (r"\bH100\b", 494.7, 989.4, 989.4),
             (r"\bB200\b", 1100, 2250, 2250), (r"\bA100\b", 156, 312, 312), (r"\bA10\b", 62.5, 125, 125),
             (r"RTX A6000", 77.4, 154.8, 154.8), (r"\bA40\b", 74.8, 149.7, 149.7), (r"\bL40S\b", 183, 362, 362),
             (r"\bL40\b", 90.5, 181, 181), (r"\bL4\b", 60, 121, 121), (r"V100S", 0, 130, 0),
             (r"V100-SXM", 0, 125, 0), (r"V100-PCIE", 0, 112, 0), (r"\bT4\b", 0, 65, 0))


def gpu_peak_flops(name, dtype):
    """The GPU's dense datasheet peak (FLOP/s) in the precision a run computes in (float32: TF32), or 0.0 if not
    known: MFU is then left out, not guessed (train.py --peak_flops= gives it)."""
    for pattern, *peaks in GPU_PEAKS:
        if re.search(pattern, name):
            return peaks[("float32", "float16", "bfloat16").index(dtype)] * 1e12
    return 0.0

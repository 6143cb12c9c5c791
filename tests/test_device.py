"""lib/device.py: the precision each device computes in, the GPU's datasheet peak, the CPU's allocator."""
import platform

import pytest
import torch

from conftest import run_script
from lib import device


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
import ctypes, resource, sys, torch
from lib import device
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                                               "keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "1":
    device.set_up("cpu", "float32")  # as every script that trains or times does
else:  # glibc's default thresholds, held: left alone it moves them as blocks come and go, and then whether a step
    libc.mallopt(-3, 128 * 1024)  # faults depends on what the process did before (M_MMAP_THRESHOLD)
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
faults, mapped, before = [], [], libc.mallinfo2().hblkhd
for _ in range(30):  # a step's pattern: two large buffers made, written, freed
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.empty(16_000_000).fill_(1.0); b = torch.empty(8_000_000).fill_(2.0)
    mapped.append(libc.mallinfo2().hblkhd - before)  # bytes in blocks of their own from the kernel (mmap)
    del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(sum(faults[-8:]), max(mapped))  # the heap takes ~10 rounds to grow to what they need
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or tuple(map(int, platform.libc_ver()[1].split(".")[:2])) <
                    (2, 33), reason="not glibc 2.33 or later: the allocator is left as it is, or no mallinfo2")
def test_freed_memory_is_kept_on_a_cpu():
    """A step's large buffers are served from the heap and stay there when freed, from the first step on, and so come
    back without page faults once the heap has grown; glibc's defaults map each from the kernel and unmap it at the
    free, and every page faults again (how many depends on the page size, so compared, not counted)."""
    (faults, mapped), (default, default_mapped) = (map(int, run_script("-c", FAULTS, flag).stdout.split())
                                                   for flag in ("1", "0"))
    assert mapped == 0 and default_mapped >= 96_000_000, (mapped, default_mapped)  # from the first step on
    assert default > 100 and faults < default / 100, (faults, default)  # the heap's free top is not trimmed


def test_a_cpu_is_made_deterministic_without_loading_the_compiler():
    """set_up turns ATen's deterministic mode on without importing inductor (torch.use_deterministic_algorithms does,
    to set inductor's own flag: ~3 s of every start on a CPU); compile_model sets that flag as the call would have."""
    code = ("import sys, torch\nfrom lib import device, step\ndevice.set_up('cpu', 'float32')\n"
            "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
            " 'torch._inductor' in sys.modules)\nstep.compile_model(torch.nn.Linear(2, 2), 'cpu')\n"
            "import torch._inductor.config as c\nprint(c.deterministic)")
    p = run_script("-c", code, fresh=True)  # a new interpreter: the tests' fork server has imported inductor
    assert p.stdout.split() == ["True", "True", "False", "True"], p.stderr[-2000:]

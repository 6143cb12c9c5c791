r"""
Times MLM pre-training steps (forward + backward + AdamW) for each attention_type, and Hugging Face
BertForMaskedLM (SDPA attention) on the same shape, vocabulary, batch and masking when `transformers`
is installed (it is not a requirement of this project), in each precision under the same autocast.

    python bench.py                                        # CPU: bert-small shape, seq 128, batch 8
    python bench.py --profile=True                         # and where each step's time goes, by category
    python bench.py --latency=1x128,32x512                 # forward-only latency of a classifier, per operator
    python bench.py --device=cuda --n_layer=12 --n_head=12 --n_embd=768 --n_inner=3072 \
        --block_size=512 --batch_size=32 --hf_modes=eager,compiled   # bert-base on a GPU, bf16
    python bench.py --attention_types=original,original+fused_qkv+compile_mode=max-autotune --json=run.json

A row is an attention type (or an HF mode) followed by settings, each '+key' (True) or '+key=value' (ROW_SETTINGS:
the speed levers of docs/performance.md, the vocabulary, the tokens per optimizer step), so that every lever is
timed beside the baseline in one run. --json writes the whole run: the device, torch, the shape, and per row its
settings, ms/step, tokens/s, MFU (its own FLOPs, and original BERT's at the same shape), the rates it reached.

Reports the median over `repeats` timings of `steps` steps each, after `warmup` steps (and compilation).
The repeats of all models and precisions are interleaved (model 1, 2, ..., 1, 2, ...), with a square matmul
of each precision among them. Two denominators for a step's FLOPs per second (Bert.flops_per_token): that
matmul's speed ("of the peak"), and the speed of the step's own matrix multiplications, each timed alone at its
shapes, strides and precision as the profiler recorded them in one step ("of its matmuls"): what a step made of
nothing else would reach. On an AVX-512 CPU the two are close; with AMX, small matmuls run far below a large one.
"""
if __name__ == "__main__":  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import datetime
import gc
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity

from configurator import comma_list, oneline
from lib.dataloader import mask_tokens, n_masked
from lib.device import autocast, gpu_peak_flops, resolve_dtype, set_up
from lib.files import check_replaceable, write_json
from lib.step import COMPILE_MODES, compile_model, prepare_optimizer
from model import ATTENTION_TYPES, SDPA_BACKENDS, Bert, BertClassifier, BertConfig, SelfAttention, set_kernels

# -----------------------------------------------------------------------------
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu, cuda, cuda:N or mps
dtypes = "auto"  # comma list of float32, bfloat16; auto: both on a CPU with native bf16, else what train.py's auto is
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048  # the paper's bert-small
vocab_size = 30522  # bert-base-uncased's, as Hugging Face BERT is usually run
block_size = 128  # sequence length
batch_size = 8  # sequences per step
mask_prob = 0.15  # fraction of positions predicted (where our MLM head runs)
attention_types = "original,symmetric,pairwise,additive,hybrid"  # ours, as a comma list; '+sub_ln' adds sub-layer norms
modes = "compiled"  # ours: 'eager', 'compiled' or both (train.py compiles by default)
hf_modes = "eager"  # BertForMaskedLM: 'eager' (as its users run it), 'compiled', both, or '' to skip
warmup, steps, repeats = 2, 2, 3  # untimed steps first, then repeats x steps timed per model
seq_lens = "256,1024"  # additive vs original at a fixed number of tokens per batch ('' to skip)
profile = False  # True (or --profile): also each step's time by category (torch.profiler), ours beside HF
latency = ""  # e.g. '1x128,32x512': forward-only latency of a classifier (eager) per attention type at these
             # batch x sequence shapes, instead of the training table (HybridBERT's inference claim)
json = ""  # also write the run to this JSON file: the device, the shape, every row's settings, times, rates and MFU
build_budget = 0.0  # seconds: a row not started within this much of the run is skipped (named in the output); 0 = none
attention_kernels = False  # also time SDPA alone at this shape under each backend, with and without dropout
profile_steps = 0  # steps profiled per row with --profile; 0 = steps x repeats
peak_flops = 0.0  # for MFU on a GPU; 0 = the GPU's datasheet peak in each precision (device.gpu_peak_flops)
matmul_size = 0  # the square matmul timed as each precision's peak; 0 = 2048 on a CPU, 8192 on a GPU
seed = 0  # initialisation and the batch
# -----------------------------------------------------------------------------
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CATEGORIES = (  # (category, name parts): the first that an op's name holds decides. Names of ATen ops, of the
    # kernels torch.compile fuses (cpp_fused_..., triton_...; they are named after what they fuse) and of CUDA's
    ("optimizer", ("adam", "foreach", "optimizer", "zero_")),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("attention", ("scaled_dot_product", "flash", "attention", "fmha", "softmax")),
    ("matmuls", MATMULS + ("aten::linear", "aten::matmul", "gemm", "cutlass", "xmma", "mkldnn")),
    # before the elementwise ops: a fused kernel holding the embedding's backward is its dense vocab x width gradient
    ("embedding", ("embedding", "index_select", "index_add", "index_put", "scatter", "gather")),
    ("norm, activation, dropout", ("layer_norm", "gelu", "dropout", "bernoulli", "rand", "tanh", "erf")),
    ("casts and copies", ("_to_copy", "copy_", "convert_element_type", "clone", "contiguous", "cat")),
)
TORCH_DTYPES = {"c10::BFloat16": torch.bfloat16, "float": torch.float32, "c10::Half": torch.float16}
# what '+key=value' may set in a row of attention_types (ours) or hf_modes (Hugging Face): default and which models
ROW_SETTINGS = {
    "sub_ln": (False, "ours"),  # HybridBERT's sub-layer LayerNorms
    "attention_dropout": (None, "ours"),  # None: dropout's 0.1 (the paper's); 0.0 shows what dropping it would buy
    "fused_qkv": (False, "ours"), "fused_loss": (False, "ours"),  # model.set_kernels
    "sdpa_backend": ("auto", "both"),  # auto, cudnn, flash, efficient, math (model.SDPA_BACKENDS), or fastest: the
    # one that ran SDPA fastest at this shape and dropout in this run (--attention_kernels' timings)
    "compile_mode": ("default", "both"),  # lib.step.COMPILE_MODES; a row with one is compiled
    "compile_optimizer": (False, "both"),  # torch.compile around AdamW's step (lib.step.prepare_optimizer)
    "vocab_size": (0, "both"),  # 0: the run's vocab_size (e.g. 30528: 30522 padded to a multiple of 64)
    "batch_size": (0, "both"), "accum": (1, "both"),  # tokens per optimizer step: batch x accum micro-steps x T
}


@dataclass
class Row:
    """One model in one precision and mode: what is timed, and what the run measured of it."""
    label: str
    dtype: str
    mode: str
    flops: float  # per step
    step: object  # the step function
    seconds: float = math.nan  # median per step
    memory: float = math.nan  # GiB: this model's own peak (GPU), the models built before it left out
    matmul_flops: float = math.nan  # of its matrix multiplications, as the profiler recorded them in one step
    matmul_seconds: float = math.nan  # the time they take, each timed alone at its shapes
    categories: dict = None  # ms per step by category (--profile)
    spec: str = ""  # as given: an attention type or HF mode, then '+key=value' settings
    settings: dict = None  # every ROW_SETTINGS value of this row, the defaults filled in
    tokens: int = 0  # per optimizer step
    flops_bert: float = 0.0  # per step: original BERT's at this shape, vocabulary and batch (comparable across rows)
    build_seconds: float = math.nan  # building, compiling and warming up
    attention_op: str = ""  # the SDPA op(s) the profiled step ran


def check_names(names, allowed, what):
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"bench: unknown {what} {', '.join(map(repr, bad))}: use a comma list of {', '.join(allowed)}")
    return names


def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def seconds_per_step(step, n=None):
    n = n or steps
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / n


def median_step_times(step_fns, warm=False):
    """Warm each up (this compiles) unless warm, then time them round-robin: median seconds per step of each."""
    for step in step_fns if not warm else []:
        for _ in range(warmup):
            step()
    times = [[] for _ in step_fns]
    for _ in range(repeats):
        for t, step in zip(times, step_fns):
            t.append(seconds_per_step(step))
    return [statistics.median(t) for t in times]


def make_batch(B, T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab_size - 4, (B, T), generator=g)  # ids >= vocab_size - 4 play the special tokens
    return [t.to(device) for t in mask_tokens(x, mask_prob, vocab_size - 4, vocab_size - 1, g)]


def parse_row(spec, heads, whose):
    """'original+fused_qkv+compile_mode=max-autotune' -> ('original', {every ROW_SETTINGS key: its value}). whose:
    'ours' or 'hf' (which settings apply); heads: the names allowed before the first '+'."""
    head, *parts = spec.split("+")
    check_names([head], heads, "attention type" if whose == "ours" else "hf mode")
    settings, given = {k: default for k, (default, _) in ROW_SETTINGS.items()}, {}
    for part in parts:
        key, eq, text = part.partition("=")
        default, models = ROW_SETTINGS.get(key, (None, ""))
        if models not in ("both", whose):
            known = [k for k, (_, m) in ROW_SETTINGS.items() if m in ("both", whose)]
            raise SystemExit(f"bench: unknown row setting {key!r} in {spec!r}: use '+key' or '+key=value' with a key "
                             f"of {', '.join(known)}")
        kind = float if key == "attention_dropout" else type(default)
        try:
            value = True if not eq and kind is bool else {"True": True, "False": False}[text] if kind is bool \
                else kind(text)
        except (KeyError, ValueError):
            raise SystemExit(f"bench: row {spec!r}: {key} must be {kind.__name__}, got {text!r}") from None
        if key in given:  # which one would the row's name stand for?
            raise SystemExit(f"bench: row {spec!r} sets {key} twice: give each setting once")
        settings[key] = given[key] = value
    bad = [f"sdpa_backend {settings['sdpa_backend']!r} (one of {', '.join(SDPA_BACKENDS)}, fastest)"
           ] if settings["sdpa_backend"] not in [*SDPA_BACKENDS, "fastest"] else []
    bad += [f"compile_mode {settings['compile_mode']!r} (one of {', '.join(COMPILE_MODES)})"
            ] if settings["compile_mode"] not in COMPILE_MODES else []
    bad += ["batch_size, accum and vocab_size must be >= 0 (accum >= 1)"] if min(
        settings["batch_size"], settings["vocab_size"], settings["accum"] - 1) < 0 else []
    bad += ["attention_dropout must be in [0, 1)"] if settings["attention_dropout"] is not None and not \
        0 <= settings["attention_dropout"] < 1 else []
    bad += ["vocab_size must be the run's or larger (the batch's ids are the run's)"] if \
        0 < settings["vocab_size"] < vocab_size else []
    if bad:
        raise SystemExit(f"bench: row {spec!r}: {'; '.join(bad)}")
    return head, settings


def config(attention_type, T=None, **settings):
    """attention_type may end in '+sub_ln' (HybridBERT's sub-layer LayerNorms) or other row settings; settings: a
    parsed row's."""
    name, settings = parse_row(attention_type, [*ATTENTION_TYPES], "ours") if not settings else \
        (attention_type, settings)
    return BertConfig(vocab_size=settings["vocab_size"] or vocab_size, block_size=max(512, T or block_size),
                      n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_inner=n_inner, attention_type=name,
                      sub_ln=settings["sub_ln"], attention_dropout=settings["attention_dropout"])


def ours(attention_type, T=None, settings=None):
    torch.manual_seed(seed)
    model = Bert(config(attention_type, T, **(settings or {}))).to(device)
    if settings:
        set_kernels(model, settings["fused_qkv"], settings["sdpa_backend"], settings["fused_loss"])
    opt = model.configure_optimizers(0.01, 1e-4, (0.9, 0.999), 1e-12, device.split(":")[0])
    return model, opt


def hugging_face(settings=None):
    from transformers import BertConfig as HFConfig, BertForMaskedLM  # ImportError: skipped by the caller

    torch.manual_seed(seed)
    cfg = HFConfig(vocab_size=(settings or {}).get("vocab_size") or vocab_size, hidden_size=n_embd,
                   num_hidden_layers=n_layer, num_attention_heads=n_head, intermediate_size=n_inner,
                   max_position_embeddings=max(512, block_size), layer_norm_eps=1e-12)
    model = BertForMaskedLM._from_config(cfg, attn_implementation="sdpa").to(device)
    # fused AdamW, as the Trainer's default ('adamw_torch_fused' since torch 2.8) and as ours
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-12, weight_decay=0.01,
                            fused=device.split(":")[0] in ("cuda", "cpu"))
    return model, opt


def train_step(model, opt, x, y, pos, hf=False, dtype="float32", accum=1, opt_step=None, sdpa_backend="auto"):
    """One optimizer step: accum forward and backward passes over the batch, then opt_step (default opt.step). HF's
    attention kernel is pinned around its step (ours pins it inside its forward: set_kernels)."""
    ctx = autocast(device.split(":")[0], dtype)
    opt_step = opt_step or opt.step
    pinned = hf and SDPA_BACKENDS[sdpa_backend] is not None and device.startswith("cuda")

    def step():
        with torch.nn.attention.sdpa_kernel([SDPA_BACKENDS[sdpa_backend]]) if pinned else nullcontext():
            for _ in range(accum):
                with ctx:
                    loss = model(input_ids=x, labels=y).loss if hf else model(x, y, pos)[1]
                (loss / accum if accum > 1 else loss).backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
    return step


def square_matmul(dtype, n):
    """A step function: one n x n matmul in dtype (2 n^3 FLOPs), the speed the precision can reach here."""
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    return lambda: torch.mm(a, b)


# ----------------------------------------------------------------------------- where a step's time goes
@contextmanager
def profiler(**settings):
    """torch.profiler.profile(**settings), without the two lines its C++ side writes to stderr each time in torch 2.13
    (`USDT:... profiler_start`, `... profiler_stop`): fd 2 goes to a temporary file for the block, and anything else
    written there comes back to stderr after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            with torch.profiler.profile(**settings) as prof:
                yield prof
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sys.stderr.write("".join(line for line in tmp.read().decode(errors="replace").splitlines(True)
                                     if not line.startswith("USDT:")))


def profiled(step, n=1):
    """n steps under torch.profiler, with the shapes, strides and dtypes of every op's inputs: (the profile, its wall
    seconds per step)."""
    with profiler(record_shapes=True, activities=[ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.startswith("cuda") else [])) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
    return prof, (time.perf_counter() - t0) / n


def category(name):
    name = name.lower()
    return next((c for c, parts in CATEGORIES if any(p in name for p in parts)), "other ops")


def by_category(prof, seconds, n):
    """ms per step by category over n profiled steps: each op's own time (GPU: its kernels'), and the rest of the
    profiled wall time (Python, dispatch, waiting: no op's)."""
    ms = defaultdict(float)
    for e in prof.key_averages():
        t = e.self_device_time_total if device.startswith("cuda") else e.self_cpu_time_total
        ms[category(e.key)] += t / 1e3 / n
    ms["outside any op"] = max(0.0, seconds * 1e3 - sum(ms.values()))
    return dict(ms)


def contiguous(shape):
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def matmul_flops(name, shapes):
    a, b = shapes[:2] if name in ("aten::mm", "aten::bmm") else shapes[1:3]  # addmm, baddbmm: (bias, a, b, ...)
    return 2 * (a[0] if len(a) == 3 else 1) * a[-2] * a[-1] * b[-1]


def matmuls_alone(prof, dtype):
    """(FLOPs, seconds) of a profiled step's matmuls, each distinct one (op, shapes, strides, dtype) timed alone and
    counted as often as the step runs it: what the step would take if it did nothing but its matmuls. A profiler
    that records no strides or dtypes (PyTorch < 2.12) gives contiguous inputs in the step's dtype."""
    n_in = {"aten::mm": 2, "aten::bmm": 2, "aten::addmm": 3, "aten::baddbmm": 3}  # then out=, beta, alpha
    calls = Counter()
    for e in prof.events():
        if e.name in MATMULS:
            shapes = tuple(map(tuple, e.input_shapes[:n_in[e.name]]))
            strides = getattr(e, "structured_input_strides", None)
            strides = tuple(map(tuple, strides[:n_in[e.name]])) if strides else tuple(map(contiguous, shapes))
            dtypes = getattr(e, "input_dtypes", None)
            calls[e.name, shapes, strides, TORCH_DTYPES.get(dtypes[1], torch.float32) if dtypes else getattr(torch, dtype)] += 1
    flops = seconds = 0.0
    for (name, shapes, strides, dtype), n in calls.items():
        args = [torch.empty_strided(s, st, dtype=dtype, device=device).normal_()
                for s, st in zip(shapes, strides)]
        op = {"aten::mm": torch.mm, "aten::addmm": torch.addmm, "aten::bmm": torch.bmm, "aten::baddbmm": torch.baddbmm}
        fn = lambda: op[name](*args)
        fn()
        calls_per_timing = max(1, int(0.02 / max(seconds_per_step(fn, 3), 1e-7)))  # ~20 ms a timing
        t = statistics.median(seconds_per_step(fn, calls_per_timing) for _ in range(3))
        flops, seconds = flops + n * matmul_flops(name, shapes), seconds + n * t
    return flops, seconds


# ----------------------------------------------------------------------------- the rows and their tables
def add_row(rows, label, dtype, mode, model, opt, x, y, pos, hf=False, flops=0.0, settings=None, flops_bert=0.0,
            spec=""):
    """Builds a row: compiles (as train.py does, in the row's compile mode), warms up, and reads its peak memory, its
    matmuls' rate and the SDPA op it runs."""
    on_gpu, settings = device.startswith("cuda"), settings or {k: d for k, (d, _) in ROW_SETTINGS.items()}
    t0 = time.perf_counter()
    if on_gpu:
        sync()
        before = torch.cuda.memory_allocated()  # the models built before this one stay allocated
        torch.cuda.reset_peak_memory_stats()
    device_type = device.split(":")[0]
    fwd = compile_model(model, device_type, mode=settings["compile_mode"]) if mode != "eager" else model
    opt_step = prepare_optimizer(opt, device_type, settings["compile_optimizer"], settings["compile_mode"])
    row = Row(label, dtype, mode, flops, train_step(fwd, opt, x, y, pos, hf, dtype, settings["accum"], opt_step,
                                                     settings["sdpa_backend"]),
              settings=settings, tokens=x.numel() * settings["accum"], flops_bert=flops_bert, spec=spec)
    for _ in range(warmup):
        row.step()
    sync()
    if on_gpu:
        row.memory = (torch.cuda.max_memory_allocated() - before) / 2 ** 30
    prof = profiled(row.step)[0]
    row.matmul_flops, row.matmul_seconds = matmuls_alone(prof, dtype)
    row.attention_op = ",".join(sorted({e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product")
                                        and not e.name.endswith("_backward")}))
    row.build_seconds = time.perf_counter() - t0
    rows.append(row)
    print(f"  ready: {label}, {dtype}, {mode} ({row.build_seconds:.0f} s)", flush=True)


def plan_rows(dtype_list):
    """[(dtype, hf, head, settings, mode, spec)] of every row asked for, HF's first, in the order given; a spec that
    cannot be built is one line here, before anything runs."""
    wanted = []
    for dtype in dtype_list:
        for spec in filter(None, hf_modes.split(",")):
            head, settings = parse_row(spec, ("eager", "compiled"), "hf")
            wanted.append((dtype, True, head, settings, head, spec))
        for spec in attention_types.split(","):
            head, settings = parse_row(spec, [*ATTENTION_TYPES], "ours")
            compiled_only = settings["compile_mode"] != "default"  # such a row is compiled, whatever modes says
            wanted += [(dtype, False, head, settings, mode, spec) for mode in
                       (["compiled"] if compiled_only else modes.split(","))]
    for dtype, hf, head, settings, mode, spec in wanted:
        if mode == "eager" and (settings["compile_mode"] != "default"):
            raise SystemExit(f"bench: row {spec!r} sets compile_mode but is run eagerly: drop it, or run it compiled")
    return wanted


clock = time.perf_counter  # the build budget's clock (a test puts a controlled one here)
STOP_REQUESTED = False  # set by a SIGTERM while the rows are built


def stop_building(signum, frame):
    global STOP_REQUESTED
    STOP_REQUESTED = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the run
    raise Stop(f"signal {signum}")


class Stop(Exception):
    """SIGTERM while the rows are built (a time limit): no more rows; those built are timed and reported."""


def fastest_backend(kernels, dropout):
    """The SDPA backend (not math) whose forward + backward ran fastest at this shape and dropout (the paper's 0.1
    unless 0.0 is asked for) in time_attention_kernels' timings; 'auto' if none ran."""
    p = 0.0 if dropout == 0.0 else 0.1
    ran = {n: k[f"{n}, dropout {p}"]["fwd_bwd_ms"] for n in SDPA_BACKENDS if n != "math"
           and "fwd_bwd_ms" in k.get(f"{n}, dropout {p}", {})} if (k := kernels) is not None else {}
    return min(ran, key=ran.get) if ran else "auto"


def build_rows(plan, start=None, skipped=None, failed=None, kernels=None):
    """The rows of plan_rows, built in order. A row not started within build_budget seconds of start is skipped, one
    that fails (an attention kernel that cannot take the input, out of memory) is left out: both are listed in
    skipped and failed ({'row': ..., 'why': ...}) and the run goes on with the rest; after a SIGTERM (Stop) no
    more rows are built. kernels: time_attention_kernels' timings, for sdpa_backend=fastest (timed here if None)."""
    rows, start = [], clock() if start is None else start
    skipped, failed = (skipped if skipped is not None else []), (failed if failed is not None else [])
    hf_missing, stopped = False, False
    for dtype, hf, head, settings, mode, spec in plan:
        mode = mode if mode == "eager" or settings["compile_mode"] == "default" else settings["compile_mode"]
        label = f"HF BertForMaskedLM (sdpa){spec[len(head):]}" if hf else f"ours, {spec}"
        name = f"{label}, {dtype}, {mode}"
        model, opt, n_built = None, None, len(rows)
        try:
            if hf and hf_missing:
                continue
            if build_budget and clock() - start > build_budget:
                skipped.append({"row": name, "why": f"the build budget ({build_budget:g} s) was spent"})
                print(f"  skipped: {name} (build budget spent)", flush=True)
                continue
            if stopped:
                skipped.append({"row": name, "why": "stopped (SIGTERM) before it was built"})
                continue
            if settings["sdpa_backend"] == "fastest":
                kernels = kernels if kernels is not None else time_attention_kernels(dtype)
                settings = {**settings, "sdpa_backend": fastest_backend(kernels, settings["attention_dropout"])}
                print(f"  {name}: sdpa_backend=fastest is {settings['sdpa_backend']} here", flush=True)
            B = settings["batch_size"] or batch_size
            x, y, pos = make_batch(B, block_size)
            tokens = x.numel() * settings["accum"]
            with torch.device("meta"):  # original BERT's FLOPs at this shape: the same count for every row
                bert = Bert(config("original", **{**settings, "vocab_size": 0, "sub_ln": False}))
                flops_bert = bert.flops_per_token(block_size, len(pos) / x.numel()) * tokens
            if hf:
                try:
                    model, opt = hugging_face(settings)
                except ImportError:
                    print("transformers is not installed: BertForMaskedLM is not timed (pip install transformers)")
                    hf_missing = True
                    continue
                with torch.device("meta"):  # the architecture of ours/original, the vocabulary head everywhere
                    flops = Bert(config("original", **{**settings, "sub_ln": False})).flops_per_token(
                        block_size, 1.0) * tokens
            else:
                model, opt = ours(head, settings=settings)
                if settings["fused_qkv"] and not any(isinstance(m, SelfAttention) for m in model.modules()):
                    settings = {**settings, "fused_qkv": False}  # what ran: additive layers have no q/k/v to fuse
                    print(f"  {name}: fused_qkv does nothing here (no query/key/value projections): recorded as "
                          "off", flush=True)
                flops = model.flops_per_token(block_size, len(pos) / x.numel()) * tokens
            add_row(rows, label, dtype, mode, model, opt, x, y, pos, hf=hf, flops=flops, settings=settings,
                    flops_bert=flops_bert, spec=spec)
        except Exception as e:  # noqa: BLE001  (out of memory too) the row is reported, the run goes on
            stopped = isinstance(e, Stop) or STOP_REQUESTED  # torch.compile may wrap what the handler raised
            if stopped and len(rows) > n_built:
                continue  # the signal came after this row was built: it stands
            why = "stopped (SIGTERM) while it was built" if stopped else oneline(e)[:300]
            (skipped if stopped else failed).append({"row": name, "why": why})
            print(f"  {'stopped' if stopped else 'FAILED'}: {name}: {why}", flush=True)
            del model, opt
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def rate(row):
    return row.matmul_flops / row.matmul_seconds if row.matmul_seconds else math.nan


def ms(seconds):
    """Milliseconds to three significant figures, so that numbers computed from a printed time agree with it."""
    x = seconds * 1e3
    return f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}" if x > 0 else "0"


def datasheet_peak(dtype, on_gpu):
    """FLOP/s for MFU: peak_flops if given, else the GPU's datasheet peak in this precision; 0.0: none known."""
    return peak_flops or (gpu_peak_flops(torch.cuda.get_device_name(), dtype) if on_gpu else 0.0)


def print_table(rows, peak, on_gpu):
    hf_eager = {r.dtype: r.seconds for r in rows if r.label.startswith("HF") and r.mode == "eager"}
    print(f"\n| model | dtype | mode | ms/step | tokens/s | vs HF eager, same dtype | of the peak | of its matmuls |"
          f"{' peak GiB | MFU |' if on_gpu else ''}\n|---|---|---|---|---|---|---|---|{'---|---|' if on_gpu else ''}")
    for r in rows:
        ratio = f"{hf_eager[r.dtype] / r.seconds:.2f}x" if r.dtype in hf_eager else "-"
        mfu = datasheet_peak(r.dtype, on_gpu)
        gpu = f" {r.memory:.1f} | {f'{r.flops / r.seconds / mfu:.1%}' if mfu else '-'} |" if on_gpu else ""
        print(f"| {r.label} | {r.dtype} | {r.mode} | {ms(r.seconds)} | {r.tokens / r.seconds:,.0f} | {ratio} | "
              f"{r.flops / r.seconds / peak[r.dtype]:.0%} | {r.flops / r.seconds / rate(r):.0%} |{gpu}")
    if len({r.dtype for r in rows}) > 1:
        print("\nbf16 over float32, per model: " + ", ".join(
            f"{r.label.removeprefix('ours, ')} {r.seconds / q.seconds:.2f}x" for r in rows for q in rows
            if r.dtype == "float32" and q.dtype == "bfloat16" and r.label == q.label and r.mode == q.mode))
    print("\nthe rate each model's matmuls reach, each timed alone: " + ", ".join(
        f"{r.label.removeprefix('ours, ')} {r.dtype} {rate(r) / 1e9:,.0f}" for r in rows) + " GFLOP/s")
    print("\neach row's tokens per optimizer step, MFU at original BERT's FLOPs (the same count for every row at this "
          "shape: comparable throughput), its time to build (compile, warm up), and the SDPA op its step ran:\n")
    print("| # | row | dtype | mode | tokens/step | MFU at BERT's FLOPs | build s | SDPA op |\n"
          "|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        mfu = datasheet_peak(r.dtype, on_gpu)
        print(f"| #{i} | {r.label} | {r.dtype} | {r.mode} | {r.tokens:,} | "
              f"{f'{r.flops_bert / r.seconds / mfu:.1%}' if mfu else '-'} | {r.build_seconds:.0f} | "
              f"{r.attention_op.replace('aten::_scaled_dot_product_', '') or '-'} |")


def print_profile(rows):
    """Each step's time by category (ms, and the share of its profiled total), the models side by side."""
    n = profile_steps or steps * repeats
    for r in rows:
        r.categories = by_category(*profiled(r.step, n), n)
    names = [c for c, _ in CATEGORIES] + ["other ops", "outside any op"]
    print(f"\nwhere a step's time goes (ms per step, torch.profiler over {n} steps each, which slows them "
          "a little; share of the profiled step in brackets)\n")
    print("| category | " + " | ".join(f"{r.label.removeprefix('ours, ')}, {r.dtype}, {r.mode}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name in names:
        cells = [f"{r.categories.get(name, 0.0):.1f} ({r.categories.get(name, 0.0) / sum(r.categories.values()):.0%})"
                 for r in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| *its matmuls alone, at its shapes* | " + " | ".join(ms(r.matmul_seconds) for r in rows) + " |")
    print("| *the step, timed* | " + " | ".join(ms(r.seconds) for r in rows) + " |")


def number(x):
    """JSON has no NaN: None instead."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def report(rows, peak, on_gpu, name, dtype_list, n_mm, skipped, failed, kernels):
    """The run as one JSON object (--json): where, when and what, then one entry per row."""
    def row(r):
        mfu = datasheet_peak(r.dtype, on_gpu)
        return {"model": "hf" if r.label.startswith("HF") else f"ours-{r.spec.split('+')[0]}", "spec": r.spec,
                "label": r.label, "mode": r.mode, "dtype": r.dtype,
                "settings": {**r.settings, "attention_dropout": r.settings["attention_dropout"]
                             if r.settings["attention_dropout"] is not None else 0.1,  # dropout's, the paper's
                             "vocab_size": r.settings["vocab_size"] or vocab_size,
                             "batch_size": r.settings["batch_size"] or batch_size},
                "tokens_per_step": r.tokens, "ms_per_step": number(r.seconds * 1e3),
                "tokens_per_s": number(r.tokens / r.seconds), "flops_per_step": r.flops,
                "mfu": number(r.flops / r.seconds / mfu) if mfu else None,
                "flops_per_step_bert": r.flops_bert,
                "mfu_bert": number(r.flops_bert / r.seconds / mfu) if mfu else None,
                "of_peak": number(r.flops / r.seconds / peak[r.dtype]),
                "of_its_matmuls": number(r.flops / r.seconds / rate(r)),
                "its_matmuls_flops_per_s": number(rate(r)), "peak_gib": number(r.memory),
                "build_s": number(r.build_seconds), "attention_op": r.attention_op,
                "ms_by_category": r.categories}

    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if on_gpu else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench.py " + " ".join(sys.argv[1:]),
            "shape": {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "n_inner": n_inner,
                      "block_size": block_size, "batch_size": batch_size, "vocab_size": vocab_size,
                      "mask_prob": mask_prob},
            "dtypes": dtype_list, "warmup": warmup, "steps": steps, "repeats": repeats,
            "matmul_size": n_mm, "matmul_peak_flops_per_s": {d: number(f) for d, f in peak.items()},
            "datasheet_peak_flops_per_s": {d: datasheet_peak(d, on_gpu) or None for d in dtype_list},
            "rows": [row(r) for r in rows], "skipped": skipped, "failed": failed, "attention_kernels": kernels,
            # as before: the ms per step of each of ours in the last precision, by spec
            "ms_per_step": {r.spec: r.seconds * 1e3 for r in rows
                            if r.label.startswith("ours") and r.dtype == dtype_list[-1]}}


def time_attention_kernels(dtype):
    """SDPA alone at the run's shape (batch_size x n_head x block_size x head size, the layout our model gives it:
    (B, T, nh, d) memory seen as (B, nh, T, d)), forward and forward + backward, under each backend, with the paper's
    dropout 0.1 and without: {'<backend>, dropout <p>': {fwd_ms, fwd_bwd_ms, tflops_fwd_bwd, op} or {error}}. FLOPs:
    4 B nh T^2 d forward, 2.5x that backward (it recomputes the scores), as flash attention counts them."""
    from torch.nn.attention import sdpa_kernel

    B, T, h, d = batch_size, block_size, n_head, n_embd // n_head
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, T, h, d, device=device, dtype=getattr(torch, dtype), generator=g).transpose(1, 2)
               .requires_grad_() for _ in range(3))
    grad = torch.randn_like(q)
    flops = 4 * B * h * T * T * d
    out = {}
    for name, backend in SDPA_BACKENDS.items():
        for p in (0.1, 0.0):
            def fwd(p=p):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)

            def fwd_bwd(p=p):
                torch.autograd.backward(fwd(p), grad)
            try:
                with sdpa_kernel([backend]) if backend is not None else nullcontext(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # why a kernel was not used: the error below says it
                    fwd_bwd()  # the first call: errors, set-up
                    with profiler() as prof:
                        fwd()
                    op = ",".join(sorted({e.name for e in prof.events()
                                          if e.name.startswith("aten::_scaled_dot_product")}))
                    n = max(1, int(0.02 / max(seconds_per_step(fwd_bwd, 2), 1e-7)))  # ~20 ms a timing
                    f = statistics.median(seconds_per_step(fwd, n) for _ in range(3))
                    fb = statistics.median(seconds_per_step(fwd_bwd, n) for _ in range(3))
                out[f"{name}, dropout {p}"] = {"fwd_ms": f * 1e3, "fwd_bwd_ms": fb * 1e3,
                                               "tflops_fwd_bwd": 3.5 * flops / fb / 1e12,
                                               "op": op.replace("aten::_scaled_dot_product_", "")}
            except Exception as e:  # noqa: BLE001  a backend that cannot take this input (or this device)
                out[f"{name}, dropout {p}"] = {"error": oneline(e)[:200]}
            q.grad = k.grad = v.grad = None
    print(f"\nSDPA alone, {dtype}, {B} x {h} heads x {T} x {d} (ms; TFLOP/s of forward + backward at 3.5x the "
          f"forward's {flops / 1e9:.1f} GFLOP):\n\n| backend, dropout | forward | forward + backward | TFLOP/s | op |\n"
          "|---|---|---|---|---|")
    for key, r in out.items():
        print(f"| {key} | " + (f"{r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {r['tflops_fwd_bwd']:.0f} | {r['op']} |"
                               if "error" not in r else f"- | - | - | {r['error'][:80]} |"))
    return out


def print_seq_len_scaling(dtype):
    """Additive attention is linear in T: its cost per token stays flat as T grows (original: quadratic part)."""
    lens = [int(t) for t in seq_lens.split(",")]
    n_tok = max(lens) * max(1, batch_size * block_size // max(lens))
    print(f"\nseq-len scaling, eager, {dtype}, {n_tok} tokens per batch: ms/step (relative to T={lens[0]})")
    print("| attention | " + " | ".join(f"T={t}" for t in lens) + " |\n|---|" + "---|" * len(lens))
    for attention_type in ("original", "additive"):
        fns = []
        for T in lens:
            x, y, pos = make_batch(n_tok // T, T)
            fns.append(train_step(*ours(attention_type, T), x, y, pos, dtype=dtype))
        times = median_step_times(fns)
        print(f"| {attention_type} | " + " | ".join(f"{t * 1e3:.0f} ({t / times[0]:.2f}x)" for t in times) + " |")


def print_latency(dtype):
    """Forward-only latency of a sequence classifier (the encoder, pooler and head: what a fine-tuned model runs),
    eager, under inference_mode, per attention type and batch x sequence shape; median ms of `repeats` timings."""
    shapes = [tuple(map(int, s.split("x"))) for s in latency.split(",")]
    types = attention_types.split(",")
    fns = {}
    for t in types:
        torch.manual_seed(seed)
        model = BertClassifier(config(t, max(T for _, T in shapes)), 2).to(device).eval()
        for B, T in shapes:
            x = torch.randint(0, vocab_size - 4, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)
            fns[(t, B, T)] = lambda m=model, x=x: m(x)

    with torch.inference_mode(), autocast(device.split(":")[0], dtype):
        times = dict(zip(fns, median_step_times(list(fns.values()))))
    print(f"\nforward-only latency, eager, {dtype}: ms per batch (relative to {types[0]})")
    print("| attention | " + " | ".join(f"{B} x {T}" for B, T in shapes) + " |\n|---|" + "---|" * len(shapes))
    for t in types:
        print(f"| {t} | " + " | ".join(f"{times[(t, B, T)] * 1e3:.1f} ({times[(t, B, T)] / times[(types[0], B, T)]:.2f}x)"
                                     for B, T in shapes) + " |")
    return {f"{t} {B}x{T}": times[(t, B, T)] * 1e3 for t, B, T in times}


def check_json_path(path):
    """--json, before any timing: nothing there, or a JSON run of bench.py's own (each one it ever wrote holds device,
    torch and ms_per_step or ms_per_forward), replaced by this run's; anything else is left as it is (one line)."""
    check_replaceable(path, lambda o: {"device", "torch"} <= o.keys() and bool(o.keys() & {"ms_per_step",
                                                                                       "ms_per_forward"}),
                      "bench", "JSON run of bench.py's", f"--json={path}")


def main():
    if json:
        check_json_path(json)
    for key in ("dtypes", "modes", "attention_types", "hf_modes", "seq_lens", "latency"):  # '': no HF, no scaling
        if globals()[key] or key in ("dtypes", "modes", "attention_types"):  # or latency table; each row once
            comma_list("bench", key, globals()[key])
    device_type, auto, why, _, _ = set_up(device, "auto")  # the device checked, TF32 on, the precision auto picks
    if dtypes == "auto":
        dtype_list = ["float32", "bfloat16"] if device_type == "cpu" and auto == "bfloat16" else [auto]
    else:
        dtype_list, why = [resolve_dtype(d, device_type)[0] for d in dtypes.split(",")], "as asked"
    if "float16" in dtype_list:
        raise SystemExit("bench: dtype float16 would need a GradScaler here: use bfloat16 or float32")
    check_names(modes.split(","), ("eager", "compiled"), "mode")
    plan = plan_rows(dtype_list)  # every row's spec checked (attention types, HF modes, settings)
    if min(batch_size, block_size, warmup, steps, repeats) < 1 or not 0 < mask_prob < 1 or matmul_size < 0 or \
            min(build_budget, profile_steps, peak_flops) < 0:
        raise SystemExit("bench: batch_size, block_size, warmup, steps and repeats must be >= 1, mask_prob in (0, 1), "
                         "matmul_size, build_budget, profile_steps and peak_flops >= 0")
    try:  # the shape every row and the latency table share: one that is no model is one line now
        config("original")
    except ValueError as e:
        raise SystemExit(f"bench: {e}")
    n = r"[1-9]\d*"  # shapes and lengths that would time nothing, or break mid-run, are refused now
    if latency and not re.fullmatch(rf"{n}x{n}(,{n}x{n})*", latency) or seq_lens and not re.fullmatch(rf"{n}(,{n})*",
                                                                                                      seq_lens):
        raise SystemExit(f"bench: latency must be a comma list of batch x sequence shapes such as 1x128,32x512, and "
                         f"seq_lens a comma list of lengths such as 256,1024; got {latency!r} and {seq_lens!r}")
    short = min([block_size] + ([int(t) for t in seq_lens.split(",")] if seq_lens and not latency else []))
    if not latency and n_masked(mask_prob, short) < 1:
        raise SystemExit(f"bench: mask_prob {mask_prob} predicts no position of a {short}-token sequence (the MLM "
                         f"head would run on nothing): raise it above {0.5 / short:.3g}")
    torch._dynamo.config.recompile_limit = 64  # every model here is one more compile of Bert.forward (default 8)
    if profile and device_type == "cpu":  # each kernel that torch.compile fuses shows in the profile by name
        from torch._inductor import config as inductor_config
        inductor_config.cpp.enable_kernel_profile = True
    on_gpu = device_type == "cuda"
    name = torch.cuda.get_device_name() if on_gpu else f"CPU, {torch.get_num_threads()} threads"
    n_mm = matmul_size or (8192 if on_gpu else 2048)
    print(f"device: {name}; torch {torch.__version__}; {', '.join(dtype_list)} ({why}); {n_layer} layers, {n_head} "
          f"heads, {n_embd} hidden, vocab {vocab_size}" + ("" if latency else f"; batch {batch_size} x {block_size} "
                                                                            f"tokens, {mask_prob:.0%} predicted"))
    if latency:
        out = print_latency(dtype_list[-1])
        if json:
            write_json(json, {"device": name, "torch": torch.__version__, "dtype": dtype_list[-1], "ms_per_forward": out})
        return
    start = clock()
    fastest = any(settings["sdpa_backend"] == "fastest" for _, _, _, settings, _, _ in plan)
    kernels = time_attention_kernels(dtype_list[-1]) if attention_kernels or fastest else None
    peak_fns = {dtype: square_matmul(dtype, n_mm) for dtype in dtype_list}
    for fn in peak_fns.values():
        fn()  # its first call sets the library up
    skipped, failed = [], []
    cleanly = signal.signal(signal.SIGTERM, stop_building)  # a time limit stops the building; what was built is
    try:  # reported
        rows = build_rows(plan, start, skipped, failed, kernels)
    finally:
        signal.signal(signal.SIGTERM, cleanly)  # then, as before it: one line (lib/interrupt.py), exit 143
    times = median_step_times([r.step for r in rows] + list(peak_fns.values()), warm=True)  # peaks interleaved
    for r, dt in zip(rows, times):
        r.seconds = dt
    peak = {dtype: 2 * n_mm ** 3 / dt for dtype, dt in zip(peak_fns, times[len(rows):])}  # each precision's FLOP/s
    print(f"\nmatmul peak here ({n_mm} x {n_mm}): " + ", ".join(f"{d} {f / 1e9:,.0f} GFLOP/s" for d, f in peak.items()))
    if rows:
        print_table(rows, peak, on_gpu)
    for what, items in (("skipped", skipped), ("FAILED", failed)):
        for item in items:
            print(f"{what}: {item['row']}: {item['why']}")
    write = (lambda: write_json(json, report(rows, peak, on_gpu, name, dtype_list, n_mm, skipped, failed, kernels))) \
        if json else (lambda: None)
    write()  # before the profile, which a time limit may cut short
    if profile and rows:
        print_profile(rows)
        write()
    if not rows:
        raise SystemExit("bench: no row was built")
    if seq_lens:
        print_seq_len_scaling(dtype_list[-1])


if __name__ == "__main__":
    from configurator import configure

    configure(globals())
    with interrupt.stops_cleanly("bench", "nothing was written (--json is written at the end)"):
        main()

"""
Times MLM pre-training steps (forward + backward + AdamW) for each attention_type, and Hugging Face
BertForMaskedLM (SDPA attention) on the same shape, vocabulary, batch and masking when `transformers`
is installed (it is not a requirement of this project), in each precision under the same autocast.

    python bench.py                                        # CPU: bert-small shape, seq 128, batch 8
    python bench.py --profile=True                         # and where each step's time goes, by category
    python bench.py --latency=1x128,32x512                 # forward-only latency of a classifier, per operator
    python bench.py --device=cuda --n_layer=12 --n_head=12 --n_embd=768 --n_inner=3072 \
        --block_size=512 --batch_size=32 --hf_modes=eager,compiled   # bert-base on a GPU, bf16

Reports the median over `repeats` timings of `steps` steps each, after `warmup` steps (and compilation).
The repeats of all models and precisions are interleaved (model 1, 2, ..., 1, 2, ...), with a square matmul
of each precision among them. Two denominators for a step's FLOPs per second (Bert.flops_per_token): that
matmul's speed ("of the peak"), and the speed of the step's own matrix multiplications, each timed alone at its
shapes, strides and precision as the profiler recorded them in one step ("of its matmuls"): what a step made of
nothing else would reach. On an AVX-512 CPU the two are close; with AMX, small matmuls run far below a large one.
"""
if __name__ == "__main__":  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import math
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity

from lib.dataloader import mask_tokens, n_masked
from lib.device import autocast, gpu_peak_flops, resolve_dtype, set_up
from lib.files import write_json
from lib.step import compile_model
from model import ATTENTION_TYPES, Bert, BertClassifier, BertConfig

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
json = ""  # also write the ms per step (or per forward) of each of ours to this JSON file
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


def config(attention_type, T=None):
    """attention_type may end in '+sub_ln' (HybridBERT's sub-layer LayerNorms)."""
    name, _, extra = attention_type.partition("+")
    return BertConfig(vocab_size=vocab_size, block_size=max(512, T or block_size), n_layer=n_layer, n_head=n_head,
                      n_embd=n_embd, n_inner=n_inner, attention_type=name, sub_ln=extra == "sub_ln")


def ours(attention_type, T=None):
    torch.manual_seed(seed)
    model = Bert(config(attention_type, T)).to(device)
    opt = model.configure_optimizers(0.01, 1e-4, (0.9, 0.999), 1e-12, device.split(":")[0])
    return model, opt


def hugging_face():
    from transformers import BertConfig as HFConfig, BertForMaskedLM  # ImportError: skipped by the caller

    torch.manual_seed(seed)
    cfg = HFConfig(vocab_size=vocab_size, hidden_size=n_embd, num_hidden_layers=n_layer, num_attention_heads=n_head,
                   intermediate_size=n_inner, max_position_embeddings=max(512, block_size), layer_norm_eps=1e-12)
    model = BertForMaskedLM._from_config(cfg, attn_implementation="sdpa").to(device)
    # fused AdamW, as the Trainer's default ('adamw_torch_fused' since torch 2.8) and as ours
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-12, weight_decay=0.01,
                            fused=device.split(":")[0] in ("cuda", "cpu"))
    return model, opt


def train_step(model, opt, x, y, pos, hf=False, dtype="float32"):
    ctx = autocast(device.split(":")[0], dtype)

    def step():
        with ctx:
            loss = model(input_ids=x, labels=y).loss if hf else model(x, y, pos)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def square_matmul(dtype, n):
    """A step function: one n x n matmul in dtype (2 n^3 FLOPs), the speed the precision can reach here."""
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    return lambda: torch.mm(a, b)


# ----------------------------------------------------------------------------- where a step's time goes
def profiled(step, n=1):
    """n steps under torch.profiler, with the shapes, strides and dtypes of every op's inputs: (the profile, its wall
    seconds per step)."""
    with torch.profiler.profile(record_shapes=True, activities=[ProfilerActivity.CPU] + (
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
def add_row(rows, label, dtype, mode, model, opt, x, y, pos, hf=False, flops=0.0):
    """Builds a row: compiles (as train.py does), warms up, and reads its peak memory and its matmuls' rate."""
    on_gpu = device.startswith("cuda")
    if on_gpu:
        sync()
        before = torch.cuda.memory_allocated()  # the models built before this one stay allocated
        torch.cuda.reset_peak_memory_stats()
    fwd = compile_model(model, device.split(":")[0]) if mode == "compiled" else model
    row = Row(label, dtype, mode, flops, train_step(fwd, opt, x, y, pos, hf, dtype))
    for _ in range(warmup):
        row.step()
    sync()
    if on_gpu:
        row.memory = (torch.cuda.max_memory_allocated() - before) / 2 ** 30
    row.matmul_flops, row.matmul_seconds = matmuls_alone(profiled(row.step)[0], dtype)
    rows.append(row)
    print(f"  ready: {label}, {dtype}, {mode}", flush=True)


def build_rows(dtype_list, x, y, pos):
    rows, tokens = [], x.numel()
    for dtype in dtype_list:
        for mode in filter(None, hf_modes.split(",")):
            try:
                model, opt = hugging_face()
            except ImportError:
                print("transformers is not installed: BertForMaskedLM is not timed (pip install transformers)")
                break
            with torch.device("meta"):  # same architecture as ours/original, vocabulary head at every position
                hf_flops = Bert(config("original")).flops_per_token(block_size, 1.0) * tokens
            add_row(rows, "HF BertForMaskedLM (sdpa)", dtype, mode, model, opt, x, y, pos, hf=True, flops=hf_flops)
        for attention_type in attention_types.split(","):
            for mode in modes.split(","):
                model, opt = ours(attention_type)
                add_row(rows, f"ours, {attention_type}", dtype, mode, model, opt, x, y, pos,
                        flops=model.flops_per_token(block_size, len(pos) / tokens) * tokens)
    return rows


def rate(row):
    return row.matmul_flops / row.matmul_seconds if row.matmul_seconds else math.nan


def ms(seconds):
    """Milliseconds to three significant figures, so that numbers computed from a printed time agree with it."""
    x = seconds * 1e3
    return f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}" if x > 0 else "0"


def print_table(rows, peak, tokens, on_gpu):
    hf_eager = {r.dtype: r.seconds for r in rows if r.label.startswith("HF") and r.mode == "eager"}
    print(f"\n| model | dtype | mode | ms/step | tokens/s | vs HF eager, same dtype | of the peak | of its matmuls |"
          f"{' peak GiB | MFU |' if on_gpu else ''}\n|---|---|---|---|---|---|---|---|{'---|---|' if on_gpu else ''}")
    for r in rows:
        ratio = f"{hf_eager[r.dtype] / r.seconds:.2f}x" if r.dtype in hf_eager else "-"
        mfu = peak_flops or gpu_peak_flops(torch.cuda.get_device_name(), r.dtype) if on_gpu else 0.0
        gpu = f" {r.memory:.1f} | {f'{r.flops / r.seconds / mfu:.1%}' if mfu else '-'} |" if on_gpu else ""
        print(f"| {r.label} | {r.dtype} | {r.mode} | {ms(r.seconds)} | {tokens / r.seconds:,.0f} | {ratio} | "
              f"{r.flops / r.seconds / peak[r.dtype]:.0%} | {r.flops / r.seconds / rate(r):.0%} |{gpu}")
    if len({r.dtype for r in rows}) > 1:
        print("\nbf16 over float32, per model: " + ", ".join(
            f"{r.label.removeprefix('ours, ')} {r.seconds / q.seconds:.2f}x" for r in rows for q in rows
            if r.dtype == "float32" and q.dtype == "bfloat16" and r.label == q.label and r.mode == q.mode))
    print("\nthe rate each model's matmuls reach, each timed alone: " + ", ".join(
        f"{r.label.removeprefix('ours, ')} {r.dtype} {rate(r) / 1e9:,.0f}" for r in rows) + " GFLOP/s")


def print_profile(rows):
    """Each step's time by category (ms, and the share of its profiled total), the models side by side."""
    for r in rows:
        r.categories = by_category(*profiled(r.step, steps * repeats), steps * repeats)
    names = [c for c, _ in CATEGORIES] + ["other ops", "outside any op"]
    print(f"\nwhere a step's time goes (ms per step, torch.profiler over {steps * repeats} steps each, which slows them "
          "a little; share of the profiled step in brackets)\n")
    print("| category | " + " | ".join(f"{r.label.removeprefix('ours, ')}, {r.dtype}, {r.mode}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name in names:
        cells = [f"{r.categories.get(name, 0.0):.1f} ({r.categories.get(name, 0.0) / sum(r.categories.values()):.0%})"
                 for r in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| *its matmuls alone, at its shapes* | " + " | ".join(ms(r.matmul_seconds) for r in rows) + " |")
    print("| *the step, timed* | " + " | ".join(ms(r.seconds) for r in rows) + " |")


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


def main():
    device_type, auto, why, _, _ = set_up(device, "auto")  # the device checked, TF32 on, the precision auto picks
    if dtypes == "auto":
        dtype_list = ["float32", "bfloat16"] if device_type == "cpu" and auto == "bfloat16" else [auto]
    else:
        dtype_list, why = [resolve_dtype(d, device_type)[0] for d in dtypes.split(",")], "as asked"
    if "float16" in dtype_list:
        raise SystemExit("bench: dtype float16 would need a GradScaler here: use bfloat16 or float32")
    check_names([t.removesuffix("+sub_ln") for t in attention_types.split(",")], ATTENTION_TYPES, "attention type")
    check_names(modes.split(","), ("eager", "compiled"), "mode")
    check_names([m for m in hf_modes.split(",") if m], ("eager", "compiled"), "hf mode")
    if min(batch_size, block_size, warmup, steps, repeats) < 1 or not 0 < mask_prob < 1 or matmul_size < 0:
        raise SystemExit("bench: batch_size, block_size, warmup, steps and repeats must be >= 1, mask_prob in (0, 1), "
                         "matmul_size >= 0")
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
    x, y, pos = make_batch(batch_size, block_size)
    peak_fns = {dtype: square_matmul(dtype, n_mm) for dtype in dtype_list}
    for fn in peak_fns.values():
        fn()  # its first call sets the library up
    rows = build_rows(dtype_list, x, y, pos)
    times = median_step_times([r.step for r in rows] + list(peak_fns.values()), warm=True)  # peaks interleaved
    for r, dt in zip(rows, times):
        r.seconds = dt
    peak = {dtype: 2 * n_mm ** 3 / dt for dtype, dt in zip(peak_fns, times[len(rows):])}  # each precision's FLOP/s
    print(f"\nmatmul peak here ({n_mm} x {n_mm}): " + ", ".join(f"{d} {f / 1e9:,.0f} GFLOP/s" for d, f in peak.items()))
    print_table(rows, peak, x.numel(), on_gpu)
    if json:
        write_json(json, {"device": name, "torch": torch.__version__, "shape": [batch_size, block_size],
                          "ms_per_step": {r.label.removeprefix("ours, "): r.seconds * 1e3 for r in rows
                                          if r.label.startswith("ours") and r.dtype == dtype_list[-1]}})
    if profile:
        print_profile(rows)
    if seq_lens:
        print_seq_len_scaling(dtype_list[-1])


if __name__ == "__main__":
    from configurator import configure

    configure(globals())
    with interrupt.stops_cleanly("bench", "nothing was written (--json is written at the end)"):
        main()

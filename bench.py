"""
Times MLM pre-training steps (forward + backward + AdamW) for each attention_type, and Hugging Face
BertForMaskedLM (SDPA attention) on the same shape, vocabulary, batch and masking when `transformers`
is installed (it is not a requirement of this project), in each precision under the same autocast.

    python bench.py                                        # CPU: bert-small shape, seq 128, batch 8
    python bench.py --device=cuda --n_layer=12 --n_head=12 --n_embd=768 --n_inner=3072 \
        --block_size=512 --batch_size=32 --hf_modes=eager,compiled   # bert-base on a GPU, bf16

Reports the median over `repeats` timings of `steps` steps each, after `warmup` steps (and compilation).
The repeats of all models and precisions are interleaved (model 1, 2, ..., 1, 2, ...), with a square matmul
of each precision among them: its speed, timed in the same run, is the peak each step is measured against
(the fraction of peak: FLOPs per step by Bert.flops_per_token over the matmul's FLOP/s).
"""
import statistics
import time

import torch

from dataloader import mask_tokens
from engine import autocast, compile_model, gpu_peak_flops, resolve_dtype, set_up
from model import ATTENTION_TYPES, Bert, BertConfig

# -----------------------------------------------------------------------------
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu, cuda, cuda:N or mps
dtypes = "auto"  # comma list of float32, bfloat16; auto: both on a CPU with native bf16, else what train.py's auto is
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048  # the paper's bert-small
vocab_size = 30522  # bert-base-uncased's, as Hugging Face BERT is usually run
block_size = 128  # sequence length
batch_size = 8  # sequences per step
mask_prob = 0.15  # fraction of positions predicted (where our MLM head runs)
attention_types = "original,symmetric,pairwise,additive,hybrid"  # ours, as a comma list
modes = "compiled"  # ours: 'eager', 'compiled' or both (train.py compiles by default)
hf_modes = "eager"  # BertForMaskedLM: 'eager' (as its users run it), 'compiled', both, or '' to skip
warmup, steps, repeats = 2, 2, 3  # untimed steps first, then repeats x steps timed per model
seq_lens = "256,1024"  # additive vs original at a fixed number of tokens per batch ('' to skip)
peak_flops = 0.0  # for MFU; 0 = the GPU's dense bf16 peak by name (engine.gpu_peak_flops)
matmul_size = 0  # the square matmul timed as each precision's peak; 0 = 2048 on a CPU, 8192 on a GPU
seed = 0  # initialisation and the batch
# -----------------------------------------------------------------------------


def check_names(names, allowed, what):
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"bench: unknown {what} {', '.join(map(repr, bad))}: use a comma list of {', '.join(allowed)}")
    return names


def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def seconds_per_step(step):
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


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
    return BertConfig(vocab_size=vocab_size, block_size=max(512, T or block_size), n_layer=n_layer, n_head=n_head,
                      n_embd=n_embd, n_inner=n_inner, attention_type=attention_type)


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


def matmul(dtype, n):
    """A step function: one n x n matmul in dtype (2 n^3 FLOPs), the speed the precision can reach here."""
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    return lambda: torch.mm(a, b)


if __name__ == "__main__":
    from configurator import configure

    configure(globals())
    device_type, auto, why, _ = set_up(device, "auto")  # the device checked, TF32 on, the precision auto picks
    if dtypes == "auto":
        dtype_list = ["float32", "bfloat16"] if device_type == "cpu" and auto == "bfloat16" else [auto]
    else:
        dtype_list, why = [resolve_dtype(d, device_type)[0] for d in dtypes.split(",")], "as asked"
    if "float16" in dtype_list:
        raise SystemExit("bench: dtype float16 would need a GradScaler here: use bfloat16 or float32")
    check_names(attention_types.split(","), ATTENTION_TYPES, "attention type")
    check_names(modes.split(","), ("eager", "compiled"), "mode")
    check_names([m for m in hf_modes.split(",") if m], ("eager", "compiled"), "hf mode")
    if min(batch_size, block_size, warmup, steps, repeats) < 1 or not 0 < mask_prob < 1 or matmul_size < 0:
        raise SystemExit("bench: batch_size, block_size, warmup, steps and repeats must be >= 1, mask_prob in (0, 1), "
                         "matmul_size >= 0")
    on_gpu = device.startswith("cuda")
    peak = peak_flops or (gpu_peak_flops(torch.cuda.get_device_name()) if on_gpu else 0.0)
    name = torch.cuda.get_device_name() if on_gpu else f"CPU, {torch.get_num_threads()} threads"
    n_mm = matmul_size or (8192 if on_gpu else 2048)
    print(f"device: {name}; torch {torch.__version__}; {', '.join(dtype_list)} ({why}); {n_layer} layers, {n_head} "
          f"heads, {n_embd} hidden, vocab {vocab_size}; batch {batch_size} x {block_size} tokens, {mask_prob:.0%} "
          f"predicted" + (f"; MFU against {peak / 1e12:.0f} TFLOP/s" if peak else ""))
    x, y, pos = make_batch(batch_size, block_size)
    tokens = batch_size * block_size
    rows, step_fns = [], []  # rows: [model, dtype, mode, peak memory, FLOPs per step], then seconds per step

    def add(label, dtype, mode, model, opt, hf=False, flops=0.0):
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        fwd = compile_model(model, device.split(":")[0]) if mode == "compiled" else model  # as train.py does
        step_fns.append(train_step(fwd, opt, x, y, pos, hf, dtype))
        for _ in range(warmup):  # compiles, and shows this model's peak memory
            step_fns[-1]()
        sync()
        rows.append([label, dtype, mode, torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan"), flops])
        print(f"  ready: {label}, {dtype}, {mode}", flush=True)

    peak_fns = {dtype: matmul(dtype, n_mm) for dtype in dtype_list}
    for fn in peak_fns.values():
        fn()  # its first call sets the library up
    for dtype in dtype_list:
        for mode in filter(None, hf_modes.split(",")):
            try:
                model, opt = hugging_face()
            except ImportError:
                print("transformers is not installed: BertForMaskedLM is not timed (pip install transformers)")
                break
            with torch.device("meta"):  # same architecture as ours/original, vocabulary head at every position
                hf_flops = Bert(config("original")).flops_per_token(block_size, 1.0) * tokens
            add("HF BertForMaskedLM (sdpa)", dtype, mode, model, opt, hf=True, flops=hf_flops)
        for attention_type in attention_types.split(","):
            for mode in modes.split(","):
                model, opt = ours(attention_type)
                add(f"ours, {attention_type}", dtype, mode, model, opt,
                    flops=model.flops_per_token(block_size, len(pos) / tokens) * tokens)
    times = median_step_times(step_fns + list(peak_fns.values()), warm=True)  # the peaks interleaved with the rest
    for row, dt in zip(rows, times):
        row.insert(3, dt)
    mm = {dtype: 2 * n_mm ** 3 / dt for dtype, dt in zip(peak_fns, times[len(rows):])}  # each precision's FLOP/s
    hf_eager = {r[1]: r[3] for r in rows if r[0].startswith("HF") and r[2] == "eager"}
    print(f"\nmatmul peak here: " + ", ".join(f"{d} {f / 1e9:,.0f} GFLOP/s" for d, f in mm.items()))
    print(f"\n| model | dtype | mode | ms/step | tokens/s | vs HF eager, same dtype | of the dtype's matmul peak |"
          f"{' peak GiB | MFU |' if on_gpu else ''}\n|---|---|---|---|---|---|---|{'---|---|' if on_gpu else ''}")
    for label, dtype, mode, dt, mem, flops in rows:
        ratio = f"{hf_eager[dtype] / dt:.2f}x" if dtype in hf_eager else "-"
        gpu = f" {mem:.1f} | {f'{flops / dt / peak:.1%}' if peak else '-'} |" if on_gpu else ""
        print(f"| {label} | {dtype} | {mode} | {dt * 1e3:.1f} | {tokens / dt:,.0f} | {ratio} | "
              f"{flops / dt / mm[dtype]:.0%} |{gpu}")
    if len(dtype_list) > 1:
        print("\nbf16 over float32, per model: " + ", ".join(
            f"{r[0].removeprefix('ours, ')} {r[3] / q[3]:.2f}x" for r in rows for q in rows
            if r[1] == "float32" and q[1] == "bfloat16" and r[0] == q[0] and r[2] == q[2]))

    if seq_lens:  # additive attention is linear in T: its cost per token stays flat as T grows
        lens = [int(t) for t in seq_lens.split(",")]
        n_tok = max(lens) * max(1, batch_size * block_size // max(lens))
        print(f"\nseq-len scaling, eager, {dtype_list[-1]}, {n_tok} tokens per batch: ms/step (relative to T={lens[0]})")
        print("| attention | " + " | ".join(f"T={t}" for t in lens) + " |")
        print("|---|" + "---|" * len(lens))
        for attention_type in ("original", "additive"):
            fns = []
            for T in lens:
                x, y, pos = make_batch(n_tok // T, T)
                fns.append(train_step(*ours(attention_type, T), x, y, pos, dtype=dtype_list[-1]))
            times = median_step_times(fns)
            print(f"| {attention_type} | " + " | ".join(f"{t * 1e3:.0f} ({t / times[0]:.2f}x)" for t in times) + " |")

"""
Masked-LM pre-training of BERT with the original, symmetric or pairwise attention operator.

    python train.py config/tiny_pair.py                       # a first look on a laptop CPU
    python train.py config/base_pair.py                       # one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/base_pair.py
    python train.py config/base_pair.py --init_from=resume    # continue from out_dir/ckpt.pt

Data: data/<dataset>/{train,val}.bin + meta.json from prepare_oscar.py. Masking is done here, per
micro-batch, from (seed, micro-batch index) alone, so a run is reproducible and resumable to the bit
and does not depend on the number of processes.
"""
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch

from model import Bert, BertConfig

# -----------------------------------------------------------------------------
# defaults (the paper's bert-base run); config/*.py and --key=value override them
out_dir = "out"
init_from = "scratch"  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
dataset = "builtin"  # a folder under data/ (or a path) made by prepare_oscar.py
# model
attention_type = "original"  # 'original' | 'symmetric' | 'pairwise' | 'additive' | 'hybrid'
hybrid_pattern = "original,additive"  # attention_type='hybrid': layer l uses entry l % len
sub_ln = False  # sub-layer LayerNorms (HybridBERT / Magneto)
n_layer, n_head, n_embd, n_inner = 12, 12, 768, 3072
block_size = 512  # sequence length; must divide the dataset's block size
dropout = 0.1
# masked LM
mask_prob = 0.15
# optimisation: global batch = batch_size * gradient_accumulation_steps (split across processes)
batch_size = 32
gradient_accumulation_steps = 8
max_iters = 200_000
learning_rate = 1e-4
warmup_iters = 10_000  # linear warm-up, then linear decay to 0 at max_iters
weight_decay = 0.01
beta1, beta2, eps = 0.9, 0.999, 1e-12
grad_clip = 1.0  # 0 disables (Hugging Face Trainer's default is 1.0)
# evaluation, logging, checkpoints
eval_interval = 250  # also writes out_dir/ckpt.pt
eval_iters = 20  # eval batches, a fixed set of held-out blocks with a fixed masking
log_interval = 10
checkpoint_interval = 1000  # kept model-only snapshots in out_dir/snapshots/ (0 = none)
seed = 1337
wandb_log = False
wandb_project = "symmetric-bert"
# system
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else (
    "float16" if torch.cuda.is_available() else "float32")
compile = True
peak_flops = 0.0  # device peak for the MFU estimate; 0 = guess from the GPU name (dense bf16)
# -----------------------------------------------------------------------------


def get_lr(it):
    """Linear warm-up from 0 to learning_rate, then linear decay to 0 at max_iters (as the paper)."""
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    return learning_rate * max(0.0, (max_iters - it) / max(1, max_iters - warmup_iters))


def mask_tokens(x, mask_prob, n_ordinary, mask_id, generator):
    """BERT masking of a (B, T) block of token ids. Selects round(mask_prob * T) positions per row, uniformly
    among ordinary tokens (ids < n_ordinary: special tokens and padding are never selected); of those 80%
    become [MASK], 10% a random ordinary token, 10% stay. A fixed count per row (as in Cramming) keeps the
    number of predicted positions static for torch.compile. Returns (inputs, targets with -100)."""
    B, T = x.shape
    eligible = x < n_ordinary
    scores = torch.rand(B, T, generator=generator).masked_fill_(~eligible, -1.0)
    picked = scores.topk(round(mask_prob * T), dim=1).indices
    selected = torch.zeros_like(eligible).scatter_(1, picked, True) & eligible
    u = torch.rand(B, T, generator=generator)
    random_tokens = torch.randint(0, n_ordinary, (B, T), generator=generator)
    inputs = torch.where(selected & (u < 0.8), mask_id, x)
    inputs = torch.where(selected & (u >= 0.8) & (u < 0.9), random_tokens, inputs)
    return inputs, torch.where(selected, x, -100)


def optimizer_step(optimizer, scaler, params, grad_clip):
    """Unscale (fp16), clip, step (the scaler skips a step whose gradients overflowed), zero the gradients."""
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def load_dataset(path, vocab_size, block_size):
    """(train, val) as (N, block_size) uint16 memmaps, after checking meta.json against the model config."""
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        raise SystemExit(f"train: no dataset in {path}: make it with `python prepare_oscar.py --source=... "
                         f"--out_dir={path}` (the built-in corpus: `python prepare_oscar.py`)")
    with open(meta_path) as f:
        meta = json.load(f)
    if meta["vocab_size"] != vocab_size:
        raise SystemExit(f"train: {path} was tokenised for vocab_size {meta['vocab_size']}, the model has "
                         f"{vocab_size}: re-run prepare_oscar.py or fix the config")
    if meta["block_size"] % block_size:
        raise SystemExit(f"train: block_size {block_size} must divide the dataset's block size "
                         f"{meta['block_size']}: use --block_size={meta['block_size']} or re-run prepare_oscar.py")
    data = [np.memmap(os.path.join(path, f"{s}.bin"), dtype=np.uint16, mode="r").reshape(-1, block_size)
            for s in ("train", "val")]
    if len(data[0]) < batch_size or len(data[1]) == 0:
        raise SystemExit(f"train: {path} has {len(data[0])} train / {len(data[1])} val blocks of {block_size}: "
                         f"prepare more data or use a batch_size <= {len(data[0])}")
    return data[0], data[1], meta


def save_checkpoint(obj, path):
    """Write, flush to disk, then rename: a crash mid-write never leaves a truncated file under `path`."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"train: no checkpoint at {path}: use --init_from=scratch to start a new run")
    except Exception as e:
        raise SystemExit(f"train: {path} is not a readable checkpoint ({type(e).__name__}); "
                         f"use a snapshot from {os.path.dirname(path)}/snapshots/ or start a new out_dir")


def compile_model(model, device_type):
    if device_type == "cpu":  # dropout from ATen's RNG inside compiled graphs: ~7% faster steps on CPU
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    return torch.compile(model)


def gpu_peak_flops(name):
    """Dense bf16 peak by GPU name (datasheet); MFU is reported against it."""
    for key, flops in (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
                       ("L40S", 362e12), ("L40", 181e12), ("A10", 125e12)):
        if key in name:
            return flops
    return 0.0


if __name__ == "__main__":
    from tqdm import tqdm

    from configurator import configure

    config = configure(globals())

    # ---- processes and devices ----
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        flag_group = dist.new_group(backend="gloo")  # a CPU side channel: the stop flag costs no GPU sync
        if gradient_accumulation_steps % world:
            raise SystemExit(f"train: gradient_accumulation_steps ({gradient_accumulation_steps}) must be a "
                             f"multiple of the number of processes ({world})")
    else:
        rank, world = 0, 1
    master = rank == 0
    accum = gradient_accumulation_steps // world  # micro-steps per process and optimizer step
    device_type = device.split(":")[0]
    if device_type not in ("cpu", "cuda", "mps") or (device_type == "cuda" and not torch.cuda.is_available()):
        raise SystemExit(f"train: device {device!r} is not available here: use cpu, cuda[:N] (with a GPU) or mps")
    if device_type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)  # RNG states and device name are this GPU's
    if min(batch_size, gradient_accumulation_steps, eval_interval, eval_iters, log_interval, max_iters) < 1:
        raise SystemExit("train: batch_size, gradient_accumulation_steps, eval_interval, eval_iters, "
                         "log_interval and max_iters must be at least 1")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"train: dtype must be float32, bfloat16 or float16, got {dtype!r}")
    ptdtype = getattr(torch, dtype)
    autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=ptdtype)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    out_dir = os.path.abspath(out_dir)
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    log_path = os.path.join(out_dir, "log.jsonl")

    # ---- model, optimizer, and the state of a previous run ----
    ckpt = None
    if init_from == "resume":
        ckpt = load_checkpoint(ckpt_path)
        model_args = ckpt["model_args"]  # the checkpoint decides the architecture
    elif init_from == "scratch":
        if os.path.exists(ckpt_path):
            raise SystemExit(f"train: {ckpt_path} exists: continue it with --init_from=resume, "
                             "or choose another out_dir (nothing is overwritten)")
        model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_inner=n_inner, block_size=block_size,
                          dropout=dropout, attention_type=attention_type, hybrid_pattern=hybrid_pattern,
                          sub_ln=sub_ln)
        try:
            model_args = asdict(BertConfig(**model_args))
        except ValueError as e:
            raise SystemExit(f"train: {e}")
    else:
        raise SystemExit(f"train: init_from must be 'scratch' or 'resume', got {init_from!r}")
    block_size = model_args["block_size"]
    train_data, val_data, meta = load_dataset(
        dataset if os.sep in dataset else os.path.join("data", dataset), model_args["vocab_size"], block_size)
    n_ordinary, mask_id = min(meta["special"].values()), meta["special"]["mask"]
    n_pred = batch_size * round(mask_prob * block_size)  # static number of head positions per micro-batch

    torch.manual_seed(seed + rank)
    model = Bert(BertConfig(**model_args)).to(device)
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), eps, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
    iter_num = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler.is_enabled() and ckpt["scaler"]:  # empty when the run was not fp16
            scaler.load_state_dict(ckpt["scaler"])
        iter_num = ckpt["iter_num"]
        changed = [f"{k} {ckpt['config'].get(k)!r} -> {config[k]!r}" for k in ("dataset", "batch_size",
                   "gradient_accumulation_steps", "max_iters", "learning_rate", "warmup_iters", "mask_prob", "seed",
                   "dtype") if ckpt["config"].get(k) != config[k]]
        if changed and master:
            print(f"resuming with changed settings ({', '.join(changed)}): not an exact continuation")
    raw_model = model
    if master:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{model_args['attention_type']} BERT, {n_params / 1e6:.2f}M parameters; {len(train_data):,} train / "
              f"{len(val_data):,} val blocks of {block_size}; {world} process(es) x {accum} micro-steps x "
              f"{batch_size} = {batch_size * gradient_accumulation_steps} sequences per step")

    # ---- data: a fresh permutation of the train blocks each epoch, indexed by global micro-batch ----
    perm_cache = {}

    def get_batch(it, micro):  # (needs batch_size <= len(train_data), checked in load_dataset)
        """Micro-batch `micro` (0..accum-1) of this process at step `it`: global micro-batch
        m = it * gradient_accumulation_steps + micro * world + rank, masked from (seed, m)."""
        m = it * gradient_accumulation_steps + micro * world + rank
        rows = np.arange(m * batch_size, (m + 1) * batch_size)
        epochs, offsets = np.divmod(rows, len(train_data))
        for e in np.unique(epochs):
            if e not in perm_cache:
                if len(perm_cache) >= 2:  # a batch spans at most two epochs
                    perm_cache.pop(min(perm_cache))
                perm_cache[e] = np.random.default_rng([seed, e]).permutation(len(train_data))
        idx = np.sort([perm_cache[e][o] for e, o in zip(epochs, offsets)])  # sorted: sequential memmap reads
        x = torch.from_numpy(train_data[idx].astype(np.int64))
        xm, y = mask_tokens(x, mask_prob, n_ordinary, mask_id, torch.Generator().manual_seed(seed * 1_000_003 + m))
        if device_type == "cuda":
            return xm.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return xm.to(device), y.to(device)

    # the eval set: the first eval_iters * batch_size val blocks, masked once with a fixed seed, so eval
    # losses are comparable across steps, runs, seeds and operators; each process takes every world-th batch
    n_eval = min(eval_iters * batch_size, len(val_data)) // batch_size * batch_size
    n_eval = n_eval or len(val_data)  # fewer val blocks than one batch: a single smaller batch
    eval_x = torch.from_numpy(val_data[:n_eval].astype(np.int64))
    eval_x, eval_y = mask_tokens(eval_x, mask_prob, n_ordinary, mask_id, torch.Generator().manual_seed(0))
    eval_batches = [(eval_x[i:i + batch_size], eval_y[i:i + batch_size]) for i in range(0, n_eval, batch_size)]

    @torch.no_grad()
    def evaluate():
        raw_model.eval()
        stats = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, predicted count
        for x, y in eval_batches[rank::world]:
            x, y = x.to(device), y.to(device)
            with autocast:
                # the compiled model without DDP's wrapper: no gradient sync to set up
                logits, loss = eval_model(x, y, n_pred=x.size(0) * round(mask_prob * block_size))
            t = y[y != -100]  # the head's rows come in this order, then padding rows (see Bert.forward)
            n = t.numel()
            stats += torch.tensor([loss.item() * n, (logits[:n].argmax(-1) == t).sum().item(), n],
                                  device=device, dtype=torch.float64)
        if ddp:
            dist.all_reduce(stats)
        raw_model.train()
        return (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()

    # ---- compile (falls back to eager with one line if the compiler is missing or fails) ----
    if compile:
        compiled = compile_model(model, device_type)
        try:  # compiling is lazy: run one throw-away micro-step now so a failure shows here
            x, y = get_batch(iter_num, 0)
            with autocast:
                compiled(x, y, n_pred=n_pred)[1].backward()
            model = compiled
        except torch.OutOfMemoryError:
            raise SystemExit(f"train: out of GPU memory at batch_size {batch_size}: lower it and raise "
                             "gradient_accumulation_steps (the global batch stays the same)")
        except Exception as e:
            if master:
                print(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); running eagerly")
        raw_model.zero_grad(set_to_none=True)
    eval_model = model
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    torch.manual_seed(seed + rank)  # dropout stream independent of the compile trial above
    if ckpt is not None:  # the exact RNG state of the interrupted run, for a bit-exact continuation
        rng = ckpt["rng"][rank] if len(ckpt["rng"]) == world else None
        if rng is not None:
            torch.set_rng_state(rng["cpu"])
            if device_type == "cuda" and rng.get("cuda") is not None:
                torch.cuda.set_rng_state(rng["cuda"])
        elif master:
            print(f"resuming with {world} processes instead of {len(ckpt['rng'])}: dropout RNG re-seeded")
        del ckpt

    # ---- records: a JSON-lines log (kept up to the resumed step) and optional wandb ----
    if master:
        os.makedirs(os.path.join(out_dir, "snapshots"), exist_ok=True)
        kept = []
        if init_from == "resume" and os.path.exists(log_path):
            with open(log_path) as f:
                for line in f:
                    try:
                        if json.loads(line)["step"] <= iter_num:
                            kept.append(line)
                    except (ValueError, KeyError):  # e.g. a line half-written when the run was killed
                        pass
        with open(log_path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(log_path + ".tmp", log_path)
        logf = open(log_path, "a")
        if wandb_log:
            try:
                import wandb
            except ImportError:
                raise SystemExit("train: wandb_log=True but wandb is not installed: pip install wandb")
            wandb.init(project=wandb_project, name=os.path.basename(out_dir), config=config)

    def log(record):
        logf.write(json.dumps(record) + "\n")
        logf.flush()
        if wandb_log:
            wandb.log(record, step=record["step"])

    def checkpoint(path, full=True):
        state = {"model": raw_model.state_dict(), "model_args": model_args, "iter_num": iter_num, "config": config}
        if full:  # everything needed to continue to the bit
            rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}
            rngs = [rng]
            if ddp:
                rngs = [None] * world
                dist.all_gather_object(rngs, rng)
            state.update(optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), rng=rngs)
        if master:
            save_checkpoint(state, path)

    stop_signal = []
    for sig in (signal.SIGTERM, signal.SIGINT):  # pre-emption: finish the step, save, exit
        signal.signal(sig, lambda signum, frame: stop_signal.append(signum))

    # ---- the training loop ----
    peak = peak_flops or (gpu_peak_flops(torch.cuda.get_device_name()) if device_type == "cuda" else 0.0)
    tokens_per_step = batch_size * block_size * gradient_accumulation_steps
    # a live bar on a terminal; plain lines in a batch job's log file
    bar = tqdm(total=max_iters, initial=iter_num, disable=not (master and sys.stderr.isatty()), dynamic_ncols=True)
    say = bar.write if not bar.disable else print
    x, y = get_batch(iter_num, 0)
    start_iter, stopping = iter_num, False
    last_good = ckpt_path if init_from == "resume" else None
    t0, t0_iter = time.time(), iter_num

    def check_finite(what, value):
        if not math.isfinite(value):
            raise SystemExit(f"train: {what} is {value} at step {iter_num}; last good checkpoint: "
                             f"{last_good or 'none'}. Try a lower learning_rate or dtype=bfloat16")

    while True:
        if iter_num % eval_interval == 0 or iter_num == max_iters:
            if iter_num != start_iter or init_from == "scratch":  # a resumed step was evaluated already
                eval_loss, eval_acc = evaluate()
                check_finite("eval loss", eval_loss)
                if master:
                    log({"type": "eval", "step": iter_num, "loss": eval_loss, "accuracy": eval_acc})
                    say(f"step {iter_num}: eval loss {eval_loss:.4f}, MLM accuracy {eval_acc:.4f}")
                if iter_num > 0:
                    checkpoint(ckpt_path)
                    last_good = ckpt_path
            t0, t0_iter = time.time(), iter_num  # throughput excludes evaluation
        if checkpoint_interval and iter_num % checkpoint_interval == 0 and iter_num > 0:
            checkpoint(os.path.join(out_dir, "snapshots", f"ckpt_{iter_num:07d}.pt"), full=False)
        if stopping:
            checkpoint(ckpt_path)
            if master:
                say(f"stopped by signal at step {iter_num}; saved {ckpt_path} (continue with --init_from=resume)")
        if iter_num >= max_iters or stopping:
            break

        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        train_loss = torch.zeros((), device=device)
        for micro in range(accum):
            if ddp:  # sync gradients only on the last micro-step
                model.require_backward_grad_sync = micro == accum - 1
            with autocast:
                _, loss = model(x, y, n_pred=n_pred)
                loss = loss / accum
            x, y = get_batch(iter_num, micro + 1) if micro + 1 < accum else get_batch(iter_num + 1, 0)  # prefetch
            scaler.scale(loss).backward()
            train_loss += loss.detach()
        optimizer_step(optimizer, scaler, raw_model.parameters(), grad_clip)
        iter_num += 1
        bar.update(1)

        if ddp:  # stop together as soon as any process was signalled (on CPU: no GPU sync)
            flag = torch.tensor([len(stop_signal)])
            dist.all_reduce(flag, group=flag_group)
            stopping = flag.item() > 0
        else:
            stopping = bool(stop_signal)
        if iter_num % log_interval == 0:  # the only host syncs of a step happen here
            if ddp:  # the mean loss over all processes
                dist.all_reduce(train_loss)
                train_loss /= world
            train_loss = train_loss.item()
            if not scaler.is_enabled():  # with fp16 the scaler skips overflowed steps: not fatal
                check_finite("loss", train_loss)
            tok_s = tokens_per_step * (iter_num - t0_iter) / (time.time() - t0)
            t0, t0_iter = time.time(), iter_num
            record = {"type": "train", "step": iter_num, "loss": train_loss, "lr": lr, "tokens_per_s": tok_s}
            if peak:  # per GPU: the tokens of one process against one GPU's peak
                record["mfu"] = raw_model.estimate_mfu(tok_s / world, block_size, n_pred / (batch_size * block_size),
                                                       peak)
            if master:
                log(record)
                stats = ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in ("type", "step"))
                if bar.disable:
                    print(f"step {iter_num}: {stats}", flush=True)
                else:
                    bar.set_postfix_str(stats)

    bar.close()
    if ddp:
        dist.destroy_process_group()

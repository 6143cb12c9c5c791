"""
Masked-LM pre-training of BERT with the original, symmetric or pairwise attention operator.

    python train.py config/tiny_pair.py                       # a first look on a laptop CPU
    python train.py config/base_pair.py                       # one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/base_pair.py
    python train.py config/base_pair.py --init_from=resume    # continue from out_dir/ckpt.pt
    python train.py --help                                    # every setting, with its default

The defaults below are the paper's bert-base run. Data: data/<dataset>/{train,val}.bin + meta.json from
prepare_oscar.py. Each micro-batch is drawn and masked from (seed, micro-batch index) alone (dataloader.py), so a run is
reproducible and resumable to the bit and does not depend on the number of processes. A run stopped by
SIGTERM/SIGINT saves first, then exits with 128 + the signal number; any other failure exits 1.
"""
import math
import os
import signal
import sys
import time


def _interrupted(signum, frame):  # until the loop takes over: a Ctrl-C while torch loads is one line
    print(f"train: interrupted by signal {signum} before training started", file=sys.stderr, flush=True)
    sys.stdout.flush()  # os._exit, not SystemExit: `import torch` swallows exceptions raised inside it and goes on;
    os._exit(128 + signum)  # nothing is saved before the loop, and the files written so far are atomic


signal.signal(signal.SIGINT, _interrupted)
signal.signal(signal.SIGTERM, _interrupted)

import torch
import torch.distributed as dist
from tqdm import tqdm

from configurator import check, configure
from dataloader import dataset_dir, eval_batches, load_dataset, n_masked, train_batch
from device import gpu_peak_flops, one_line_out_of_memory, set_up, set_up_processes
from model import Bert, BertConfig, diagnostics, score_change
from rundir import (all_finite, is_finished, lock_dir, open_log, open_run, remove_stale_temporaries,
                    save_checkpoint)
from step import distribute_and_compile, linear_schedule, optimizer_step, set_lr

# -----------------------------------------------------------------------------
out_dir = "out"  # checkpoints and log.jsonl go here
init_from = "scratch"  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
dataset = "oscar"  # a folder under data/ (or a path) made by prepare_oscar.py
# model
attention_type = "original"  # 'original' | 'symmetric' | 'pairwise' | 'additive' | 'hybrid'
hybrid_pattern = "original,additive"  # attention_type='hybrid': layer l uses entry l % len
sub_ln = False  # sub-layer LayerNorms (HybridBERT / Magneto)
s_init_std = 1.0  # pairwise: S ~ N(0, s_init_std^2) (the paper: 1.0; the study's ablation: 0.02)
symmetric_init = False  # original: the key starts as a copy of the query (the study's ablation)
score_scale = 1.0  # a fixed multiplier on the attention scores (the study's ablation: sqrt(d) for original)
freeze_s = False  # pairwise: S stays at its initialisation (the study's ablation)
qk_init_scale = 1.0  # query and key weights start with std 0.02 x this: scores x its square (start or step)
score_scale_warmup = 0  # heat treatment: score_scale anneals to 1 over this many steps (half-cosine); 0 = constant
n_layer, n_head, n_embd, n_inner = 12, 12, 768, 3072  # layers, heads, hidden size, MLP width
block_size = 512  # sequence length; must divide the dataset's block size
dropout = 0.1  # hidden and attention dropout
# masked LM
mask_prob = 0.15  # fraction of each sequence's tokens that is predicted
# optimisation: global batch = batch_size * gradient_accumulation_steps (split across processes)
batch_size = 32  # sequences per micro-batch and process
gradient_accumulation_steps = 8  # micro-batches per optimizer step, over all processes
max_iters = 200_000  # optimizer steps
learning_rate = 1e-4  # peak learning rate
warmup_iters = 10_000  # linear warm-up from 0, then linear decay to 0 at max_iters
decay_lr = True  # False: constant learning rate after the warm-up
target_loss = 0.0  # stop at the first eval at or after step min_iters whose loss is <= this (0: never)
min_iters = 0  # see target_loss
weight_decay = 0.01  # AdamW, on matrices and embeddings only
beta1, beta2, eps = 0.9, 0.999, 1e-12  # AdamW
grad_clip = 1.0  # max gradient norm (Hugging Face Trainer's default); 0 disables
qk_lr_scale = 1.0  # the query and key projections' learning rate x this, their weight decay / this (start or step)
# evaluation, logging, checkpoints
eval_interval = 250  # steps between evals
eval_iters = 312  # eval batches: a fixed set of held-out blocks with a fixed masking (312 x 32 ~ the paper's 10k)
log_interval = 10  # steps between train log records
save_interval = 1000  # steps between saves of out_dir/ckpt.pt, the full state (also at the end and on a signal)
checkpoint_interval = 1000  # steps between kept model-only snapshots in out_dir/snapshots/ (0 = none)
seed = 1337  # initialisation, data order, masking and dropout
wandb_log = False  # also log to Weights & Biases (pip install wandb)
wandb_project = "symmetric-bert"  # its project name
# system
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu, cuda, cuda:N or mps
dtype = "auto"  # float32, bfloat16 or float16 (GradScaler); auto: bf16, fp16 on old GPUs, float32 on old CPUs
compile = True  # torch.compile (falls back to eager, in one line, if it fails)
peak_flops = 0.0  # device peak for the MFU estimate; 0 = the GPU's datasheet peak in this precision, if known
# -----------------------------------------------------------------------------
given = set()  # the keys set by config files or --key=value
config = configure(globals(), given=given)
check("train", (init_from in ("scratch", "resume"), f"init_from must be 'scratch' or 'resume', got {init_from!r}"),
      (min(batch_size, gradient_accumulation_steps, eval_interval, eval_iters, log_interval, save_interval,
           max_iters) >= 1, "batch_size, gradient_accumulation_steps, eval_interval, eval_iters, log_interval, "
                            "save_interval and max_iters must be >= 1"),
      (0 < mask_prob < 1, f"mask_prob must be in (0, 1), got {mask_prob}"),
      (0 <= dropout < 1, f"dropout must be in [0, 1), got {dropout}"),
      (learning_rate > 0 and weight_decay >= 0 and grad_clip >= 0 and eps > 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1
       and qk_lr_scale > 0, "learning_rate, eps and qk_lr_scale must be > 0, weight_decay and grad_clip >= 0, beta1 "
                            "and beta2 in [0, 1)"),
      (warmup_iters >= 0 and checkpoint_interval >= 0, "warmup_iters and checkpoint_interval must be >= 0"),
      (min(n_layer, n_head, n_embd, n_inner, block_size) >= 1, "n_layer, n_head, n_embd, n_inner, block_size must be >= 1"))
one_line_out_of_memory(f"train: out of GPU memory at batch_size {batch_size}: lower it and raise "
                       "gradient_accumulation_steps (the global batch stays the same)")

# ---- the run: a new one, or the one in out_dir resumed with its own settings (rundir.open_run) ----
out_dir = os.path.abspath(out_dir)
ckpt_path, log_path = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "log.jsonl")
if int(os.environ.get("RANK", 0)) == 0:  # rank 0 holds it before anything in it is read
    lock_dir(out_dir, f"train.py {' '.join(sys.argv[1:])}"[:200])
    remove_stale_temporaries(out_dir)  # half-written checkpoints of killed runs: ours to remove now
ckpt, model_args, changed = open_run(out_dir, config, given)
globals().update({k: v for k, v in config.items() if k != "out_dir"})  # a resumed run's own settings

# ---- processes and devices ----
ddp, rank, local_rank, world, device, flag_group = set_up_processes(device, gradient_accumulation_steps)
master, accum = rank == 0, gradient_accumulation_steps // world  # accum: micro-steps per process and step
device_type, dtype, dtype_why, ctx = set_up(device, dtype)
config["dtype"] = dtype  # the precision in use is the one saved with the run

# ---- the model's data ----
block_size = model_args["block_size"]  # the model's (a resumed run's own)
n_pred = n_masked(mask_prob, block_size)  # positions predicted per sequence
if n_pred < 1:
    raise SystemExit(f"train: mask_prob {mask_prob} x block_size {block_size} predicts no token: raise mask_prob")
data_dir = dataset_dir(dataset)
try:
    train_data, val_data, meta = load_dataset(data_dir, model_args["vocab_size"], block_size)
except SystemExit as e:
    raise SystemExit(f"train: {e}")
if len(train_data) < batch_size:
    raise SystemExit(f"train: {data_dir} has {len(train_data)} train blocks of {block_size}: prepare more data or use "
                     f"a batch_size <= {len(train_data)}")
orders = {}  # the permutation of the train blocks of the current epochs


def get_batch(it, micro):
    """Micro-batch `micro` (0..accum-1) of this process at step `it`: global micro-batch
    it * gradient_accumulation_steps + micro * world + rank."""
    m = it * gradient_accumulation_steps + micro * world + rank
    batch = train_batch(train_data, m, batch_size, seed, mask_prob, meta["special"], orders)
    if device_type == "cuda":
        return [t.pin_memory().to(device, non_blocking=True) for t in batch]
    return [t.to(device) for t in batch]


evals = eval_batches(val_data, eval_iters, batch_size, mask_prob, meta["special"])  # each process takes every world-th

# ---- the model, its optimizer and the state of a resumed run ----
torch.manual_seed(seed + rank)  # DDP makes every process start from rank 0's weights
raw_model = Bert(BertConfig(**model_args)).to(device)
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), eps, device_type, qk_lr_scale)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
iter_num, last_eval, eval_loss, rng = 0, -1, None, None  # last_eval: the latest eval's step (a resume skips it)
probe = None  # (step, scores) of the latest eval: how fast the scores move (model.score_change)
if ckpt is not None:
    raw_model.load_state_dict(ckpt["model"])
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except ValueError as e:  # parameter groups of another qk_lr_scale
        raise SystemExit(f"train: {ckpt_path}'s optimizer state does not fit these settings ({e}): resume with the "
                         f"run's own qk_lr_scale ({ckpt['config'].get('qk_lr_scale', 1.0)})")
    if scaler.is_enabled() and ckpt.get("scaler"):  # empty when the run was not fp16
        scaler.load_state_dict(ckpt["scaler"])
    iter_num, last_eval, probe = ckpt["iter_num"], ckpt.get("last_eval", ckpt["iter_num"]), ckpt.get("probe")
    eval_loss = ckpt.get("eval_loss") if last_eval == iter_num else None  # a run stopped at target_loss stays so
    rng = ckpt["rng"][rank] if len(ckpt["rng"]) == world else None  # restored after compiling, which draws from it
    if master:
        print(f"resuming {ckpt_path} at step {iter_num:,} of {max_iters:,}", flush=True)
        if changed:
            print(f"resuming with changed settings ({', '.join(changed)}): not an exact continuation", flush=True)
        if rng is None:
            print(f"resuming with {world} processes instead of {len(ckpt['rng'])}: dropout RNG re-seeded", flush=True)
if master:
    os.makedirs(os.path.join(out_dir, "snapshots"), exist_ok=True)
    n_params = sum(p.numel() for p in raw_model.parameters())
    print(f"{model_args['attention_type']} BERT, {n_params / 1e6:.2f}M parameters; {len(train_data):,} train / "
          f"{len(val_data):,} val blocks of {block_size}; {world} process(es) x {accum} micro-steps x {batch_size} = "
          f"{batch_size * gradient_accumulation_steps} sequences per step; {device}, {dtype} ({dtype_why})", flush=True)
    if warmup_iters > max_iters:
        print(f"note: warmup_iters ({warmup_iters}) > max_iters ({max_iters}): the learning rate never reaches "
              f"{learning_rate:g}", flush=True)

# ---- DDP, then torch.compile (tried at once: a failing compiler is one line, then eager) ----
if compile and master:
    print("compiling the model (torch.compile): the first step takes a while", flush=True)
model, ddp_model, eval_model = distribute_and_compile(raw_model, ddp, compile, device_type, local_rank,
                                                      get_batch(iter_num, 0), ctx)
torch.manual_seed(seed + rank)  # dropout: the same stream whether or not a compile trial drew from it
if rng is not None:  # the RNG state of the interrupted run, for a bit-exact continuation
    torch.set_rng_state(rng["cpu"])
    if device_type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"])
del ckpt


@torch.no_grad()
def evaluate():
    """Eval loss and MLM accuracy over the eval set, and the plateau diagnostics of its first batch."""
    raw_model.eval()
    stats = torch.zeros(3, device=device, dtype=torch.float32 if device_type == "mps" else torch.float64)
    for x, y, pos in evals[rank::world]:
        x, y, pos = x.to(device), y.to(device), pos.to(device)
        with ctx:
            logits, loss = eval_model(x, y, pos)
        t = y.view(-1)[pos]
        n, correct = (t != -100).sum(), ((logits.argmax(-1) == t) & (t != -100)).sum()
        stats += torch.stack([loss.float() * n, correct.float(), n.float()]).to(stats.dtype)
    if ddp:
        dist.all_reduce(stats)
    diag = diagnostics(raw_model.encoder, evals[0][0].to(device))  # one batch, eager, float32
    raw_model.train()
    return (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item(), diag


# ---- records: log.jsonl (cut back to the resumed step) and optional wandb ----
if master:
    also = None
    if wandb_log:
        try:
            import wandb
        except ImportError:
            raise SystemExit("train: wandb_log=True but wandb is not installed: pip install wandb")
        wandb.init(project=wandb_project, name=os.path.basename(out_dir), config=config)
        also = lambda record: wandb.log(record, step=record["step"])
    log = open_log(log_path, iter_num if init_from == "resume" else None, also)
last_good = ckpt_path if init_from == "resume" else None


def stop(reason):
    hint = " or dtype=bfloat16 (float32's range)" if dtype == "float16" else ""
    raise SystemExit(f"train: {reason} at step {iter_num}; nothing was saved. Last good checkpoint: "
                     f"{last_good or 'none'}. Try a lower learning_rate{hint}")


def checkpoint(path, full=True):
    """Saves the model (and with full, everything needed to continue to the bit); never a non-finite one."""
    if not all_finite(raw_model.parameters()):
        stop("the weights are not finite (NaN/inf)")
    state = {"model": raw_model.state_dict(), "model_args": model_args, "iter_num": iter_num, "config": config,
             "last_eval": last_eval, "eval_loss": eval_loss, "probe": probe}
    if full:
        rng = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}
        rngs = [rng]
        if ddp:
            rngs = [None] * world
            dist.all_gather_object(rngs, rng)
        state.update(optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), rng=rngs)
    if master:
        save_checkpoint(state, path)


stop_signal = []  # from here on a signal finishes the step, saves and exits with 128 + its number
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, frame: stop_signal.append(signum))

# ---- the training loop ----
peak = peak_flops or (gpu_peak_flops(torch.cuda.get_device_name(), dtype) if device_type == "cuda" else 0.0)
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
bar = tqdm(total=max_iters, initial=iter_num, disable=not (master and sys.stderr.isatty()), dynamic_ncols=True)
say = bar.write if not bar.disable else lambda s: print(s, flush=True)  # live bar on a terminal; lines in a log file
x, y, pos = get_batch(iter_num, 0)
stopping, eval_acc, saved = 0, None, iter_num  # saved: the step of ckpt.pt
t0, t0_iter = time.time(), iter_num
while True:
    if stopping:  # save at once; an eval due at this step runs after the resume instead (see last_eval)
        checkpoint(ckpt_path)
        if master:
            say(f"stopped by signal {stopping} at step {iter_num}; saved {ckpt_path} (continue with --init_from=resume)")
        break
    raw_model.anneal_scores(iter_num)  # heat treatment: the scores' multiplier at this step (else nothing)
    if (iter_num % eval_interval == 0 or iter_num == max_iters) and last_eval != iter_num:
        eval_loss, eval_acc, diag = evaluate()
        scores = diag.pop("probe")
        if probe is not None:  # how fast the scores moved since the last eval
            diag["score_change"] = score_change(scores, probe[1], iter_num - probe[0])
        last_eval, probe = iter_num, (iter_num, scores)
        if not math.isfinite(eval_loss):
            stop(f"eval loss is {eval_loss}")
        if master:
            log({"type": "eval", "step": iter_num, "loss": eval_loss, "accuracy": eval_acc, **diag})
            say(f"step {iter_num}: eval loss {eval_loss:.4f}, MLM accuracy {eval_acc:.4f}, attention entropy "
                f"{' '.join(f'{e:.2f}' for e in diag['attn_entropy'])}, collapse {diag['collapse']:.2f}")
        t0, t0_iter = time.time(), iter_num  # throughput excludes evaluation
    finished = is_finished({"iter_num": iter_num, "last_eval": last_eval, "eval_loss": eval_loss}, config)
    if (iter_num % save_interval == 0 or finished) and saved != iter_num:  # the full state, to resume from
        checkpoint(ckpt_path)
        saved, last_good = iter_num, ckpt_path
        t0, t0_iter = time.time(), iter_num  # throughput excludes saving
    if checkpoint_interval and iter_num % checkpoint_interval == 0 and iter_num > 0:
        checkpoint(os.path.join(out_dir, "snapshots", f"ckpt_{iter_num:07d}.pt"), full=False)
    if finished:
        break  # at max_iters, or target_loss met at this eval

    lr = linear_schedule(iter_num, learning_rate, warmup_iters, max_iters, decay_lr)
    set_lr(optimizer, lr)
    train_loss = torch.zeros((), device=device)
    for micro in range(accum):
        if ddp:  # sync gradients only on the last micro-step
            ddp_model.require_backward_grad_sync = micro == accum - 1
        with ctx:
            loss = model(x, y, pos)[1] / accum
        x, y, pos = get_batch(iter_num, micro + 1) if micro + 1 < accum else get_batch(iter_num + 1, 0)  # prefetch
        scaler.scale(loss).backward()
        train_loss += loss.detach()
    optimizer_step(optimizer, scaler, raw_model.parameters(), grad_clip)
    iter_num += 1
    bar.update(1)

    stopping = max(stop_signal, default=0)
    if ddp:  # stop together as soon as any process was signalled (through a CPU side channel: no GPU sync)
        flag = torch.tensor([stopping])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=flag_group)
        stopping = int(flag.item())
    if iter_num % log_interval == 0:  # the loss is read (a host sync) only here
        if ddp:  # the mean loss over all processes
            dist.all_reduce(train_loss)
            train_loss /= world
        train_loss = train_loss.item()
        if not scaler.is_enabled() and not math.isfinite(train_loss):
            stop(f"the training loss is {train_loss}")
        if scaler.is_enabled() and scaler.get_scale() < 2 ** -6:  # fp16: every step overflows and is skipped
            stop(f"the fp16 loss scale collapsed to {scaler.get_scale():.2g} (the run diverged)")
        tok_s = tokens_per_step * (iter_num - t0_iter) / (time.time() - t0)
        t0, t0_iter = time.time(), iter_num
        record = {"type": "train", "step": iter_num, "loss": train_loss, "lr": lr, "tokens_per_s": tok_s}
        if peak:  # per GPU: the tokens of one process against one GPU's peak
            record["mfu"] = raw_model.estimate_mfu(tok_s / world, block_size, n_pred / block_size, peak)
        if master:
            log(record)
            stats = ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in ("type", "step", "time"))
            if bar.disable:
                print(f"step {iter_num}: {stats}", flush=True)
            else:
                bar.set_postfix_str(stats)

bar.close()
if ddp:  # every process waits for rank 0's save: none leaves early (torchrun would stop the others)
    dist.barrier(group=flag_group)
    dist.destroy_process_group()
if stopping:
    sys.exit(128 + stopping)  # a scheduler can tell a pre-empted run from a finished one
if master:
    rel = os.path.relpath(out_dir) if not os.path.relpath(out_dir).startswith("..") else out_dir
    print(f"done: step {iter_num}"
          + (f", eval loss {eval_loss:.4f}, MLM accuracy {eval_acc:.4f}" if eval_acc is not None else "")
          + (f" (at or below target_loss {target_loss})" if iter_num < max_iters else "") + f". In {rel}/: ckpt.pt "
          f"(the full state), log.jsonl (the curves), snapshots/ ({len(os.listdir(out_dir + '/snapshots'))} "
          "model-only)."
          f"\nnext: python sample.py --init_from={rel}/ckpt.pt --text='The [MASK] sat on the mat.'"
          f"\n      python finetune_glue.py --init_from={rel}/ckpt.pt --data_dir=<GLUE folder> --tasks=sst2,stsb"
          f"\n      python plot.py --runs={rel}    |    python export_hf.py --init_from={rel}/ckpt.pt --out_dir=hf/"
          f"{os.path.basename(out_dir)}\n      to train further: a higher --max_iters with --init_from=resume"
          + (" --target_loss=0" if target_loss else ""))

"""
Masked-LM pre-training of BERT with the original, symmetric or pairwise attention operator.

    python train.py config/tiny_pair.py                       # a first look on a laptop CPU
    python train.py config/base_pair.py                       # one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/base_pair.py
    python train.py config/base_pair.py --init_from=resume    # continue from out_dir/ckpt.pt
    python train.py --help                                    # every setting, with its default

The defaults below are the paper's bert-base run. Data: data/<dataset>/{train,val}.bin + meta.json from
prepare_oscar.py, whose vocab_size a new model takes. Each micro-batch is drawn and masked from (seed, micro-batch
index) alone (lib/dataloader.py), so a run does not depend on the number of processes. On a CPU a run is reproducible
and resumable to the bit: the same settings on the same machine, torch version and thread count log the same losses,
compiled or eager, bf16 or float32 (lib/device.py: deterministic algorithms). Not on a GPU (some kernels add in a
non-deterministic order), nor with max_minutes (its schedule follows the clock): docs/training.md. A run stopped by
SIGTERM/SIGINT saves first, then exits with 128 + the signal number; any other failure exits 1 (lib/run.py).
"""
from lib import interrupt  # noqa: F401  first: a Ctrl-C while torch loads is one line (lib/interrupt.py)
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from configurator import check, configure
from lib.dataloader import PretrainingData
from lib.device import set_up, set_up_processes
from lib.run import Run
from lib import step
from lib.step import COMPILE_MODES, distribute_and_compile, optimizer_step, prepare_optimizer, schedule, sync_gradients
from model import SDPA_BACKENDS, Bert, BertConfig, set_kernels

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
attention_dropout = None  # the attention probabilities' alone; None: dropout's (the paper's 0.1 for both)
# masked LM
mask_prob = 0.15  # fraction of each sequence's tokens that is predicted
# optimisation: global batch = batch_size * gradient_accumulation_steps (split across processes)
batch_size = 32  # sequences per micro-batch and process
gradient_accumulation_steps = 8  # micro-batches per optimizer step, over all processes
max_iters = 200_000  # optimizer steps
max_minutes = 0.0  # a compute budget: minutes of training steps (evals and saves not counted); 0 = none. The schedule
                   # runs on the fraction spent (or of max_iters, whichever is further) and the run ends when it is spent
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
pause_at = 0  # stop at this step, saved, and exit 0 (continue with --init_from=resume): a call's share of a run
seed = 1337  # initialisation, data order, masking and dropout
wandb_log = False  # also log to Weights & Biases (pip install wandb)
wandb_project = "symmetric-bert"  # its project name
# system
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu, cuda, cuda:N or mps
dtype = "auto"  # float32, bfloat16 or float16 (GradScaler); auto: bf16, fp16 on old GPUs, float32 on old CPUs
compile = True  # torch.compile (falls back to eager, in one line, if it fails)
peak_flops = 0.0  # device peak for the MFU estimate; 0 = the GPU's datasheet peak in this precision, if known
# how a step computes, never what (docs/performance.md; a resume may change them)
compile_mode = "default"  # 'default' | 'reduce-overhead' (CUDA graphs) | 'max-autotune' | 'max-autotune-no-cudagraphs'
compile_optimizer = False  # torch.compile around the AdamW step too, with compile=True (bf16, float32; fp16: eager)
fused_qkv = False  # one matmul for the query, key and value projections (the parameters stay as they are)
sdpa_backend = "auto"  # the attention kernel on a GPU: 'auto' | 'cudnn' | 'flash' | 'efficient' | 'math'
fused_loss = False  # the MLM loss as logsumexp minus the target's logit, computed in float32 from the bf16 logits
# -----------------------------------------------------------------------------
given = {}  # the keys set by config files or --key=value, each with where its value came from
config = configure(globals(), given=given)
settings_ok = lambda: check(
      "train", (init_from in ("scratch", "resume"), f"init_from must be 'scratch' or 'resume', got {init_from!r}"),
      (min(batch_size, gradient_accumulation_steps, eval_interval, eval_iters, log_interval, save_interval) >= 1,
       "batch_size, gradient_accumulation_steps, eval_interval, eval_iters, log_interval and save_interval must be "
       ">= 1"),
      (0 < mask_prob < 1, f"mask_prob must be in (0, 1), got {mask_prob}"),
      (0 <= dropout < 1, f"dropout must be in [0, 1), got {dropout}"),
      (attention_dropout is None or isinstance(attention_dropout, (int, float)) and 0 <= attention_dropout < 1,
       f"attention_dropout must be None or in [0, 1), got {attention_dropout!r}"),
      (compile or not compile_optimizer, "compile_optimizer=True needs compile=True: an optimizer compiled beside an "
                                         "eager model steps ~9x slower; set --compile=True, or drop compile_optimizer"),
      (compile_mode in COMPILE_MODES, f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}"),
      (sdpa_backend in SDPA_BACKENDS, f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {sdpa_backend!r}"),
      (learning_rate > 0 and weight_decay >= 0 and grad_clip >= 0 and eps > 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1
       and qk_lr_scale > 0, "learning_rate, eps and qk_lr_scale must be > 0, weight_decay and grad_clip >= 0, beta1 "
                            "and beta2 in [0, 1)"),
      (min(warmup_iters, checkpoint_interval, min_iters, target_loss, peak_flops, max_minutes, max_iters, pause_at) >= 0,
       "warmup_iters, checkpoint_interval, min_iters, target_loss, peak_flops, max_minutes, max_iters and pause_at "
       "must be >= 0"),
      (0 <= seed < 2 ** 32, f"seed must be in [0, 2**32), got {seed}"),
      (min(n_layer, n_head, n_embd, n_inner, block_size) >= 1,
       "n_layer, n_head, n_embd, n_inner, block_size must be >= 1"))
settings_ok()

# the run: a new one, or the one in out_dir resumed with its own settings
run = Run(out_dir, config, given, int(os.environ.get("RANK", 0)), f"train.py {' '.join(sys.argv[1:])}")
if run.nothing_to_do:
    print(run.nothing_to_do)
    sys.exit(0)
globals().update({k: v for k, v in config.items() if k != "out_dir"})  # a resumed run's own settings
if run.resumed:  # checked as the command line's were: a checkpoint's settings edited or damaged are one line
    try:
        settings_ok()
    except SystemExit as e:
        raise SystemExit(f"{e} (the settings of {run.ckpt_path}: edited or damaged; resume another checkpoint)")

# processes and devices
ddp, rank, local_rank, world, device, flag_group = set_up_processes(device, gradient_accumulation_steps)
master, accum = rank == 0, gradient_accumulation_steps // world  # accum: micro-steps per process and step
oom = f"train: out of GPU memory at batch_size {batch_size}: lower it and raise gradient_accumulation_steps (the " \
      "global batch stays the same)"
asked = "as asked" if "dtype" in given else "the run's"  # not given: auto, or the precision a resumed run started with
device_type, dtype, dtype_why, ctx, peak = set_up(device, dtype, oom, asked)
peak = peak_flops or peak  # for MFU: the GPU's datasheet peak in this precision, unless given
config["dtype"] = dtype  # the precision in use is the one saved with the run

# data: the train blocks in a fixed order per seed, each micro-batch masked from (seed, its index); a fixed eval set
block_size = run.model_args["block_size"]  # the model's (a resumed run's own)
data = PretrainingData(dataset, run.model_args["vocab_size"] if run.resumed else None, block_size, batch_size,
                       mask_prob, seed)  # a resumed model's vocabulary must be its data's (checked)
if not run.resumed:
    run.model_args["vocab_size"] = data.meta["vocab_size"]  # a new model takes its data's vocabulary


def get_batch(it, micro):
    """Micro-batch `micro` (0..accum-1) of this process at step `it`: global micro-batch
    it * gradient_accumulation_steps + micro * world + rank."""
    batch = data.batch(it * gradient_accumulation_steps + micro * world + rank)
    if device_type == "cuda":
        return [t.pin_memory().to(device, non_blocking=True) for t in batch]
    return [t.to(device) for t in batch]


evals = data.eval_set(eval_iters)  # each process takes every world-th batch

# the model and its optimizer, as a resumed run left them, and the loop's state (lib/run.py: Run.restore)
torch.manual_seed(seed + rank)  # DDP makes every process start from rank 0's weights
raw_model = set_kernels(Bert(BertConfig(**run.model_args)).to(device), fused_qkv, sdpa_backend, fused_loss)
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), eps, device_type, qk_lr_scale)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
start = run.restore(raw_model, optimizer, scaler, rank, world, device_type, flag_group, data.fingerprint)
iter_num, last_eval, eval_loss, probe, spent = (start[k] for k in ("iter_num", "last_eval", "eval_loss", "probe",
                                                                   "spent"))
opt_step = prepare_optimizer(optimizer, device_type, compile_optimizer and not scaler.is_enabled(),  # compiled
                             compile_mode)  # lazily, at step 1; fp16's GradScaler steps the fused AdamW eagerly
if master:
    os.makedirs(os.path.join(run.out_dir, "snapshots"), exist_ok=True)
    n_params = sum(p.numel() for p in raw_model.parameters())
    print(f"{run.model_args['attention_type']} BERT, {n_params / 1e6:.2f}M parameters; {len(data.train):,} train / "
          f"{len(data.val):,} val blocks of {block_size}; {world} process(es) x {accum} micro-steps x {batch_size} = "
          f"{batch_size * gradient_accumulation_steps} sequences per step; {device}, {dtype} ({dtype_why})", flush=True)
run.notes(raw_model, data.n_pred, iter_num, spent, device_type)  # the budget; settings that do less than they say

# DDP, then torch.compile (tried at once: a failing compiler is one line, then eager). raw_model: the parameters
# (the optimizer, saves, diagnostics); model: what a step calls; eval_model: the same without DDP
if compile and master:
    print("compiling the model (torch.compile): the first step takes a while", flush=True)
model, eval_model = distribute_and_compile(raw_model, ddp, compile, device_type, local_rank, get_batch(iter_num, 0),
                                           ctx, compile_mode)
torch.manual_seed(seed + rank)  # dropout: the same stream whether or not a compile trial drew from it
run.restore_rng()  # a resumed run's RNG state: its dropout goes on to the bit


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
    since = (iter_num - probe[0], probe[1]) if probe else None  # how fast the scores moved since the last eval
    diag = raw_model.diagnostics(evals[0][0].to(device), since)  # one batch, eager, float32
    raw_model.train()
    return (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item(), diag


# the training loop
run.open_log(iter_num, wandb_project if wandb_log else None)
run.catch_signals()  # from here on a signal finishes the step, saves and exits with 128 + its number
state = lambda: {"iter_num": iter_num, "last_eval": last_eval, "eval_loss": eval_loss, "probe": probe, "spent": spent,
                 "eval_acc": eval_acc}  # eval_acc: for export_hf.py's model card
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
bar = tqdm(total=max_iters, initial=iter_num, disable=not (master and sys.stderr.isatty()), dynamic_ncols=True)
say = bar.write if not bar.disable else lambda s: print(s, flush=True)  # live bar on a terminal; lines in a log file
x, y, pos = get_batch(iter_num, 0)
stopping, eval_acc, saved = 0, None, iter_num if run.resumed else -1  # saved: the step of ckpt.pt (-1: none yet)
t0, t0_iter = time.time(), iter_num
paused = pause_at > iter_num  # a resume from that very step goes on
began = iter_num
while True:
    # a signal: save at once and stop (an eval due at this step runs after the resume instead)
    if stopping:
        run.save(run.ckpt_path, state())
        if master:
            say(f"stopped by signal {stopping} at step {iter_num}; saved {run.ckpt_path} (continue with "
                "--init_from=resume)")
        break

    # evaluate on the fixed eval set, with the plateau diagnostics
    raw_model.anneal_scores(iter_num)  # heat treatment: the scores' multiplier at this step (else nothing)
    if (iter_num % eval_interval == 0 or run.finished(state())) and last_eval != iter_num:  # and at the end
        eval_loss, eval_acc, diag = evaluate()
        last_eval, probe = iter_num, (iter_num, diag.pop("probe"))
        if not math.isfinite(eval_loss):
            run.stop(f"eval loss is {eval_loss}", iter_num)
        if master:
            run.log({"type": "eval", "step": iter_num, "loss": eval_loss, "accuracy": eval_acc, **diag,
                     "spent": round(spent, 2)})
            say(f"step {iter_num}: eval loss {eval_loss:.4f}, MLM accuracy {eval_acc:.4f}, attention entropy "
                f"{' '.join(f'{e:.2f}' for e in diag['attn_entropy'])}, collapse {diag['collapse']:.2f}")
        t0, t0_iter = time.time(), iter_num  # throughput excludes evaluation

    # save: the full state every save_interval steps and at the end; a model-only snapshot every checkpoint_interval
    finished = run.finished(state())
    if (iter_num % save_interval == 0 and iter_num > 0 or finished) and saved != iter_num:
        run.save(run.ckpt_path, state())
        saved, t0, t0_iter = iter_num, time.time(), iter_num  # throughput excludes saving
    snapshot = os.path.join(run.out_dir, "snapshots", f"ckpt_{iter_num:07d}.pt")
    if checkpoint_interval and iter_num % checkpoint_interval == 0 and iter_num > 0 and not (
            iter_num == began and os.path.exists(snapshot)):  # a resume at a snapshot's step keeps it as it was made
        run.save(snapshot, state(), full=False)
    if finished:
        break  # at max_iters, the budget spent, or target_loss met at this eval
    if paused and iter_num == pause_at:
        if saved != iter_num:
            run.save(run.ckpt_path, state())
        if master:
            say(f"paused at step {iter_num} (pause_at); saved {run.ckpt_path} (continue with --init_from=resume)")
        break

    # one optimizer step: accum micro-batches per process, gradients synchronised on the last one only
    t_step = step.clock()
    lr = schedule(optimizer, step.progress(iter_num, spent, max_iters, max_minutes), learning_rate, warmup_iters,
                  max_iters, decay_lr)
    train_loss = torch.zeros((), device=device)
    for micro in range(accum):
        if ddp:
            sync_gradients(model, micro == accum - 1)
        with ctx:
            loss = model(x, y, pos)[1] / accum
        x, y, pos = get_batch(iter_num, micro + 1) if micro + 1 < accum else get_batch(iter_num + 1, 0)  # prefetch
        scaler.scale(loss).backward()
        train_loss += loss.detach()
    optimizer_step(optimizer, scaler, raw_model.parameters(), grad_clip, opt_step)
    iter_num += 1
    bar.update(1)
    stopping, spent = run.signalled(spent + step.clock() - t_step)  # every process: the same stop and time spent

    # log the training loss, throughput and MFU (the loss is read, a host sync, only here)
    if iter_num % log_interval == 0:
        if ddp:  # the mean loss over all processes
            dist.all_reduce(train_loss)
            train_loss /= world
        train_loss = train_loss.item()
        if not scaler.is_enabled() and not math.isfinite(train_loss):
            run.stop(f"the training loss is {train_loss}", iter_num)
        if scaler.is_enabled() and scaler.get_scale() < 2 ** -6:  # fp16: every step overflows and is skipped
            run.stop(f"the fp16 loss scale collapsed to {scaler.get_scale():.2g} (the run diverged)", iter_num)
        tok_s = tokens_per_step * (iter_num - t0_iter) / (time.time() - t0)
        t0, t0_iter = time.time(), iter_num
        record = {"type": "train", "step": iter_num, "loss": train_loss, "lr": lr, "tokens_per_s": tok_s}
        if peak:  # per GPU: the tokens of one process against one GPU's peak
            record["mfu"] = raw_model.estimate_mfu(tok_s / world, block_size, data.n_pred / block_size, peak)
        if master:
            run.log(record)
            stats = ", ".join(f"{k} {v:,.0f}" if k == "tokens_per_s" else f"{k} {v:.4g}"  # 18,060, never 1.806e+04
                              for k, v in record.items() if k not in ("type", "step", "time"))
            if bar.disable:
                print(f"step {iter_num}: {stats}", flush=True)
            else:
                bar.set_postfix_str(stats)

bar.close()
run.close()  # every process waits for rank 0's save
if stopping:
    sys.exit(128 + stopping)  # a scheduler can tell a pre-empted run from a finished one
if master and not (paused and iter_num == pause_at):
    print(run.summary(iter_num, eval_loss, eval_acc, spent))
    if eval_loss is not None:
        print(run.learnt(iter_num, eval_loss, data.frequency_only_loss(eval_iters)))

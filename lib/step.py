"""
What a training step is made of around the model: torch.compile (with DDP first), the learning-rate schedule and the
optimizer step. Shared by train.py, finetune_glue.py and bench.py.
"""
import time
from contextlib import nullcontext

import torch

from configurator import oneline


def compile_model(model, device_type, batch=None, ctx=nullcontext()):
    """torch.compile. Compiling is lazy, so with a batch (inputs, targets, positions) it is tried at once on one
    forward and backward: a compiler that is missing or fails is then one line here, and the eager model is
    returned, instead of a traceback at the first step (torch._dynamo's suppress_errors does not cover a missing
    C++ compiler). The trial's gradients are dropped; it draws from the RNG (dropout)."""
    if device_type == "cpu":  # dropout from ATen's RNG inside compiled graphs: faster steps on CPU
        import torch._inductor.config as inductor_config  # "as": a bare import would make torch local here

        inductor_config.fallback_random = True
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


def distribute_and_compile(raw_model, ddp, compile, device_type, local_rank=0, batch=None, ctx=nullcontext()):
    """(the model to train, its DDP wrapper or None, the model to evaluate). DDP first, then torch.compile, as
    PyTorch advises: DDP's optimizer then splits the compiled graph at the gradient buckets, so that the all-reduce
    overlaps the backward (compiled first, the backward is one node and every bucket waits for its end). Evals run
    without DDP, each process on its own share of the batches: the plain model, compiled on its own."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_model = DDP(raw_model, device_ids=[local_rank] if device_type == "cuda" else None) if ddp else None
    model = ddp_model or raw_model
    if compile:
        model = compile_model(model, device_type, batch, ctx)
    if not ddp:
        return model, None, model
    return model, ddp_model, torch.compile(raw_model) if model is not ddp_model else raw_model


def linear_schedule(step, lr, warmup, total, decay=True):
    """Linear warm-up from 0 to lr over `warmup` steps, then linear decay to 0 at `total` (as the paper and the
    Hugging Face Trainer it ran: get_linear_schedule_with_warmup), or with decay=False constant at lr: then a
    run's past does not depend on its length, and it can be extended by a resume."""
    if step < warmup:
        return lr * step / warmup
    return lr * max(0.0, (total - step) / max(1, total - warmup)) if decay else lr


clock = time.perf_counter  # the budget's clock (max_minutes); a test puts a controlled one here


def progress(step, spent, total, minutes=0.0):
    """Where the schedule stands, in steps of `total`: the step, or under a budget of `minutes` the fraction of it
    spent (seconds) times total, whichever is further, so that the learning rate reaches 0 as the budget runs out
    (Cramming's schedule by budget) and max_iters still ends the run."""
    return max(step, spent / (60 * minutes) * total) if minutes else step


def schedule(optimizer, step, lr, warmup, total, decay=True):
    """Sets the learning rate of `step` (linear_schedule) in every parameter group, times the group's own lr_scale if
    it has one; returns it."""
    lr = linear_schedule(step, lr, warmup, total, decay)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return lr


def optimizer_step(optimizer, scaler, params, grad_clip):
    """Unscale (fp16), clip, step (the scaler skips a step whose gradients overflowed), zero the gradients."""
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

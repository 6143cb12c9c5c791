"""
What a training step is made of around the model: torch.compile (with DDP first), the learning-rate schedule and the
optimizer step. Shared by train.py, finetune_glue.py and bench.py.
"""
import time
from contextlib import nullcontext

import torch

from configurator import oneline

# torch.compile's modes: 'default'; 'reduce-overhead' replays CUDA graphs (no launch overhead; GPU only, elsewhere it
# is 'default'); 'max-autotune' times Triton matmul templates against cuBLAS and fuses epilogues into them, and uses
# CUDA graphs; 'max-autotune-no-cudagraphs' the same without the graphs. Each is how a step computes, never what.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_model(model, device_type, batch=None, ctx=nullcontext(), mode="default"):
    """torch.compile (in one of COMPILE_MODES). Compiling is lazy, so with a batch (inputs, targets, positions) it is
    tried at once on one forward and backward: a compiler that is missing or fails is then one line here, and the
    eager model is returned, instead of a traceback at the first step (torch._dynamo's suppress_errors does not cover
    a missing C++ compiler). The trial's gradients are dropped; it draws from the RNG (dropout)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if device_type == "cpu":  # dropout from ATen's RNG inside compiled graphs: faster steps on CPU
        import torch._inductor.config as inductor_config  # "as": a bare import would make torch local here

        inductor_config.fallback_random = True
        if hasattr(inductor_config, "deterministic"):  # as torch.use_deterministic_algorithms sets it (lib/device)
            inductor_config.deterministic = torch.are_deterministic_algorithms_enabled()
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
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


def distribute_and_compile(raw_model, ddp, compile, device_type, local_rank=0, batch=None, ctx=nullcontext(),
                           mode="default"):
    """(the model to train, the model to evaluate). DDP first, then torch.compile, as PyTorch advises: DDP's
    optimizer then splits the compiled graph at the gradient buckets, so that the all-reduce overlaps the backward
    (compiled first, the backward is one node and every bucket waits for its end). Evals run without DDP, each
    process on its own share of the batches: under DDP, the plain model, compiled on its own."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrapped = DDP(raw_model, device_ids=[local_rank] if device_type == "cuda" else None) if ddp else raw_model
    model = compile_model(wrapped, device_type, batch, ctx, mode) if compile else wrapped
    if not ddp:
        return model, model
    return model, raw_model if model is wrapped else torch.compile(raw_model)  # eager if the compiler failed


def sync_gradients(model, on):
    """Whether DDP all-reduces the gradients in the next backward (the last micro-step of a step only). model: the
    one distribute_and_compile returned, DDP compiled or not."""
    getattr(model, "_orig_mod", model).require_backward_grad_sync = on  # the DDP module inside a compiled wrapper


# A compiled AdamW takes the capturable form, which divides by the step size (lr / (1 - beta1^t)): at lr 0 (the first
# warm-up step) a parameter with a zero gradient becomes 0 / 0 = NaN (seen on a CPU, PyTorch 2.13; the GPU's foreach
# capturable form divides likewise). Its lr is therefore at least this: float32 holds every quotient that follows
# (an overflow is an infinite denominator, an update of 0), the moments are updated as at lr 0, and the update rounds
# to nothing, so that the parameters stay as at lr 0 (tests/test_step.py).
TENSOR_LR_MIN = 1e-30


def prepare_optimizer(optimizer, device_type, compiled=False, mode="default"):
    """The function that steps `optimizer` (an AdamW of Bert.configure_optimizers), called after a resumed run's
    optimizer state is loaded (load_state_dict takes the saved groups' settings, which may be another run's):
    - not compiled: optimizer.step, the fused AdamW (one kernel for all tensors; CPU and CUDA), lr a float;
    - compiled (PyTorch's recipe "Compiling the optimizer"): torch.compile around optimizer.step, over the foreach
      implementation (capturable on a GPU: its step counts on the device), which inductor fuses into a few kernels;
      each group's lr a 0-dim tensor that `schedule` fills in place (a float is a constant of the graph: a new
      graph for every new value). With a mode that uses CUDA graphs, the step is replayed as one too.
    The same arithmetic either way (AdamW with float32 master weights); the order of roundings may differ."""
    cuda, fused = device_type == "cuda", device_type in ("cuda", "cpu")
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        if compiled:
            device = group["params"][0].device if cuda else "cpu"
            group.update(fused=False, foreach=cuda, capturable=cuda,
                         lr=torch.tensor(max(lr, TENSOR_LR_MIN), device=device))
        else:
            group.update(fused=fused, foreach=None, capturable=False, lr=lr)
        for p in group["params"]:  # step counts live where the implementation reads them
            state = optimizer.state.get(p)
            if state and "step" in state:
                on_device = group["fused"] or group["capturable"]
                state["step"] = state["step"].to(p.device if on_device else "cpu", torch.float32)
    if not compiled:
        return optimizer.step
    graphs = mode in ("reduce-overhead", "max-autotune")

    @torch.compile(mode="reduce-overhead" if graphs else None)
    def step():
        optimizer.step()
    return step


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
    it has one (in place where it is a tensor: a compiled optimizer's); returns it."""
    lr = linear_schedule(step, lr, warmup, total, decay)
    for group in optimizer.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(max(lr * group.get("lr_scale", 1.0), TENSOR_LR_MIN))
        else:
            group["lr"] = lr * group.get("lr_scale", 1.0)
    return lr


def optimizer_step(optimizer, scaler, params, grad_clip, step=None):
    """Unscale (fp16), clip, step (the scaler skips a step whose gradients overflowed), zero the gradients. step: the
    function prepare_optimizer returned (a compiled one runs where no GradScaler is in use)."""
    if grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if step is not None and not scaler.is_enabled():
        step()
    else:
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

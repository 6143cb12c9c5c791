"""lib/step.py: the learning-rate schedule, and DDP then torch.compile, called directly (no training run)."""
import pytest
import torch

from lib.step import distribute_and_compile, linear_schedule, sync_gradients
from model import Bert, BertConfig


def test_lr_schedule_key_points():
    lr = lambda it: linear_schedule(it, 1e-4, 10_000, 200_000)
    assert lr(0) == 0.0
    assert lr(5_000) == pytest.approx(5e-5)
    assert lr(10_000) == pytest.approx(1e-4)  # the peak, at the end of warm-up
    assert lr(105_000) == pytest.approx(5e-5)  # half way down the linear decay
    assert lr(200_000) == 0.0 and lr(250_000) == 0.0
    assert linear_schedule(3, 1e-5, 0, 10) == pytest.approx(7e-6)  # no warm-up: decay from the start
    assert linear_schedule(5, 1e-3, 10, 100, decay=False) == pytest.approx(5e-4)  # warm-up as before
    assert linear_schedule(10, 1e-3, 10, 100, decay=False) == linear_schedule(
        10**6, 1e-3, 10, 100, decay=False) == 1e-3  # then constant, past max_iters too


def test_ddp_wraps_the_model_before_compiling_it(monkeypatch, tmp_path):
    """DDP, then compile (PyTorch's advice: the compiled graph is split at DDP's buckets, so the gradient all-reduce
    overlaps the backward); evals use the plain model, compiled on its own, without DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager"))  # the structure only
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        raw = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
        idx = torch.randint(0, 97, (2, 16))
        batch = (idx, torch.where(torch.rand(2, 16) < 0.3, idx, -100), None)
        model, eval_model = distribute_and_compile(raw, True, True, "cpu", 0, batch)
        ddp_model = model._orig_mod  # compiled around DDP, not DDP around a compiled model
        assert isinstance(ddp_model, DDP) and ddp_model.module is raw
        assert eval_model._orig_mod is raw
        for on in (False, True):  # the gradient sync reaches the DDP module inside the compiled wrapper
            sync_gradients(model, on)
            assert ddp_model.require_backward_grad_sync is on
        model, eval_model = distribute_and_compile(raw, True, False, "cpu", 0, batch)  # eager: DDP, and raw evals
        assert isinstance(model, DDP) and model.module is raw and eval_model is raw
        sync_gradients(model, False)
        assert model.require_backward_grad_sync is False
        model, eval_model = distribute_and_compile(raw, False, True, "cpu", 0, batch)
        assert model._orig_mod is raw and eval_model is model
    finally:
        dist.destroy_process_group()


def test_compiling_for_a_gpu_works_where_the_cpu_path_sets_inductor_options(monkeypatch):
    """compile_model's CPU-only branch imports an inductor module; a GPU run takes the other branch, which must still
    reach torch.compile (it once raised UnboundLocalError there, as the first GPU run showed)."""
    from lib.step import compile_model

    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: seen.append(m) or m)
    raw = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
    assert compile_model(raw, "cuda") is raw and compile_model(raw, "cpu") is raw and seen == [raw, raw]


def test_compile_model_passes_the_mode_and_refuses_an_unknown_one(monkeypatch):
    from lib.step import COMPILE_MODES, compile_model

    seen = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: seen.append(kw.get("mode")) or m)
    raw = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
    for mode in COMPILE_MODES:
        compile_model(raw, "cuda", mode=mode)
    assert seen == [None, "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
    with pytest.raises(ValueError, match="compile mode must be one of default, reduce-overhead"):
        compile_model(raw, "cuda", mode="fast")


def test_the_compiled_optimizer_step_is_adamw_follows_the_schedule_and_compiles_once():
    """prepare_optimizer(compiled=True): torch.compile around AdamW's step (the foreach form, lr a tensor filled in
    place by schedule): the same parameters as the eager fused AdamW to float32 rounding over steps whose learning
    rate changes each time, with one graph for all of them; and a state saved by either loads into the other."""
    from lib.step import prepare_optimizer, schedule

    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["frames"]

    def run(compiled, steps=4, state=None, seen=None):
        torch.manual_seed(0)
        model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=97, block_size=16))
        opt = model.configure_optimizers(0.01, 1e-2, (0.9, 0.999), 1e-12, "cpu")
        if state:
            model.load_state_dict(state[0])
            opt.load_state_dict(state[1])
        step = prepare_optimizer(opt, "cpu", compiled)
        g = torch.Generator().manual_seed(1)
        for it in range(steps):
            idx = torch.randint(0, 97, (2, 16), generator=g)
            schedule(opt, it, 1e-2, 3, 10)  # warm-up from 0 then decay: a new lr every step
            model(idx, torch.where(torch.rand(2, 16, generator=g) < 0.3, idx, -100))[1].backward()
            step()
            opt.zero_grad(set_to_none=True)
            (seen if seen is not None else []).append(frames["total"])
        return model, opt

    eager, opt_e = run(False)
    seen = []
    compiled, opt_c = run(True, seen=seen)
    assert all(torch.is_tensor(g["lr"]) and not g["fused"] for g in opt_c.param_groups)
    assert seen[0] > 0 and seen == seen[:1] * 4, seen  # compiled at the first step, never again as the lr moves
    assert all(torch.isfinite(p).all() for p in compiled.parameters())  # lr 0 at step 0 (TENSOR_LR_MIN)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if name.endswith("key.bias"):  # its gradient is 0 but for rounding (a softmax ignores a shift of a query's
            continue  # scores), and Adam makes a step of lr out of that noise, whose sign is the rounding's
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)  # 1e-3 of one step (lr 1e-2): rounding, which
        # Adam's m / sqrt(v) magnifies where a gradient is tiny (seen: 2e-6 on the embedding, 2e-7 on the head's bias)
    for compiled_then in (False, True):  # a state dict of either form resumes in the other
        opt = opt_c if not compiled_then else opt_e
        model, resumed = run(compiled_then, 1, ((compiled if not compiled_then else eager).state_dict(),
                                                opt.state_dict()))
        assert all(torch.is_tensor(g["lr"]) == compiled_then and g["fused"] != compiled_then
                   for g in resumed.param_groups)
        assert all(s["step"].item() == 5 for s in resumed.state.values())


def test_a_compiled_adamw_at_lr_0_leaves_the_parameters_as_the_eager_one_does():
    """PyTorch's capturable AdamW (what a compiled step runs) divides by the step size: at lr 0 a zero gradient gives
    0 / 0. With TENSOR_LR_MIN in its place, every parameter and moment is what the eager AdamW leaves at lr 0."""
    from lib.step import prepare_optimizer, schedule

    torch._dynamo.reset()
    out = []
    for compiled in (False, True):
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0, 0.5, 1e6]))
        opt = torch.optim.AdamW([p], lr=1e-3, eps=1e-12, weight_decay=0.01, fused=True)
        step = prepare_optimizer(opt, "cpu", compiled)
        schedule(opt, 0, 1e-3, 10, 100)  # lr 0
        p.grad = torch.tensor([0.0, 1.0, 1e-30, -1e8, 0.0])
        step()
        out.append((p.detach().clone(), opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()))
    for a, b in zip(*out):
        assert torch.equal(a, b), (a, b)
    assert torch.equal(out[0][0], torch.tensor([1.0, -2.0, 3.0, 0.5, 1e6]))

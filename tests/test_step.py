"""lib/step.py: the learning-rate schedule, and DDP then torch.compile, called directly (no training run)."""
import pytest
import torch

from lib.step import distribute_and_compile, linear_schedule
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
        model, ddp_model, eval_model = distribute_and_compile(raw, True, True, "cpu", 0, batch)
        assert isinstance(ddp_model, DDP) and ddp_model.module is raw
        assert model._orig_mod is ddp_model  # compiled around DDP, not DDP around a compiled model
        assert eval_model._orig_mod is raw
        model, ddp_model, eval_model = distribute_and_compile(raw, False, True, "cpu", 0, batch)
        assert ddp_model is None and model._orig_mod is raw and eval_model is model
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

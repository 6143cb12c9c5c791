"""The compiled CPU training step (forward, backward, fused AdamW) at the paper's bert-small shape, batch 8 x 128,
15% of positions predicted, timed A against B in one process, in alternating rounds, so that the machine's drift
cancels in each round's ratio (docs/performance.md, "The CPU step must not get slower"):

    python assets/cpu_ab/step_ab.py before=<a worktree of an older commit> [dtype]   # its model.py (A) vs this one (B)
    python assets/cpu_ab/step_ab.py deterministic [dtype]  # this model.py with deterministic algorithms on (A) vs off
"""
import importlib.util
import os
import statistics
import sys
import time

import torch
import torch._inductor.config as inductor_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
inductor_config.fallback_random = True  # as lib/step.py compiles on a CPU
torch.utils.deterministic.fill_uninitialized_memory = False  # as lib/device.py sets it


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


mode, dtype = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "float32")
here = load(os.path.join(ROOT, "model.py"), "model_here")
if mode.startswith("before="):
    arms = {"A": (load(os.path.join(mode[7:], "model.py"), "model_before"), False), "B": (here, False)}
else:
    arms = {"A": (here, True), "B": (here, False)}
B, T, V = 8, 128, 30522
g = torch.Generator().manual_seed(0)
idx = torch.randint(0, V, (B, T), generator=g)
targets = idx.view(-1).clone()
pos = (torch.rand(B * T, generator=g) < 0.15).nonzero().squeeze(1)
ctx = torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16")
steps = {}
for arm, (m, det) in arms.items():
    torch.use_deterministic_algorithms(det, warn_only=True)
    torch.manual_seed(0)
    model = m.Bert(m.BertConfig(n_layer=4, n_head=8, n_embd=512, n_inner=2048, vocab_size=V, block_size=T))
    opt = model.configure_optimizers(0.01, 1e-4, (0.9, 0.999), 1e-12, "cpu")
    compiled = torch.compile(model)

    def step(compiled=compiled, opt=opt, det=det):
        torch.use_deterministic_algorithms(det, warn_only=True)  # a guard of the compiled graph: one graph per arm
        with ctx:
            _, loss = compiled(idx, targets, pos)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # compile, warm up
        step()
    steps[arm] = step
ms = {arm: [] for arm in steps}
for r in range(8):
    for arm in ("A", "B") if r % 2 == 0 else ("B", "A"):
        t = time.perf_counter()
        for _ in range(3):
            steps[arm]()
        ms[arm].append((time.perf_counter() - t) / 3 * 1000)
ratios = [a / b for a, b in zip(ms["A"], ms["B"])]
print(f"{mode} {dtype}: A {statistics.median(ms['A']):.0f} ms, B {statistics.median(ms['B']):.0f} ms (medians); A/B per "
      f"round: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} rounds")

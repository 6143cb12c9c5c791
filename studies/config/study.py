# The study (docs/study.md; studies/study.py runs every arm and seed of it): when does each operator leave the
# initial loss plateau? A 4-layer, 128-wide BERT with 2 heads of d = 64 (the paper's head size) on GCIDE (16M
# tokens of English: python prepare_oscar.py --source=gcide), 32 x 128 tokens per step at lr 1e-3, held
# constant after a short warm-up, so that a run leaves the plateau (or not) at its peak rate, as in the paper,
# and can be extended without changing its past. Eval loss and plateau diagnostics every 25 steps on the same
# 160 held-out blocks for every run.
dataset = "gcide"
n_layer, n_head, n_embd, n_inner = 4, 2, 128, 512
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 3000  # the cap: a run that has not met the criterion by then is censored here
learning_rate = 1e-3
warmup_iters = 60
decay_lr = False
eval_interval = 25
eval_iters = 5  # 160 held-out blocks, the same for every run (the first of val.bin)
log_interval = 25
save_interval = 25  # ckpt.pt at every eval (7M parameters: cheap), so an interrupted run loses nothing
checkpoint_interval = 0  # no snapshots; ckpt.pt holds each run's final state
dtype = "float32"  # bf16 moved when runs leave the plateau (docs/study.md, Precision): not here
seed = 1
out_dir = "out/study"

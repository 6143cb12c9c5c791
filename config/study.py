# The study (README "The study"; study.py runs every arm and seed of it): when does each operator leave the
# initial loss plateau? A 4-layer, 128-wide BERT with 2 heads of d = 64 (the paper's head size) on GCIDE (16M
# tokens of English: python prepare_oscar.py --source=gcide), 1,500 steps of 32 x 128 tokens at lr 1e-3; eval
# loss and plateau diagnostics every 25 steps on the same 320 held-out blocks for every run.
dataset = "gcide"
n_layer, n_head, n_embd, n_inner = 4, 2, 128, 512
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 1500
learning_rate = 1e-3
warmup_iters = 60
eval_interval = 25
eval_iters = 10  # 320 held-out blocks, the same for every run (the first of val.bin)
log_interval = 25
checkpoint_interval = 0  # no snapshots (15 runs x 15 would be ~7 GB); ckpt.pt holds each run's final state
seed = 1
out_dir = "out/study"

# The study at bert-small scale on one GPU (README "The study", GPU recipe): the paper's bert-small shape (4 layers,
# 8 heads of d = 64, 512 hidden) on GCIDE (~33 MB of tokens: it travels with the repository to a GPU machine
# without network), 3,000 steps of 256 x 128 tokens (~6 epochs), a few minutes per run. Not run yet: no GPU was
# lent to the sessions that wrote it; lr and threshold may need a pilot run (see README).
dataset = "gcide"
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048
block_size = 128
batch_size = 256
gradient_accumulation_steps = 1
max_iters = 3000
learning_rate = 5e-4
warmup_iters = 300
eval_interval = 50
eval_iters = 4  # 1,024 held-out blocks, the same for every run
log_interval = 50
checkpoint_interval = 0
seed = 1
out_dir = "out/study_gpu"

# The paper's experiment at a scale a 2-core CPU runs in ~30 minutes (all three operators): a 4-layer,
# 128-wide BERT on the built-in corpus, the same seed and data order for every operator, eval loss every
# 25 steps, a kept snapshot every 100 steps for the GLUE checkpoint benchmark. See README "The study".
dataset = "builtin"
n_layer, n_head, n_embd, n_inner = 4, 4, 128, 512
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 600
learning_rate = 1e-3
warmup_iters = 60
eval_interval = 25
eval_iters = 10  # 320 held-out blocks
log_interval = 25
checkpoint_interval = 100
seed = 1337

# A first look on a laptop CPU: a 2-layer model on the built-in corpus (python prepare_oscar.py);
# the eval loss falls from ~10.8 to ~6 in a few minutes on 2 cores. Variants: tiny_{orig,sym,pair}.py
dataset = "builtin"
n_layer, n_head, n_embd, n_inner = 2, 4, 128, 512
block_size = 128
batch_size = 16
gradient_accumulation_steps = 2
max_iters = 300
learning_rate = 2e-3
warmup_iters = 30
eval_interval = 50
eval_iters = 20
log_interval = 10
save_interval = 100
checkpoint_interval = 100

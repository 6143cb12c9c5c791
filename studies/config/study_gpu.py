# The study at bert-small scale on one GPU (docs/study.md, On a GPU): the paper's bert-small shape
# (4 layers, 8 heads of d = 64, 512 hidden) on GCIDE (33 MB of tokens, made offline by prepare_oscar.py), 256 x 128
# tokens per step, constant lr after the warm-up as in studies/config/study.py.
# Not run yet: lr, the cap and the criterion's drop need pilot runs at this scale first.
dataset = "gcide"
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048
block_size = 128
batch_size = 256
gradient_accumulation_steps = 1
max_iters = 3000
learning_rate = 5e-4
warmup_iters = 300
decay_lr = False
eval_interval = 50
eval_iters = 4  # 1,024 held-out blocks, the same for every run
log_interval = 50
save_interval = 500  # ckpt.pt (~0.5 GB with AdamW's state) every 10 evals: a resume repeats <= 500 steps
checkpoint_interval = 0
dtype = "float32"  # as config study.py: bf16 moved the plateau exit on the CPU (TF32 matmuls here: not yet compared)
seed = 1
out_dir = "out/study_gpu"

# The third study (docs/study_small.md; studies/study_small.py runs it on one GPU): the paper's bert-small shape
# (4 layers, 512 wide, 8 heads of d = 64, 2048 inner; 38.7M parameters with this project's 50,304-token vocabulary,
# 28.8M with the paper's 30,522) on the english corpus (python prepare_oscar.py --source=english, 34.7M train
# tokens), 256 x 128 tokens per step, bf16, compiled. The paper's schedule shape: linear warm-up over the first 5% of
# the steps (its 10,000 of 200,000), then linear decay to 0 at the last step. study_small.py sets max_iters,
# warmup_iters, learning_rate and checkpoint_interval for each phase (the pilot's lr grid, the calibration's token
# points, the comparison's budget); the values below are the calibration's at 300M tokens and lr 1e-3, for a plain
# `python train.py studies/config/study_small.py` on a GPU.
dataset = "english"
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048
block_size = 128
batch_size = 256
gradient_accumulation_steps = 1
max_iters = 9216  # 302M tokens
learning_rate = 1e-3
warmup_iters = 461  # 5% of max_iters
decay_lr = True
eval_interval = 128  # 4.2M tokens: every token point of the calibration is an eval step
eval_iters = 4  # 1,024 held-out blocks (131k tokens, ~20k predicted), the same for every run
log_interval = 64
save_interval = 1_000_000  # ckpt.pt (~0.5 GB with AdamW's state) only at the end: no run resumes on another machine
checkpoint_interval = 768  # model-only snapshots every 25.2M tokens: the calibration's token points
dtype = "bfloat16"
compile = True
seed = 1
out_dir = "out/study_small/calib_s1"

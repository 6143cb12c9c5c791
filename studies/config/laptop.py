# The laptop study (docs/study_laptop.md; studies/study_small.py with studies/config/study_laptop.py runs it on this
# machine's CPU): a 4-layer, 256-wide BERT (4 heads of d = 64, 1,024 inner; 16.2M parameters, 12.9M of them the
# 50,304-token GPT-2 embedding) on the english corpus (python prepare_oscar.py --source=english, 34.7M train tokens),
# 32 x 128 tokens per step, float32, compiled. The paper's schedule shape: linear warm-up over
# the first 5% of the steps, then linear decay to 0 at the last step. The runner sets max_iters, warmup_iters,
# learning_rate, dropout and checkpoint_interval for each phase. The lengths below are the calibration's (50M tokens);
# learning_rate and dropout are the pilot grid's starting point: the calibration runs the pilot's pick,
# `python train.py studies/config/laptop.py --learning_rate=5e-4 --dropout=0.0`.
dataset = "english"
n_layer, n_head, n_embd, n_inner = 4, 4, 256, 1024
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 12288  # 50.3M tokens
learning_rate = 1e-3
warmup_iters = 614  # 5% of max_iters
decay_lr = True
dropout = 0.1  # the paper's; the pilot also tries 0 (Cramming's)
eval_interval = 256  # 1.05M tokens: every token point of the calibration is an eval step
eval_iters = 32  # 1,024 held-out blocks (131k tokens, ~20k predicted), the same for every run
log_interval = 64
save_interval = 512  # ckpt.pt every ~5 minutes: a run cut by the deadline or a signal resumes from it
checkpoint_interval = 768  # model-only snapshots every 3.1M tokens: the calibration's token points
dtype = "float32"  # one precision for the whole study, on any CPU (emulated bf16 is slower; native bf16 faster)
compile = True
device = "cpu"
seed = 1
out_dir = "out/study_laptop/calib_s1"

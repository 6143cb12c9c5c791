# The second study's pre-training (docs/study_glue.md; studies/study_glue.py runs every arm and seed of it): the study's
# 4-layer, 128-wide BERT (2 heads of d = 64) on running English prose (python prepare_oscar.py --source=prose),
# 32 x 128 tokens per step for 2,000 steps with the paper's schedule shape: linear warm-up over 10% of the steps,
# then linear decay to 0. MLM loss and accuracy every 100 steps on the same 320 held-out blocks for every run;
# a model-only snapshot every 250 steps for the checkpoint benchmark (Figure 3).
dataset = "prose"
n_layer, n_head, n_embd, n_inner = 4, 2, 128, 512
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 2000
learning_rate = 1e-3
warmup_iters = 200
decay_lr = True
eval_interval = 100
eval_iters = 10  # 320 held-out blocks, the same for every run (the first of val.bin)
log_interval = 50
save_interval = 100  # ckpt.pt at every eval (7M parameters: cheap), so an interrupted run loses little
checkpoint_interval = 250  # snapshots at steps 250, 500, ..., 2000: eight points of each run (Figure 3)
dtype = "float32"  # as the plateau study: bf16 moved when runs leave the plateau
seed = 2
out_dir = "out/study_glue"

# The study's design (studies/config/study.py) on a second corpus of another genre (docs/study.md): 5.3M tokens of
# running English prose, the U.S. State of the Union addresses and 18 Project Gutenberg books
# (python prepare_oscar.py --source=prose). Everything else as on GCIDE.
dataset = "prose"
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
out_dir = "out/study_prose"

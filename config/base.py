# bert-base as pre-trained in the paper (§3 and Appendix): OSCAR-2301 en, 512-token blocks, global batch
# 256 = 32 sequences x 8 accumulation steps (split across torchrun processes), 200k steps, AdamW
# (0.9, 0.999, 1e-12), weight decay 0.01, peak lr 1e-4 with 10k warm-up then linear decay, eval every 250
# steps on ~10k held-out blocks, a kept snapshot every 1,000 steps. Variants: base_{orig,sym,pair}.py
dataset = "oscar"
n_layer, n_head, n_embd, n_inner = 12, 12, 768, 3072
block_size = 512
batch_size = 32
gradient_accumulation_steps = 8
max_iters = 200_000
learning_rate = 1e-4
warmup_iters = 10_000
weight_decay = 0.01
eval_interval = 250
eval_iters = 312  # 312 x 32 = 9,984 held-out blocks (the paper holds out 10,000 samples)
checkpoint_interval = 1000

# bert-small of the paper: 4 layers, 8 heads, 512 hidden, 2048 inner; otherwise train.py's defaults (the paper's
# pre-training run). Variants: small_{orig,sym,pair,hybrid}.py
n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048

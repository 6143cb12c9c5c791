# bert-small of the paper: 4 layers, 8 heads, 512 hidden, 2048 inner; otherwise as config/base.py
from config.base import *  # noqa: F401,F403

n_layer, n_head, n_embd, n_inner = 4, 8, 512, 2048

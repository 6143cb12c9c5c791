from config.tiny import *  # noqa: F401,F403

# HybridBERT-style (a reconstruction, see README): layers alternate original / additive attention, sub-LN
attention_type = "hybrid"
hybrid_pattern = "original,additive"
sub_ln = True
out_dir = "out/tiny_hybrid"

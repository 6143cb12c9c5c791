# HybridBERT-style (a reconstruction, see README) at bert-base size (train.py's defaults): layers alternate
# original / additive attention, with sub-LN
attention_type = "hybrid"
hybrid_pattern = "original,additive"
sub_ln = True
out_dir = "out/base_hybrid"

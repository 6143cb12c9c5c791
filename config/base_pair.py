# bert-base as pre-trained in the paper: train.py's defaults (python train.py --help lists them), pairwise attention
attention_type = "pairwise"
out_dir = "out/base_pair"

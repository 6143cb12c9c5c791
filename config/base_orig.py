# bert-base as pre-trained in the paper: train.py's defaults (python train.py --help lists them), original attention
attention_type = "original"
out_dir = "out/base_orig"

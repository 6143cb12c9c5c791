# bert-base as pre-trained in the paper: train.py's defaults (python train.py --help lists them), symmetric attention
attention_type = "symmetric"
out_dir = "out/base_sym"

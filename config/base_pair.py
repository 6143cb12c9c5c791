from config.base import *  # noqa: F401,F403

attention_type = "pairwise"
out_dir = "out/base_pair"

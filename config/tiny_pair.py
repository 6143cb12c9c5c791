from config.tiny import *  # noqa: F401,F403

attention_type = "pairwise"
out_dir = "out/tiny_pair"

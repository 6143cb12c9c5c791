from config.small import *  # noqa: F401,F403

attention_type = "pairwise"
out_dir = "out/small_pair"

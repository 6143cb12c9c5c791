from config.small import *  # noqa: F401,F403

attention_type = "original"
out_dir = "out/small_orig"

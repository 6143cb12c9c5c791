from config.base import *  # noqa: F401,F403

attention_type = "original"
out_dir = "out/base_orig"

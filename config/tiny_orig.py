from config.tiny import *  # noqa: F401,F403

attention_type = "original"
out_dir = "out/tiny_orig"

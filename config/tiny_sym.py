from config.tiny import *  # noqa: F401,F403

attention_type = "symmetric"
out_dir = "out/tiny_sym"

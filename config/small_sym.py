from config.small import *  # noqa: F401,F403

attention_type = "symmetric"
out_dir = "out/small_sym"

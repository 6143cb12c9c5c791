from config.base import *  # noqa: F401,F403

attention_type = "symmetric"
out_dir = "out/base_sym"

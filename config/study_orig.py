from config.study import *  # noqa: F401,F403

attention_type = "original"
out_dir = "out/study_orig"

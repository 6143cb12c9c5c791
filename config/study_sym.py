from config.study import *  # noqa: F401,F403

attention_type = "symmetric"
out_dir = "out/study_sym"

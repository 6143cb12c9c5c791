from config.study import *  # noqa: F401,F403

attention_type = "pairwise"
out_dir = "out/study_pair"

# The calibration of the levers' pick (docs/study_levers.md, fixed before it runs): the pilot's pick, english at
# 50,304 ids, as one run to 50.3M tokens with log-spaced snapshots; STS-B and SST-2 with 3 fine-tuning seeds at
# each, all four tasks at the last and for the untrained model, every model probed frozen:
#     python studies/study_small.py studies/config/levers.py studies/config/levers_calib.py --glue_dir=<GLUE> --hours=2.5
# Each call runs what its records lack, from a clone of the records' commit; a run cut by the deadline resumes from
# its checkpoint in out_dir, or is made again (paused at each snapshot with fine-tunes to run) where out_dir is gone.
points = '3.125M,6.25M,12.5M,25M,50M'  # steps 768 ... 12,288: the laptop study's snapshots, T = 50.33M tokens
tasks = 'sst2,mrpc,stsb,rte'  # GLUE-4: at T and for the untrained model
calib_tasks = 'stsb,sst2'  # at every snapshot; their mean is the pilot's score, the primary criterion
glue_args = '--max_train_samples=10000 --dtype=float32'  # float32 on every CPU (auto takes bf16 where it is native)
corpora = ''  # one corpus: data_dir's
out_dir = 'out/levers_calib'
records = 'assets/levers/calib-v50304'
summary = 'assets/levers_calib.json'
figures = 'assets/levers_calib'

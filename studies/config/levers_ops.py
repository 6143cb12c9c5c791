# Not run: its plan asked the calibration's 50.3M point to be clear too, and it is not (docs/study_levers.md).
# Table 3 where GLUE responds (docs/study_levers.md, "The operator comparison", fixed before any of its runs): the
# calibration's recipe (english at 50,304 ids, peak lr 5e-4, dropout 0) pre-trained to T = 25.2M tokens, the budget it
# pays from, once per operator and paired pre-training seed; each model fine-tuned on STS-B and SST-2 with 3 seeds
# and probed frozen, the untrained model of each seed too:
#     python studies/study_small.py studies/config/levers.py studies/config/levers_ops.py --glue_dir=<GLUE> --hours=2.5
# Each call runs what its records lack, model by model, from a clone of `commit`.
commit = '1812358'  # the plan's code: every call runs a clone of it
phase = 'comparison'
arms = 'original,symmetric,pairwise,untrained'
seeds = '2,3,4,5,6'  # 5 paired seeds: the plan's power calculation
tokens = '25M'  # 6,144 steps, 25.17M tokens: each run's schedule ends there
tasks = 'stsb,sst2'  # their mean is the calibration's score, the primary endpoint
glue_args = '--max_train_samples=10000 --dtype=float32'  # float32 on every CPU
corpora = ''
out_dir = 'out/levers_ops'
records = 'assets/levers/ops-v50304'
summary = 'assets/levers_ops.json'
figures = 'assets/levers_ops'

# The laptop study's runner settings (docs/study_laptop.md): studies/study_small.py on this machine's CPU, one job
# at a time, each from a clone of one commit, within a deadline (--hours):
#     python studies/study_small.py studies/config/study_laptop.py --phase=pilot --glue_dir=<GLUE> --hours=2.5
# (out_dir holds the runs' checkpoints for the later jobs and calls: put it where the machine keeps it)
base = 'studies/config/laptop.py'
device = 'cpu'
clone = True
hours = 2.5
jobs = 1
overlap = False
threads = 0  # torch's default: every core
# the pilot, fixed in docs/study_laptop.md before it ran
pilot_lrs = '5e-4,1e-3,2e-3'  # with the paper's dropout 0.1
pilot_tokens = '5M'
pilot_dropout = '0'  # then dropout 0 (Cramming's) at the lr picked
pilot_glue_lrs = '1e-4,3e-4'
pilot_glue_model = 'best'
pilot_tasks = 'stsb,sst2'
# the calibration: snapshots at 3.1, 6.3, 12.6, 25.2 and 50.3M tokens; STS-B and SST-2 at every one, GLUE-4 at the
# last and the untrained model; 3 fine-tuning seeds each
points = '3.125M,6.25M,12.5M,25M,50M'
calib_tasks = 'stsb,sst2'
init_own_lr = True
glue_seeds = '1,2,3'
tokens = ''  # the comparison's budget: unset, the calibration found none at which pre-training pays (docs/study_laptop.md)
glue_args = '--max_train_samples=10000'  # SST-2 cut to its first 10,000 rows, as in study_glue; dtype auto
out_dir = 'out/study_laptop'
records = 'assets/study_laptop'
summary = 'assets/study_laptop.json'
figures = 'assets/study_laptop'

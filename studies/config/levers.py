# The levers' pilot (docs/study_levers.md, fixed before it ran): studies/study_small.py's calibration phase on this
# machine's CPU at one budget, 12.6M tokens, for the full GPT-2 vocabulary (50,304 ids): the english corpus, and
# english with GLUE's training sentences at half the tokens, each pre-trained once and fine-tuned on STS-B and SST-2
# with 3 seeds against one untrained model, every model also probed frozen:
#     python studies/study_small.py studies/config/levers.py --glue_dir=<GLUE> --hours=2.5
# The smaller vocabulary (16,384 ids): the same with studies/config/levers_v16384.py. Each call runs what its records
# lack, from a clone of the records' commit; a run cut by the deadline resumes from its checkpoint in out_dir.
base = 'studies/config/laptop.py'
device = 'cpu'
clone = True
hours = 2.5
jobs = 1
overlap = False
threads = 0  # torch's default: every core
phase = 'calibration'
learning_rate = 5e-4  # the laptop pilot's recipe (docs/study_laptop.md): peak lr 5e-4, dropout 0 in pre-training
train_args = '--dropout=0.0'
glue_lr = 1e-4  # and its fine-tuning lr; fine-tuning dropout 0.1, finetune_glue's protocol
points = '12.5M'  # one snapshot: step 3,072, 12.58M tokens
tasks = 'stsb,sst2'  # the two tasks that move first; their mean is the pilot's score
glue_seeds = '1,2,3'
glue_args = '--max_train_samples=10000'  # SST-2 cut to its first 10,000 rows, as in the laptop study; dtype auto
probes = True
init_own_lr = False
data_dir = 'data/english'  # python prepare_oscar.py --source=english
corpora = 'data/english-glue-0.5'  # python prepare_oscar.py --source=english --mix=glue --mix_share=0.5 --glue_dir=<GLUE>
out_dir = 'out/levers'
records = 'assets/levers/v50304'
summary = 'assets/levers_v50304.json'
figures = 'assets/levers_v50304'

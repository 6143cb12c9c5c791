"""
The third study (docs/study_small.md): the paper's bert-small on one GPU, trained until pre-training pays on GLUE.
Three phases, each as many GPU runs of one command (at most ~9 minutes) as it needs; every finished job's record is
kept in assets/study_small/ (small files, committed), and the summary and figure are made from those files alone.

  pilot        the pre-training learning rate (3 lrs x 50M tokens) and the fine-tuning one (GLUE-4 of the first pilot
               run's model and of the untrained one at 3 lrs), each picked by a rule fixed before it runs
  calibration  one run of the original operator to 300M tokens; GLUE-4 (2 fine-tuning seeds) of its snapshots at
               25M, 75M, 150M and 300M tokens and of its untrained model: when does pre-training beat random init?
  comparison   the operators at one token budget with paired seeds, model by model (each pre-training, then its
               fine-tunes and probe); its plan is written after the calibration

    python studies/study_small.py --prepare=True --glue_dir=<GLUE>  # here, once: .gpu/ for the device tool to carry
    python studies/study_small.py --phase=pilot                    # on the GPU (the device call: docs/study_small.md)
    python studies/study_small.py --unpack=<its records.tar>       # here: its new records into assets/study_small/
    python studies/study_small.py --train=False                    # the summary and figure from the records alone
    python studies/study_small.py --dry=True --phase=calibration   # the same plumbing on a CPU at toy sizes

A GPU run checks the GPU and the data (it unpacks .gpu/english/*.xz into data/english), skips every job whose record
is there, starts a job only if its estimated end (from the records of earlier runs on the same GPU, else the
constants TIMES) is within budget_s, and writes each record as its job ends, into assets/study_small/ and, bundled,
into $OUT/records.tar. No checkpoint comes back from the GPU machine: a recorded model whose fine-tunes are missing is
pre-trained again first, and its second record goes beside the first (<name>.rerun1.jsonl).

The laptop study (docs/study_laptop.md) is the same three phases on this machine's CPU, with a config of its own:

    python studies/study_small.py studies/config/study_laptop.py --phase=pilot --hours=2.5

its jobs one after the other from a clone of one commit (clone=True), each started only if its estimate ends within
`hours`; a job cut at the deadline or by a signal saved first and resumes from its checkpoint in the next call, and
a pre-training pauses (saved) at each snapshot whose fine-tunes are missing while they run (pause_step).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: the
# studies run from it as `python studies/<study>.py`, and import its scripts and lib/
if __name__ == '__main__':  # first, before numpy and torch: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import json
import math
import re
import shutil
import signal
import subprocess
import time
from functools import partial
from typing import NamedTuple

import numpy as np

from configurator import check, comma_list, configure, read_file, script_defaults
from finetune_glue import TASKS
from probe import TASKS as PROBE_TASKS
from lib.dataloader import dataset_dir, fingerprint, load_dataset
from lib.files import atomic_write, check_replaceable, read_json, tar_writer, write_json
from lib.checkpoint import load_checkpoint
from lib.run import log_head
from plot import first_step_below, read_evals
from studies.jobs import (DIVERGED_RECORD, PROBE_RECORD, ROOT, Job, clone_at, cpu_name, differ, read_checked,
                          read_record, run_jobs, same_request, unigram_loss, write_record)
from studies.stats import holm, line_fit, t_quantile
from studies.carry import check_glue, dry_inputs, prepare_carry, unpack_data, unpack_records
from studies.study_glue import ARMS, compare, glue4, write_glue_record
from studies.small_report import CLEAR, PROBES, TREND_AT, TREND_TARGET, figure, report, tokens_text
from studies import study_glue

T0 = time.monotonic()  # the run's clock: budget_s and stop_s count from here
DATA = set()  # the data's fingerprint (lib/dataloader.py), once checked; from the records alone: those they name
FOLDER_DATA = {}  # a training call's: each corpus folder's fingerprint (data_dir's and the corpora's)
# -----------------------------------------------------------------------------
phase = 'calibration'  # what a run with train=True runs: pilot, calibration or comparison
base = 'studies/config/study_small.py'  # the train.py config every run starts from
train_args = ''  # more train.py arguments for every run, space-separated (dry: the toy model's)
device = 'cuda'  # cuda: one GPU (the device tool's runs); cpu: this machine's CPU, one job at a time (laptop study)
hours = 0.0  # the call's deadline in hours: sets budget_s and stop_s (0: they stand as given)
clone = False  # run from a clone of one commit under out_dir (the phase's records' commit, else HEAD): main may
               # change while a long run trains
commit = ''  # clone: the commit to run from, whole or abbreviated ('' = the phase's records', else HEAD)
# the pilot (pre-training seed `seed`)
pilot_lrs = '1e-3,5e-4,2e-3'  # pre-training peak lrs: one run each of pilot_tokens, its schedule ending there
pilot_tokens = '50M'  # each pilot run's tokens (k, M or B), where its schedule ends
pilot_dropout = ''  # after the lr grid, one more run at its pick with this dropout ('' = none); the recipe is the
                    # lowest final eval loss of all the pilot's runs
pilot_glue_lrs = '3e-5,1e-4,3e-4'  # fine-tuning lrs, each on one pilot run's model and the untrained one (1 seed)
pilot_glue_model = 'first'  # whose model the fine-tuning lrs are tried on: first (the first pilot run, at once) or
                            # best (the pilot's pick: after every pilot run)
pilot_tasks = ''  # the tasks of the pilot's fine-tunes and of its fine-tuning pick ('' = tasks)
learning_rate = 0.0  # the calibration's and the comparison's peak lr; 0 = the pilot's pick (from its records)
glue_lr = 0.0  # their fine-tuning lr; 0 = the pilot's pick
# the calibration: the original operator, seed `seed`; its snapshots and its untrained model fine-tuned
points = '25M,75M,150M,300M'  # tokens seen by the snapshots fine-tuned: multiples of the first; the last ends the run
calib_tasks = ''  # the tasks of every snapshot's fine-tunes but the last one's ('' = tasks; the last and the untrained
                  # model get tasks)
init_own_lr = False  # the untrained model fine-tuned also at its own best lr of the pilot's (on calib_tasks)
corpora = ''  # more corpora (data folders of data_dir's vocabulary), each pre-trained and fine-tuned as data_dir's
              # (calib_<folder>_s<seed>), against the same untrained model: the corpus is the one factor changed
probes = False  # every model point (the untrained model, each snapshot, each comparison model) also probed frozen
                # (probe.py): STS-B cosine, SST-2 logistic regression, and the trivial baselines beside them
seed = 1  # the pilot's and the calibration's pre-training seed
# the comparison (its plan is fixed after the calibration: docs/study_small.md)
arms = 'original,symmetric,pairwise'  # a comma list of studies/study_glue.py's ARMS
seeds = '2,3,4,5'  # paired pre-training seeds
tokens = '150M'  # each run's budget, where its schedule ends ('': not fixed yet, the comparison waits)
# GLUE-4 (finetune_glue.py's protocol, the paper's, at glue_lr)
tasks = 'sst2,mrpc,stsb,rte'  # GLUE-4: the tasks whose plain mean is the score
glue_seeds = '1,2'  # fine-tuning seeds of every model (the pilot's fine-tuning pick: the first alone)
glue_args = '--max_train_samples=10000 --dtype=bfloat16'  # SST-2 cut to its first 10,000 rows, as in study_glue
drop = 0.7  # the plateau exit: the first eval whose loss is <= U - drop (studies/study.py's criterion)
# the GPU run
jobs = 8  # fine-tunes at once, beside at most one pre-training (small models leave the GPU idle otherwise)
overlap = True  # the calibration's fine-tunes may run beside its pre-training; the pilot's and the comparison's
                # never do (each pre-training alone: their step times are endpoints)
budget_s = 500.0  # no job starts unless its estimated end is within this many seconds of the start
stop_s = 560.0  # what still runs then is stopped (the device call's limit is 600 s); finished jobs stay recorded
time_scale = 1.2  # every estimate x this: a margin
threads = 1  # torch threads per job (OMP_NUM_THREADS)
carry = '.gpu'  # what the device tool carries: english/ (train.bin.xz, val.bin.xz, meta.json), glue/, gpt2/
data_dir = 'data/english'  # where the corpus is unpacked and read
glue_dir = ''  # GLUE in the original layout; '' = <carry>/glue (--prepare: where to copy it from)
out = ''  # the run's log, records.tar (the records it wrote) and logs.tar.gz; '' = $OUT if set, else <out_dir>/out
out_dir = 'out/study_small'  # the jobs' working folders
records = 'assets/study_small'  # the finished jobs' records
summary = 'assets/study_small.json'  # '' = none
figures = 'assets/study_small'  # output prefix of the figure; '' = none
train = True  # False: run nothing; the summary and figure from the records (the missing jobs are listed)
predict = False  # print the phase's jobs with their estimated times (from the records), run nothing
prepare = False  # make <carry>/ here (from data_dir, glue_dir and the GPT-2 files), then stop
unpack = ''  # a GPU run's records.tar: its records into <records>/ (checked, nothing overwritten), then stop
dry = False  # the same plumbing on the CPU at toy sizes (a tiny model, a toy corpus, toy GLUE), all under `work`
work = 'out/study_small_dry'  # dry: its inputs, runs, records, summary and out
# -----------------------------------------------------------------------------
WHO = 'study_small'
# A job's time before any record of this device says otherwise (docs/study_small.md, "Time model"): seconds, and
# tokens/s. fixed: start-up, compiling and the first eval (cold: the run's first compile; warm: from its cache).
# probe: probe.py of one model (on 2 cores ~1.5 minutes, nearly all of it SST-2's 67,349 training sentences).
TIMES = {'gpu': {'fixed_cold': 90.0, 'fixed_warm': 40.0, 'tokens_per_s': 2.0e6, 'end': 10.0, 'init': 30.0,
                 'glue': 120.0, 'probe': 30.0},
         'cpu': {'fixed_cold': 8.0, 'fixed_warm': 8.0, 'tokens_per_s': 2000.0, 'end': 2.0, 'init': 8.0, 'glue': 15.0,
                 'probe': 10.0},
         # the laptop study's 4 x 256 model on 2 cores (bf16 on an AMD EPYC: ~7,300 tokens/s, STS-B 211 s; float32
         # on an Intel Xeon without bf16: ~3,500 tokens/s), a fine-tune per task, as the tasks of a job differ there
         'laptop': {'fixed_cold': 60.0, 'fixed_warm': 40.0, 'tokens_per_s': 3500.0, 'end': 5.0, 'init': 20.0,
                    'glue': 0.0, 'glue_sst2': 450.0, 'glue_stsb': 350.0, 'glue_mrpc': 240.0, 'glue_rte': 210.0,
                    'probe': 120.0}}
FOLLOW = ('glue', 'probe')  # the kinds of job that take a pre-training's model
DRY = {  # what --dry sets, unless given
    'train_args': '--device=cpu --dtype=float32 --compile=False --n_layer=1 --n_head=2 --n_embd=32 --n_inner=64 '
                  '--batch_size=4 --eval_iters=2 --eval_interval=2 --log_interval=2',
    'pilot_lrs': '1e-3,1e-2', 'pilot_glue_lrs': '1e-4,1e-3', 'pilot_tokens': '2048', 'points': '1024,3072',
    'arms': 'original,pairwise', 'seeds': '2,3', 'tokens': '2048', 'jobs': 2,
    'glue_args': '--max_train_samples=16 --epochs=1 --batch_size=4 --max_seq_len=64 --dtype=float32 --device=cpu',
    'budget_s': 240.0, 'stop_s': 300.0}
STUDY_TRAIN_KEYS = ('out_dir', 'init_from', 'pause_at', 'max_iters', 'warmup_iters', 'learning_rate', 'seed',
                    'attention_type', 'checkpoint_interval', 'dataset')  # what the plan sets on its runs (train_args'
# would be overridden)
STUDY_GLUE_KEYS = ('init_from', 'out_dir', 'data_dir', 'tasks', 'seeds', 'learning_rate')  # and on its fine-tunes
MIN_CPU_S = 600.0  # device=cpu: a pre-training starts if this much of its training fits before the deadline
NO_PLAN = "waits for its plan, written after the calibration (the study's docs): then set --tokens"  # tokens ''
DIVERGED = re.compile(r"loss is -?(nan|inf)|non-finite|not finite")  # a run that diverged: train.py's last line


def lr_tag(x):
    return np.format_float_scientific(x, trim='-', exp_digits=1)  # 1e-4, 2.5e-4


def count(text):
    """'25M' -> 25000000 (k, M, B; or a plain number)."""
    m = re.fullmatch(r'(\d+(?:\.\d+)?)([kMB]?)', text.strip())
    check(WHO, (m, f"a token count is a number with an optional k, M or B, got {text!r}"))
    return round(float(m.group(1)) * {'': 1, 'k': 1e3, 'M': 1e6, 'B': 1e9}[m.group(2)])


def token_tag(n):
    return f"{n / 1e6:05.1f}M".replace('.', 'p') if n >= 1e6 else f"{n}"  # 025p2M: sorts as it reads


# ----------------------------------------------------------------------------- the plan
class Step(NamedTuple):
    """One job: a pre-training (train.py; kind 'init': the untrained model, max_iters=0, evaluated and saved) or the
    GLUE-4 fine-tunes of one model with one seed (finetune_glue.py)."""
    kind: str  # pretrain, init, glue or probe (probe.py of a model point)
    name: str  # its record's name
    cmd: list  # its settings: train.py's (the config file first) or finetune_glue.py's, as --key=value
    folder: str  # its working folder
    record: str  # the record it leaves
    step: int  # the model's step (a pre-training's: max_iters)
    tokens: int  # tokens the model has seen
    owner: str = ''  # glue: the pre-training that makes its model
    model: str = ''  # glue: the checkpoint it fine-tunes
    tasks: str = ''  # glue: its tasks
    of: str = ''  # glue: the name of the model it fine-tunes
    data: str = ''  # pretrain, init: its data folder ('' = data_dir)


def base_config():
    """train.py's settings of every run: the base config with train_args."""
    cfg = {**script_defaults(os.path.join(ROOT, 'train.py')), 'device': '', **read_file(base)}
    return configure(cfg, argv=train_args.split())


def tokens_per_step(cfg):
    return cfg['batch_size'] * cfg['block_size'] * cfg['gradient_accumulation_steps']


def pretraining(name, cfg, extra, max_iters, data=''):
    """A train.py run of the base config with `extra` settings, ending at max_iters (0: the untrained model), on the
    corpus in `data` ('' = data_dir)."""
    data = data or data_dir
    flag = [] if dataset_dir(cfg['dataset']) == data else [f'--dataset={data}']
    ends = [f'--max_iters={max_iters}', f'--warmup_iters={round(0.05 * max_iters)}']  # the paper's 10,000 / 200,000
    return Step('pretrain' if max_iters else 'init', name, [base, *train_args.split(), *flag, *extra, *ends],
                os.path.join(out_dir, name), os.path.join(records, name + '.jsonl'), max_iters,
                max_iters * tokens_per_step(cfg), data=data)


def model_point(pre, cfg, snapshot=0):
    """(name, checkpoint path, step) of a pre-training's final model, or of its snapshot at step `snapshot`."""
    if not snapshot:
        return pre.name, os.path.join(pre.folder, 'ckpt.pt'), pre.step
    return (f"{pre.name}_t{token_tag(snapshot * tokens_per_step(cfg))}",
            os.path.join(pre.folder, 'snapshots', f'ckpt_{snapshot:07d}.pt'), snapshot)


def probe_step(pre, cfg, snapshot=0):
    """probe.py of a pre-training's final model or of its snapshot: one job, seconds to minutes."""
    model, path, step = model_point(pre, cfg, snapshot)
    return Step('probe', f"{model}.probe", [], os.path.join(out_dir, f"{model}.probe"),
                os.path.join(records, f"{model}.probe.json"), step, step * tokens_per_step(cfg), owner=pre.name,
                model=path, of=model)


def init_step(cfg, sd):
    """The untrained original model of seed sd: its initialisation, evaluated once and saved (nothing to compile)."""
    return pretraining(f'init_s{sd}', cfg, ['--attention_type=original', '--compile=False', f'--seed={sd}'], 0)


def finetunes(pre, lr, ft_seeds, cfg, snapshot=0, on=None):
    """The fine-tunes (on the tasks `on`, else GLUE-4's) of a pre-training's final model, or of its snapshot at step
    `snapshot`: one per seed."""
    (model, path, step), whole = model_point(pre, cfg, snapshot), set((on or tasks).split(',')) == set(tasks.split(','))
    # a model's tasks may come in several jobs, named by their tasks in one order (Table 3's, every committed name's);
    # all of them: 'glue', run in the order of --tasks (done() compares a record's tasks as a set)
    on = tasks if whole else ','.join(sorted(on.split(','), key=list(TASKS).index))
    out, tag = [], 'glue' if whole else '+'.join(on.split(','))
    for ft in ft_seeds:
        name = f"{model}.{tag}_lr{lr_tag(lr)}_s{ft}"
        cmd = [f'--tasks={on}', f'--seeds={ft}', f'--learning_rate={lr}', *glue_args.split()]
        out.append(Step('glue', name, cmd, os.path.join(out_dir, name), os.path.join(records, name + '.json'),
                        step, step * tokens_per_step(cfg), owner=pre.name, model=path, tasks=on, of=model))
    return out


def split_finetunes(pre, lr, ft_seeds, cfg, snapshot=0, on=''):
    """The fine-tunes of a model on all the tasks, as two jobs per seed where `on` names some of them (those, then
    the rest): the jobs on `on` are the same as the pilot's or a snapshot's, and not made twice."""
    rest = ','.join(t for t in tasks.split(',') if t not in (on or tasks).split(','))
    return finetunes(pre, lr, ft_seeds, cfg, snapshot, on) + (finetunes(pre, lr, ft_seeds, cfg, snapshot, rest)
                                                             if rest else [])


def lr_of(s):
    return float(next(a for a in s.cmd if a.startswith('--learning_rate=')).split('=', 1)[1])


def pilot_steps(cfg, recs=None):
    """The pilot's pre-trainings: one per lr of the grid and, once the grid's runs are recorded, the run at its pick
    with pilot_dropout."""
    n = max(1, round(count(pilot_tokens) / tokens_per_step(cfg)))
    run = lambda lr, extra, tag: pretraining(f"pilot_lr{lr_tag(lr)}{tag}_s{seed}", cfg, [
        '--attention_type=original', f'--learning_rate={lr}', *extra, '--checkpoint_interval=0', f'--seed={seed}'], n)
    grid = [run(float(lr), [], '') for lr in pilot_lrs.split(',')]
    best = pilot_dropout and pilot_best(recs or {}, grid)
    return grid + ([run(lr_of(best), [f'--dropout={float(pilot_dropout)}'], f'_d{float(pilot_dropout):g}')]
                   if best else [])


def calibration_points(cfg):
    """The snapshot steps of the token points: the first rounded to an eval step, the others its multiples."""
    want = [count(p) for p in points.split(',')]
    ratios = [w / want[0] for w in want]
    check(WHO, (all(r == round(r) for r in ratios) and ratios == sorted(set(ratios)),
                f"points must rise, each a multiple of the first, got {points}"))
    first = max(1, round(want[0] / tokens_per_step(cfg) / cfg['eval_interval'])) * cfg['eval_interval']
    return [round(r) * first for r in ratios]


def pilot_best(recs, pre):
    """The pilot's pre-training pick: of its runs that did not diverge, the lowest final eval loss; None until every
    pilot run is recorded (or diverged), or if all diverged."""
    if not all(s.name in recs or s.name + '.diverged' in recs for s in pre):
        return None
    ok = [s for s in pre if s.name in recs]
    return min(ok, key=lambda s: recs[s.name][1][-1]['loss']) if ok else None


def recipe(s):
    """The settings of a pilot run that the later phases take: its lr, and its dropout where it set one."""
    return [a for a in s.cmd if a.startswith(('--learning_rate=', '--dropout='))]


def tuning_model(cfg, recs):
    """The pre-training whose model the pilot's fine-tuning lrs are tried on (None until it is known)."""
    pre = pilot_steps(cfg, recs)
    if pilot_glue_model == 'first':
        return pre[0]
    return pilot_best(recs, pre) if len(pre) > len(pilot_lrs.split(',')) or not pilot_dropout else None


def glue_pick(cfg, recs, model):
    """The fine-tuning lr of the best score (the mean over pilot_tasks, fine-tuning seed 1) of model's pilot
    fine-tunes, a tie the lower lr; None until all are recorded."""
    scores = {}
    for g in pilot_glue_lrs.split(','):
        (s,) = finetunes(model, float(g), glue_seeds.split(',')[:1], cfg, on=pilot_tasks or tasks)
        scores[float(g)] = glue4(recs[s.name], s.tasks, seed_of(s))['score'] if s.name in recs else None
    return max(scores, key=lambda g: (scores[g], -g)) if None not in scores.values() else None


def pilot_picks(cfg, recs):
    """(the recipe: the pre-training settings of the pilot's pick, the fine-tuning lr, the untrained model's own
    fine-tuning lr) that the pilot's records pick by its rules (docs/study_small.md, docs/study_laptop.md), each None
    until its records are there."""
    pre, model = pilot_steps(cfg, recs), tuning_model(cfg, recs)
    best = pilot_best(recs, pre)
    if pilot_dropout and len(pre) == len(pilot_lrs.split(',')):
        best = None  # the run with pilot_dropout is still to come
    return best and recipe(best), model and glue_pick(cfg, recs, model), glue_pick(cfg, recs, init_step(cfg, seed))


def plan(cfg, recs, which):
    """The steps of a phase in the order they start (the pilot's and the calibration's pre-trainings first; the
    comparison's models one by one, each followed by its fine-tunes and probe); (None, why) for a phase that waits."""
    g_seeds = glue_seeds.split(',')
    if which == 'pilot':  # the fine-tuning lrs are tried on the untrained model and one pilot run's, once it is known
        pre, init, model = pilot_steps(cfg, recs), init_step(cfg, seed), tuning_model(cfg, recs)
        models = [init] if not model or model.name + '.diverged' in recs else [model, init]  # then set glue_lr by hand
        if pilot_glue_model == 'best':
            models = models if model else []  # the fine-tunes after every pre-training: a deadline cuts them first
        return pre + [init] + [s for g in pilot_glue_lrs.split(',') for p in models
                               for s in finetunes(p, float(g), g_seeds[:1], cfg, on=pilot_tasks)]
    if which == 'comparison' and not tokens:  # the laptop study's: its budget is the calibration's finding
        return None, NO_PLAN
    rec, g_lr, g_init = pilot_picks(cfg, recs)
    if learning_rate:
        rec = [a for a in rec or [] if not a.startswith('--learning_rate=')] + [f'--learning_rate={learning_rate}']
    g_lr = glue_lr or g_lr
    if not (rec and g_lr):
        return None, "waits for the pilot's records (--phase=pilot), or set --learning_rate and --glue_lr"
    if which == 'calibration':  # data_dir's run and the untrained model, then each of the other corpora's run
        snaps = calibration_points(cfg)
        runs = [pretraining(f"calib{corpus_tag(d)}_s{seed}", cfg, ['--attention_type=original', *rec,
                                                                    f'--checkpoint_interval={snaps[0]}',
                                                                    f'--seed={seed}'], snaps[-1], d)
                for d in ['', *filter(None, corpora.split(','))]]
        init = init_step(cfg, seed)
        own = finetunes(init, g_init, g_seeds, cfg, on=calib_tasks) if init_own_lr and g_init not in (None, g_lr) \
            else []
        of = lambda pre: [s for st in snaps for s in (split_finetunes if st == snaps[-1] else finetunes)(
            pre, g_lr, g_seeds, cfg, snapshot=st, on=calib_tasks)] + (
            [probe_step(pre, cfg, st) for st in snaps] if probes else [])
        return [runs[0], init] + split_finetunes(init, g_lr, g_seeds, cfg, on=calib_tasks) + own + (
            [probe_step(init, cfg)] if probes else []) + of(runs[0]) + [s for p in runs[1:] for s in [p] + of(p)]
    n = max(1, round(count(tokens) / tokens_per_step(cfg) / cfg['eval_interval'])) * cfg['eval_interval']
    pres = [init_step(cfg, sd) if arm == 'untrained' else pretraining(f"{arm}_s{sd}", cfg, [
        *ARMS[arm][1], *rec, '--checkpoint_interval=0', f'--seed={sd}'], n)
        for sd in seeds.split(',') for arm in arms.split(',')]
    follow = lambda p: finetunes(p, g_lr, g_seeds, cfg) + ([probe_step(p, cfg)] if probes else [])
    return [s for p in pres for s in [p] + follow(p)]  # whole models, seed by seed: a cut call leaves no model half-used


def corpus_tag(folder):
    """'' for data_dir; '_<its folder name>' for another corpus (calib_english-glue-0p5_s1)."""
    return '' if not folder else '_' + re.sub(r'[^A-Za-z0-9-]', 'p', os.path.basename(os.path.normpath(folder)))


def arm_of(name):
    """The comparison's (arm, seed) of a pre-training's name; init_s3 is the untrained arm's."""
    arm, _, sd = name.rpartition('_s')
    return ('untrained' if arm == 'init' else arm), sd


# ----------------------------------------------------------------------------- records
def read_records():
    """{name: record} of <records>/: a pre-training's (head, evals), a fine-tune's JSON, a diverged pilot run's
    JSON. A damaged one: one line."""
    recs = {}
    for f in sorted(os.listdir(records)) if os.path.isdir(records) else []:
        path = os.path.join(records, f)
        if f.endswith(('.jsonl', '.json')) and os.path.isdir(path):
            raise SystemExit(f"{WHO}: {path} is a folder, where a record of that name would be: move it away")
        if f.endswith(('.jsonl', '.json')) and (clash := misnamed(recs, f)):
            raise SystemExit(f"{WHO}: {records}/ {clash}: move the file that is not the run's away")
        stem = f.rsplit('.', 1)[0]
        if f.endswith('.jsonl'):
            recs[stem] = read_record(path, WHO)
        elif f.endswith('.json'):
            recs[stem] = read_json_record(path)
    return recs


def misnamed(names, f):
    """What is wrong with a record named f beside the records `names` (their names without .json/.jsonl), or None:
    one record a name (which one would be the run's?), one outcome a run (a record or a .diverged.json), and the kind
    its name says (a rerun's record is a .jsonl)."""
    stem = f.rsplit('.', 1)[0]
    run = stem.removesuffix('.diverged')
    if stem in names:
        return f"holds both {stem}.json and {stem}.jsonl"
    if (run + '.diverged' if run == stem else run) in names:
        return f"holds both a record and a .diverged.json of {run}"
    if f.endswith('.json') and re.search(r'\.rerun\d+$', stem):
        return f"holds {f}, named as a pre-training run again, whose record is a .jsonl"
    return None


def read_json_record(path, shown=None):
    """A JSON record of <records>/, read by its kind's one reader (a fine-tune's: study_glue's; a probe's; a diverged
    pilot run's); one that does not fit: one line naming it as `shown` (a member of an archive being unpacked)."""
    shown = shown or path
    try:
        if path.endswith('.probe.json'):
            return read_checked(path, PROBE_RECORD, WHO)
        if not path.endswith('.diverged.json'):
            return study_glue.read_glue_record(path, WHO)
        if not os.path.basename(path).startswith('pilot_'):  # only a pilot pre-training can diverge and be a result
            raise SystemExit(f"{WHO}: {path} is not a whole study record (only a pilot run can diverge): restore it "
                             f"(git checkout {path}) or move it away and run again")
        r = read_checked(path, DIVERGED_RECORD, WHO)
        if not DIVERGED.search(r['message']):  # what diverged() writes: train.py's line of a non-finite loss
            raise SystemExit(f"{WHO}: {path} says {r['message'][:60]!r}, which is no divergence: move it away (the "
                             "run is made again)")
        return r
    except SystemExit as e:
        raise SystemExit(str(e).replace(path, shown))


def other_settings(config, data, s):
    """What makes a run of `config` on the data of fingerprint `data` another run than the step s: the same data
    unpacked elsewhere is the same (its fingerprint decides: in a training call the step's own corpus's, else one the
    records name)."""
    same = data == FOLDER_DATA[s.data] if FOLDER_DATA else data in DATA
    return [c for c in differ(config, s.cmd) if not c.startswith('dataset ') or not same]


def done(s, recs):
    """The step's record is there, and of these settings (another one is refused: nothing is overwritten)."""
    r = recs.get(s.name)
    if s.kind == 'probe':  # probe.py has no settings of the study's: its record is the result, of this model point
        if r and (r.get('model'), r.get('step')) != (s.of, s.step):
            raise SystemExit(f"{WHO}: {s.record} holds the probes of {r.get('model')} at step {r.get('step')}, not of "
                             f"{s.of} at step {s.step}: move it away")
        return r is not None
    if s.kind != 'glue':
        if (d := recs.get(s.name + '.diverged')) is not None:  # the run diverged: of these settings?
            made = d.get('command', '').split()[2:]  # python train.py <its settings>
            try:
                have = made and configure({**script_defaults(os.path.join(ROOT, 'train.py')), 'device': ''}, argv=made)
            except SystemExit as e:
                raise SystemExit(f"{WHO}: {os.path.join(records, s.name)}.diverged.json: its command does not fit "
                                 f"train.py ({str(e)[:200]}): move it away")
            if have and (changed := [c for c in differ(have, s.cmd) if not c.startswith('dataset ')]):
                raise SystemExit(f"{WHO}: {os.path.join(records, s.name)}.diverged.json is a run of other settings "
                                 f"({', '.join(changed)}): move it away")
            return True
        if r and (changed := other_settings(r[0]['config'], r[0].get('data'), s)):
            raise SystemExit(f"{WHO}: {s.record} is a run of other settings ({', '.join(changed)}): move it away")
        if r and r[1][-1]['step'] != s.step:  # a run's record is written when it ends: at its last step
            raise SystemExit(f"{WHO}: {s.record} ends at step {r[1][-1]['step']}, not at its run's last step {s.step} "
                             f"(cut or edited): restore it (git checkout {s.record}) or move it away")
        return r is not None
    if r is None:
        return False
    if not same_request(r['request'], s.cmd):
        raise SystemExit(f"{WHO}: {s.record} was made with other settings "
                         f"({' '.join(f'--{k}={v}' for k, v in r['request'].items())}): move it away")
    return True


def unpack_archive(path):
    """--unpack: a GPU run's records.tar into <records>/ (studies/carry.py), each member read by its kind's reader,
    a pre-training's a run of this study's base config."""
    def member(p, shown):
        if not p.endswith('.jsonl'):
            return read_json_record(p, shown)
        made = read_record(p, WHO)[0].get('command', '').split()[2:3]  # python train.py <its base config> ...
        if [os.path.normpath(m) for m in made] != [os.path.normpath(base)]:
            raise SystemExit(f"{WHO}: {shown} is a run of {made[0] if made else 'no base config'}, not of this "
                             f"study's {base} (another study's records?)")

    def names(new):  # beside the records there, each new one named as read_records wants it
        have = {f.rsplit('.', 1)[0] for f in os.listdir(records) if f.endswith(('.json', '.jsonl'))} \
            if os.path.isdir(records) else set()
        for f in sorted(new):
            if clash := misnamed(have, f):
                return clash
            have.add(f.rsplit('.', 1)[0])
    new, same = unpack_records(path, records, member, WHO, names)
    print(f"{WHO}: {len(new)} records unpacked into {records}/ ({len(same)} were there already): git add {records} and "
          f"rebuild the summary with python studies/study_small.py --train=False")


# ----------------------------------------------------------------------------- time model
def estimates(recs, device):
    """Each job kind's time on this device: the constants (TIMES), replaced by what the records of earlier runs on a
    device of the same name measured (the slowest seen)."""
    t = dict(TIMES['gpu' if device['type'] != 'cpu' else 'cpu' if dry else 'laptop'])
    heads = [r[0] for r in recs.values() if isinstance(r, tuple)]
    pre = [h['timing'] for h in heads if h.get('gpu') == device['name'] and 'timing' in h]
    for key, pick in (('fixed_cold', lambda x: x.get('cold') and not x['init']),
                      ('fixed_warm', lambda x: not x.get('cold') and not x['init']), ('end', lambda x: not x['init'])):
        seen = [x['end' if key == 'end' else 'fixed'] for x in pre if pick(x) and 'fixed' in x and 'end' in x]
        t[key] = max(seen) if seen else t[key]
    rates = [x['tokens_per_s'] for x in pre if x.get('tokens_per_s')]
    t['tokens_per_s'] = min(rates) if rates else t['tokens_per_s']
    t['init'] = max([x['job_s'] for x in pre if x['init']] or [t['init']])
    mine = [r for r in recs.values() if isinstance(r, dict) and r.get('gpu') == device['name'] and 'job_s' in r]
    fts = [r for r in mine if isinstance(r.get('runs'), dict)]
    t['glue'] = max([r['job_s'] for r in fts] or [t['glue']])
    t['probe'] = max([r['job_s'] for r in mine if r.get('script') == 'probe.py'] or [t['probe']])
    for k in [k for k in t if k.startswith('glue_')]:  # per task: each fine-tune's own seconds
        t[k] = max([x['seconds'] for r in fts for x in r['runs'].get(k[5:], {}).values() if 'seconds' in x] or [t[k]])
    return t


def estimate(s, t, cold):
    if s.kind == 'glue' and f'glue_{s.tasks.split(",")[0]}' in t:
        return time_scale * sum(t[f'glue_{x}'] for x in s.tasks.split(','))
    if s.kind != 'pretrain':
        return time_scale * t[s.kind]
    left = s.tokens * (1 - trained(s) / s.step)  # a run cut earlier resumes from its checkpoint
    return time_scale * (t['fixed_cold' if cold else 'fixed_warm'] + left / t['tokens_per_s'] + t['end'])


def trained(s):
    """The steps a pre-training cut earlier has done (its last eval; 0 if it has not started)."""
    try:
        return min(s.step, read_evals(s.folder)[-1]['step']) if os.path.exists(os.path.join(s.folder, 'ckpt.pt')) \
            else 0
    except (SystemExit, IndexError):
        return 0


# ----------------------------------------------------------------------------- the run
class Runner:
    """One GPU run's jobs: which may start when (may_start, asked by run_jobs), each one's record as it ends (and the
    bundle of the run's records in `out`)."""

    def __init__(self, recs, device, t, u, data):
        self.steps, self.recs, self.device, self.t, self.u, self.data = {}, recs, device, t, u, data
        self.started, self.finished, self.dropped, self.written, self.made = {}, set(), {}, [], {}
        self.paused = set()  # the pre-trainings paused at a snapshot for its fine-tunes (device=cpu: pause_step)
        self.round = set()  # the names of the jobs given to run_jobs now
        self.stopped = []  # the jobs running at stop_s
        self.compile = device['type'] != 'cpu' and base_config().get('compile', True)
        self.compiled = False  # a compiled pre-training ran here: the next one compiles from the cache
        self.overlap = overlap and phase == 'calibration'

    def drop(self, s, why):
        self.dropped[s.name] = why
        print(f"  {time.monotonic() - T0:5.0f} s: left for the next run: {s.name} ({why})", flush=True)
        return False

    def may_start(self, job, running):
        s, now = self.steps[job.name], time.monotonic() - T0
        busy = lambda *kinds: [n for n in running if self.steps[n].kind in kinds]
        if s.kind in FOLLOW:
            if s.owner in self.dropped:
                return self.drop(s, f"{s.owner} did not run")
            if not model_ready(s):  # its pre-training runs in this round: wait for it (paused: the next round)
                return False if s.owner in self.paused else None if s.owner in self.round and \
                    s.owner not in self.finished else self.drop(s, "its model is missing")
            if len(busy(*FOLLOW)) >= jobs:
                return None
        if s.kind == 'pretrain' and busy('pretrain') or not self.overlap and (
                s.kind == 'pretrain' and busy(*FOLLOW) or s.kind in FOLLOW and busy('pretrain')):
            return None  # one pre-training at a time; without overlap no fine-tune beside it (init: one eval, any time)
        cold = self.compile and not self.compiled and s.kind == 'pretrain'
        est, tail = estimate(s, self.t, cold), 0.0
        if s.kind == 'pretrain' and device == 'cuda':  # no model comes back from the GPU machine: the fine-tunes of
            # its final model follow it; without overlap, every pending one
            after = [x for x in self.steps.values() if x.kind in FOLLOW and x.name not in self.started and
                     x.name not in self.dropped and x.owner not in self.dropped and
                     (x.owner == s.name and (not self.overlap or x.step == s.step) or
                      not self.overlap and x.owner in self.finished)]
            tail = math.ceil(len(after) / jobs) * max(estimate(x, self.t, False) for x in after) if after else 0.0
        need = est + tail
        if s.kind == 'pretrain' and device == 'cpu':  # its checkpoint stays here: a run longer than a call starts if
            need = min(need, time_scale * (self.t['fixed_warm'] + MIN_CPU_S))  # some training fits (cut, resumed)
        if now + need > budget_s:
            return self.drop(s, f"~{est + tail:.0f} s estimated, {max(0.0, budget_s - now):.0f} s left")
        self.started[s.name] = (time.time(), len(running), cold)
        self.paused.discard(s.name)
        self.compiled |= cold
        print(f"  {now:5.0f} s: {s.name}, ~{est:.0f} s" + (f" (+ ~{tail:.0f} s of fine-tunes after it)" if tail else
                                                         '') + (f" beside {len(running)}" if running else ''),
              flush=True)
        return True

    def made_by(self, s):
        """The record of the run that made the model of the fine-tune or probe s, from the model's own run id (in its
        result): the first run's or a rerun's, an earlier call's too; before that run has a record, the one it
        will have."""
        res = read_json(os.path.join(s.folder, 'glue', 'glue_results.json') if s.kind == 'glue' else
                        os.path.join(s.folder, 'probe.json'), f'{WHO} result')
        model = (res.get('protocol') or {}).get('pretrained') if s.kind == 'glue' else res.get('pretrained')
        run_id = model.get('run_id') if isinstance(model, dict) else None
        named = sorted(n for n, r in self.recs.items() if isinstance(r, tuple) and run_id and r[0].get('run_id') ==
                       run_id and (n == s.owner or n.startswith(s.owner + '.rerun')))
        return named[0] if named else self.made.get(s.owner, s.owner)

    def finish(self, s):
        """The job ended well: its record written, and the run's records bundled into `out`."""
        start, beside, cold = self.started[s.name]
        job_s = round(time.time() - start, 1)
        if s.kind == 'glue':
            write_glue_record('glue', s.cmd, s.folder, s.record, {
                'gpu': self.device['name'], 'job_s': job_s, 'jobs_beside': beside, 'model': s.of,
                **({'threads': self.device['threads']} if 'threads' in self.device else {}),
                'step': s.step, 'tokens': s.tokens, 'pretrained_by': self.made_by(s)})
            path = s.record
        elif s.kind == 'probe':
            r = read_json(os.path.join(s.folder, 'probe.json'), f'{WHO} probe result')
            r.update(gpu=self.device['name'], job_s=job_s, model=s.of, step=s.step, tokens=s.tokens,
                     pretrained_by=self.made_by(s))
            write_json(s.record, r)
            path = s.record
        else:
            path, paused = s.record, trained(s) < s.step
            if s.name in self.recs:  # made again for its missing fine-tunes: the first record stays; a rerun
                run_id = (log_head(os.path.join(s.folder, 'log.jsonl')) or {}).get('run_id')  # paused before (this
                same = sorted(n for n, r in self.recs.items() if n.startswith(s.name + '.rerun') and run_id and
                              isinstance(r, tuple) and r[0].get('run_id') == run_id)  # call or another) keeps its own
                k = 1
                while not same and os.path.exists(path := os.path.join(records, f"{s.name}.rerun{k}.jsonl")):
                    k += 1
                path = os.path.join(records, same[0] + '.jsonl') if same else path
            elif paused:  # a first run's record is written once it ends (a record is a finished run)
                self.paused.add(s.name)
                return f"paused at step {trained(s)} for its snapshot's fine-tunes ({job_s:.0f} s)"
            self.made[s.name] = os.path.basename(path)[:-len('.jsonl')]  # a rerun's record: at each pause too, so
            write_record(path, s.folder, ' '.join(['python train.py', *s.cmd]), self.u[s.data], {  # its fine-tunes
                'gpu': self.device['name'], 'data': self.data[s.data], 'timing': run_timing(s, start, job_s, cold),
                **({'threads': self.device['threads']} if 'threads' in self.device else {})})  # name it
        paused = s.kind not in FOLLOW and paused
        (self.paused if paused else self.finished).add(s.name)  # a pause ends when it starts again (may_start)
        self.written += [path] if path not in self.written else []
        bundle(self.written, [x for x in self.steps.values() if x.name in self.started])
        name = os.path.basename(path).rsplit('.json', 1)[0]
        why = f", paused at step {trained(s)} for its snapshot's fine-tunes" if paused else ''
        self.recs[name] = read_record(path, WHO) if path.endswith('.jsonl') else read_json_record(path)
        self.t = estimates(self.recs, self.device)  # what this job took counts from now on
        return f"{path}{why} ({job_s:.0f} s)"


def model_ready(s):
    """A fine-tune's model is here: a snapshot (written whole), or the checkpoint of a finished run."""
    if not os.path.exists(s.model):
        return False
    if os.path.basename(os.path.dirname(s.model)) == 'snapshots':
        return True
    try:
        return read_evals(os.path.dirname(s.model))[-1]['step'] >= s.step
    except SystemExit:
        return False


def run_timing(s, start, job_s, cold):
    """A pre-training's times from its log: start-up to the first eval (compiling), tokens/s after it, the end; and
    the median training step (the equal-GPU-time endpoint's)."""
    evals, rates = [], []
    with open(os.path.join(s.folder, 'log.jsonl')) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get('type') == 'eval' and 'time' in r:
                evals.append(r)
            elif r.get('type') == 'train' and r.get('tokens_per_s'):
                rates.append(r['tokens_per_s'])
    out = {'job_s': job_s, 'cold': cold, 'init': s.kind == 'init'}
    if evals and evals[0]['time'] < start:  # resumed: its earlier calls' clock is not this one's
        out.update(resumed=True, end=max(0.0, round(start + job_s - evals[-1]['time'], 1)))  # a clock stepped back
    elif evals:
        out.update(fixed=max(0.0, round(evals[0]['time'] - start, 1)),
                   end=max(0.0, round(start + job_s - evals[-1]['time'], 1)))
    if len(evals) >= 2 and evals[-1]['time'] > evals[0]['time'] and 'resumed' not in out:
        out['tokens_per_s'] = max(1, round(s.tokens / s.step * (evals[-1]['step'] - evals[0]['step']) /
                                           (evals[-1]['time'] - evals[0]['time'])))
    elif rates:  # resumed, or evals within one tick of the log's 0.1 s clock: the steps' own median rate
        out['tokens_per_s'] = round(float(np.median(rates)))
    if rates:
        out['ms_per_step'] = round(1000 * s.tokens / s.step / float(np.median(rates)), 3)
    return out


def bundle(written, started):
    """The records the run wrote as one file in `out` (the device tool brings back at most 8 files), and its jobs'
    logs; rewritten whole after every job, so that a run killed at the limit leaves all it finished."""
    atomic_write(os.path.join(out, 'records.tar'), tar_writer([(p, os.path.basename(p)) for p in written]))
    logs = [(os.path.join(s.folder, f), f"{s.name}/{f}") for s in started
            for f in ('job.txt', 'log.jsonl') if os.path.exists(os.path.join(s.folder, f))]
    atomic_write(os.path.join(out, 'logs.tar.gz'), tar_writer(logs, 'w:gz'))


def command(s, todo):
    if s.kind == 'probe':
        return ['probe.py', f'--init_from={s.model}', f'--out_dir={s.folder}', f'--data_dir={glue_dir}',
                f"--device={'cpu' if dry else device}"]
    if s.kind == 'glue':
        return ['finetune_glue.py', f'--init_from={s.model}', *s.cmd, f'--out_dir={s.folder}/glue',
                f'--data_dir={glue_dir}']
    # a cut run is resumed only under its own settings: its record would describe a run it was not
    resume = os.path.exists(os.path.join(s.folder, 'ckpt.pt'))
    head = resume and (log_head(os.path.join(s.folder, 'log.jsonl')) or run_state(s.folder))  # no log: ckpt.pt's
    if head and (changed := other_settings(head['config'], head.get('data'), s)):
        raise SystemExit(f"{WHO}: {s.folder} holds a cut run of other settings ({', '.join(changed)}) than "
                         f"{s.name}'s: move it away (the next call starts the run again)")
    return ['train.py', *s.cmd, f'--out_dir={s.folder}'] + (['--init_from=resume'] if resume else []) + (
        [f'--pause_at={k}'] if (k := pause_step(s, todo)) else [])


def run_state(folder):
    """The settings and data of the run a job folder's ckpt.pt holds (read where its log is gone)."""
    try:
        return load_checkpoint(os.path.join(folder, 'ckpt.pt'), resume=True)
    except SystemExit as e:
        raise SystemExit(f"{WHO}: {str(e).removesuffix(': use another checkpoint')}; move {folder} away (the next "
                         "call starts the run again)")


def pause_step(p, todo):
    """device=cpu: the first snapshot of the pre-training p, past where it stands, with fine-tunes to run. It pauses
    there (saved) and they run before it goes on, so that every call records fine-tunes, also where out_dir is not
    kept between calls (the run is then made again from its start, bit for bit on the same CPU, torch and threads)."""
    at = [s.step for s in todo if s.owner == p.name and trained(p) < s.step < p.step]
    return min(at) if device == 'cpu' and at else 0


class HardStop(BaseException):
    """stop_s reached (SIGALRM): run_jobs stops the running jobs, then this ends the run. A BaseException, as
    KeyboardInterrupt is: the alarm comes anywhere, and a handler of Exception (a checkpoint read's) must not make
    it another error."""


def to_run(steps, recs, runner):
    """The steps whose records are missing and that this run has not left out; first, a recorded pre-training whose
    fine-tunes are missing and whose model is not here (a fresh GPU machine) is made again."""
    todo = [s for s in steps if not done(s, recs) and s.name not in runner.dropped]
    again = [p for p in steps if p.kind not in FOLLOW and p not in todo and p.name not in runner.finished and
             p.name not in runner.dropped and any(s.owner == p.name and not model_ready(s) for s in todo)]
    return again + todo


def diverged(e, runner):
    """A pilot run whose loss went non-finite is a result (that lr diverged): recorded, and the others go on."""
    m = re.match(rf"{WHO}: (\S+) failed \(exit \d+\): (.*)", str(e))
    s = runner.steps.get(m.group(1)) if m else None
    if not (s and s.name.startswith('pilot_') and s.kind == 'pretrain' and DIVERGED.search(m.group(2))):
        return False
    path = os.path.join(records, s.name + '.diverged.json')
    write_json(path, {'message': m.group(2), 'command': ' '.join(['python train.py', *s.cmd]),
                      'gpu': runner.device['name']})
    runner.finished.add(s.name)
    runner.written.append(path)
    bundle(runner.written, [x for x in runner.steps.values() if x.name in runner.started])
    print(f"  {s.name} diverged: {m.group(2)}", flush=True)
    return True


def run_phase(cfg, dev, u, data):
    """The phase's jobs whose records are missing, each only if it fits before budget_s; at stop_s every running job
    is stopped. In rounds: a pilot run that diverges stops the round (run_jobs stops every job on a failure), and the
    next round goes on without it. Returns the runner and whether it stopped at stop_s."""
    recs = read_records()
    runner = Runner(recs, dev, estimates(recs, dev), u, data)
    bundle([], [])  # out holds this run's records.tar from the start, empty until a job ends

    def stop(signum, frame):
        raise HardStop

    signal.signal(signal.SIGALRM, stop)
    # to the millisecond (alarm() rounds up to a whole second, and a job ending in that second would escape it)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, stop_s - (time.monotonic() - T0)))
    try:
        while True:
            steps = plan(cfg, recs, phase)
            if isinstance(steps, tuple):
                raise SystemExit(f"{WHO}: the {phase} {steps[1]}")
            todo = to_run(steps, recs, runner)
            if not runner.steps:
                again = [s.name for s in todo if done(s, recs)]
                print(f"{WHO}: {phase}: {len(steps)} jobs, {len(steps) - len(todo) + len(again)} recorded in "
                      f"{records}/; {len(todo)} to run" + (f" ({', '.join(again)} again: their models' fine-tunes "
                                                            "are missing)" if again else '') +
                      f", {jobs} fine-tunes at most at once, each only if it ends by {budget_s:.0f} s (all stop at "
                      f"{stop_s:.0f} s)", flush=True)
            runner.steps.update({s.name: s for s in steps + todo})
            if not todo:
                break
            n, runner.round = len(runner.finished), {s.name for s in todo}
            try:
                run_jobs([Job(s.name, s.folder, 'job.txt', command(s, todo), partial(runner.finish, s))
                          for s in todo], jobs + 2 if device == 'cuda' else 1, threads, WHO, runner.may_start)
            except SystemExit as e:
                if not diverged(e, runner):
                    raise
            recs = read_records()
            runner.recs.update(recs)
            if len(runner.finished) == n:
                break
    except HardStop:
        runner.stopped += [n for n in runner.started if n not in runner.finished]
        again = ("the next call resumes a pre-training from its checkpoint where out_dir keeps it, and starts a "
                 "fine-tune again" if device == 'cpu' else "the next run starts them again")
        print(f"{WHO}: stopped at {stop_s:.0f} s: {', '.join(runner.stopped) or 'nothing'} stopped while running "
              f"({again}); the finished jobs are recorded", flush=True)
        return runner, True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return runner, False


# ----------------------------------------------------------------------------- the device and the inputs
def device_check():
    """The device, named (the records and the summary name it): a GPU, or the CPU of a dry run."""
    if dry:
        return {'type': 'cpu', 'name': f"{cpu_name()} (CPU, dry)"}
    import torch
    if device == 'cpu':
        n = threads or torch.get_num_threads()
        print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, {n} threads a job; torch {torch.__version__}; "
              f"{shutil.disk_usage(ROOT).free / 2 ** 30:.0f} GiB of disk free", flush=True)
        return {'type': 'cpu', 'name': cpu_name(), 'threads': n}
    if not torch.cuda.is_available():
        raise SystemExit(f"{WHO}: PyTorch sees no GPU: the study runs on one (docs/study_small.md); --dry=True runs "
                         "its plumbing on a CPU at toy sizes")
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.total_memory / 2 ** 30:.1f} GiB, {p.multi_processor_count} SMs; torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}; {os.cpu_count()} CPU cores; "
          f"{shutil.disk_usage(ROOT).free / 2 ** 30:.0f} GiB of disk free", flush=True)
    return {'type': 'cuda', 'name': p.name}


def glue_tasks():
    """The tasks whose GLUE files the jobs read: GLUE-4's, and with probes probe.py's four (its baselines)."""
    return list(dict.fromkeys(tasks.split(',') + (list(PROBE_TASKS) if probes else [])))



def print_prediction(cfg):
    """The phase's jobs that its records lack, each with its estimate, and the time of the whole (pre-trainings one
    after the other, then the fine-tunes `jobs` at a time: an upper bound when fine-tunes overlap)."""
    recs = read_records()
    names = [h.get('gpu') for h in (r[0] for r in recs.values() if isinstance(r, tuple)) if h.get('gpu')]
    device_ = {'type': 'cpu' if dry or device == 'cpu' else 'cuda',
               'name': max(set(names), key=names.count) if names else '-'}
    steps = plan(cfg, recs, phase)
    if isinstance(steps, tuple):
        raise SystemExit(f"{WHO}: the {phase} {steps[1]}")
    todo = [s for s in steps if not done(s, recs)]
    todo = [p for p in steps if p.kind not in FOLLOW and p not in todo and any(s.owner == p.name for s in todo)] + todo
    t = estimates(recs, device_)
    print(f"{WHO}: {phase}: {len(todo)} of {len(steps)} jobs to run; times of {device_['name']} from "
          f"{'its records' if names else 'the constants (no record names it)'}, x {time_scale}: " +
          ', '.join(f"{k} {v:g}" for k, v in t.items()))
    first, pre, glue = True, 0.0, [s for s in todo if s.kind == 'glue']
    for s in todo:
        e = estimate(s, t, first and s.kind == 'pretrain' and not dry)
        first &= s.kind != 'pretrain'
        pre += e if s.kind in ('pretrain', 'probe') else 0.0  # probes: one at a time, counted with these
        print(f"  {s.name}: ~{e:.0f} s" + (f" ({tokens_text(s.tokens)} tokens)" if s.kind == 'pretrain' else ''))
    rounds = lambda n: math.ceil(n / jobs) * estimate(glue[0], t, False) if n else 0.0
    last = max((s.step for s in todo if s.kind == 'pretrain'), default=-1)  # the calibration's run's last step
    if phase == 'pilot' and (pilot_dropout or pilot_glue_model == 'best'):
        print(f"{WHO}: (the pilot's later jobs, at its picks, are planned once the runs they follow are recorded)")
    print(f"{WHO}: ~{pre + rounds(len(glue)):.0f} s with every fine-tune after the pre-trainings "
          f"({pre:.0f} + {rounds(len(glue)):.0f})" + (
              f"; ~{pre + rounds(sum(s.step == last for s in glue)):.0f} s with the fine-tunes "
              "of the untrained model and the earlier snapshots beside the pre-training (overlap), those of its last "
              "after it" if overlap and phase == 'calibration' else '') + f"; budget_s {budget_s:g} (the start-up, "
          "~10 s, comes first)")


# ----------------------------------------------------------------------------- the summary
def seed_of(s):
    return next(a for a in s.cmd if a.startswith('--seeds=')).split('=', 1)[1]


def per_seed(recs, fts):
    """{fine-tuning seed: {'score': the mean of its tasks (GLUE-4 for all four), 'tasks': {task: number}}} of the
    fine-tunes recorded (one model's, its tasks from one job or several)."""
    out = {}
    for s in (s for s in fts if s.name in recs):
        out.setdefault(seed_of(s), {}).update(glue4(recs[s.name], s.tasks, seed_of(s))['tasks'])
    return {sd: {'score': float(np.mean(list(x.values()))), 'tasks': x} for sd, x in out.items()}


def pooled_sd(groups):
    """The pooled standard deviation of groups of values (each model's fine-tuning seeds) and its degrees of freedom."""
    groups = [np.asarray(g, float) for g in groups if len(g) > 1]
    df = sum(len(g) - 1 for g in groups)
    return (float(np.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / df)), df) if df else (None, 0)


def pilot_summary(cfg, recs):
    pre, init = pilot_steps(cfg, recs), init_step(cfg, seed)
    if not any(s.name in recs or s.name + '.diverged' in recs for s in pre):
        return None
    runs = {}
    for s in pre:
        key = s.name[len('pilot_'):].rsplit('_s', 1)[0]  # lr1e-3, lr1e-3_d0
        row = {'lr': lr_of(s), 'dropout': float(next((a.split('=')[1] for a in s.cmd if a.startswith('--dropout=')),
                                                     cfg['dropout']))}
        if s.name + '.diverged' in recs:
            runs[key] = {**row, 'diverged': True, 'message': recs[s.name + '.diverged']['message']}
        elif s.name in recs:
            head, ev = recs[s.name]
            runs[key] = {**row, 'diverged': False, 'step': ev[-1]['step'], 'tokens': s.tokens,
                         'mlm_loss': ev[-1]['loss'], 'mlm_accuracy': ev[-1]['accuracy'],
                         'tokens_per_s': head.get('timing', {}).get('tokens_per_s')}
    model, glue, on = tuning_model(cfg, recs), {}, pilot_tasks or tasks
    for g in pilot_glue_lrs.split(','):
        row = {'lr': float(g)}
        for label, p in (('pilot_model', model), ('untrained', init)):
            row[label] = p and per_seed(recs, finetunes(p, float(g), glue_seeds.split(',')[:1], cfg, on=on)).get(
                glue_seeds.split(',')[0])
        glue[lr_tag(float(g))] = row
    best, g_lr, g_init = pilot_picks(cfg, recs)
    return {'tokens': pre[0].tokens, 'steps': pre[0].step, 'seed': seed, 'runs': runs,
            'best_run': (b := pilot_best(recs, pre)) and b.name, 'picked': best and ' '.join(best),
            'picked_lr': best and float(best[0].split('=')[1]), 'glue_model': model and model.name, 'glue_tasks': on,
            'glue': glue, 'picked_glue_lr': g_lr, 'untrained_glue_lr': g_init}


def gain_trend(points):
    """A task's gains against log2(tokens) (docs/study_laptop.md, fixed before the fine-tunes ran): the least-squares
    line's gain per doubling of the tokens with its 95% half-width, and, only where that interval lies above 0, the
    tokens at which the line reaches TREND_TARGET points: an extrapolation, for when no point is clear."""
    if len(points) < 3:
        return None
    a, b, h = line_fit([math.log2(t) for t, _ in points], [d for _, d in points])
    x = (TREND_TARGET - a) / b if b - h > 0 else None
    return {'per_doubling': b, 'half95': h, 'points': len(points),
            TREND_AT: round(2 ** x) if x is not None and x < 1000 else None}  # < 1000: 2 ** x stays a float


def calibration_summary(cfg, recs):
    """The untrained model and each snapshot: tokens seen, MLM loss and accuracy, the training hours to it, GLUE-4
    (where all four tasks ran), with calib_tasks fewer than tasks their mean (score, every point), and each task (mean
    over the fine-tuning seeds, and per seed); each snapshot's gain over the untrained model with the fine-tuning
    noise, also over the untrained model at its own fine-tuning lr where it ran (init_own_lr): a gain is clear only
    over both; the first token point of a clear gain. With probes, each point's probe numbers and their change from
    the untrained model's, and the baselines; with corpora, the same of each other corpus's run (under 'corpora', by
    folder name), against the same untrained model."""
    steps = plan(cfg, recs, 'calibration')
    if isinstance(steps, tuple) or not any(s.name in recs for s in steps):
        return None
    pres = [s for s in steps if s.kind == 'pretrain']
    out = calibration_of(cfg, recs, pres[0], steps)
    if len(pres) > 1:
        out['corpora'] = {corpus_tag(p.data)[1:]: calibration_of(cfg, recs, p, steps) for p in pres[1:]}
    return out


def calibration_of(cfg, recs, pre, steps):
    """calibration_summary of one pre-training `pre` of the plan's steps."""
    init, fts = next(s for s in steps if s.kind == 'init'), [s for s in steps if s.kind == 'glue']
    g_lr = lr_of(fts[0])
    head, evals = recs[pre.name] if pre.name in recs else ({}, [])
    rate = head.get('timing', {}).get('tokens_per_s')
    # calib_tasks other than tasks: their mean (the levers' score) at every point, its gain the primary criterion
    on = calib_tasks.split(',') if calib_tasks and set(calib_tasks.split(',')) != set(tasks.split(',')) else []

    def point(st, p, lr):
        ft = [s for s in fts if s.owner == p.name and s.step == (st or p.step) and lr_of(s) == lr]
        g = per_seed(recs, ft)
        ev = next((r for r in (recs[init.name][1] if st == 0 and init.name in recs else evals) if r['step'] == st),
                  None)
        whole = g and all(len(x['tasks']) == len(tasks.split(',')) for x in g.values())
        sub = {sd: float(np.mean([x['tasks'][t] for t in on])) for sd, x in g.items() if set(on) <= set(x['tasks'])} \
            if on else {}
        return {'tokens': st * tokens_per_step(cfg), 'step': st, 'glue_lr': lr, 'mlm_loss': ev and ev['loss'],
                'mlm_accuracy': ev and ev['accuracy'], 'train_hours': 0.0 if st == 0 else rate and
                round(st * tokens_per_step(cfg) / rate / 3600, 3),  # a run too short for two clocked evals: None
                'glue4': float(np.mean([x['score'] for x in g.values()])) if whole else None,
                'glue4_per_seed': {sd: x['score'] for sd, x in g.items()} if whole else {},
                'tasks': {t: float(np.mean([x['tasks'][t] for x in g.values() if t in x['tasks']]))
                          for t in tasks.split(',') if any(t in x['tasks'] for x in g.values())},
                'tasks_per_seed': {sd: x['tasks'] for sd, x in g.items()},
                **({'score': float(np.mean(list(sub.values()))) if sub else None, 'score_per_seed': sub} if on else {}),
                **({'probe': (r := recs.get(f"{model_point(p, cfg, st)[0]}.probe")) and {k: r[k] for k in PROBES}}
                   if probes else {})}
    points_ = [point(st, p, g_lr) for st, p in [(0, init)] + [(st, pre) for st in calibration_points(cfg)]]
    o = next((x for x in fts if x.owner == init.name and lr_of(x) != g_lr), None)  # init_own_lr's fine-tunes
    own = [point(0, init, lr_of(o))] if o else []
    keys = ['glue4', *(['score'] if on else []), *tasks.split(',')]
    values = lambda p, k: list(p[f'{k}_per_seed'].values()) if k in ('glue4', 'score') else \
        [x[k] for x in p['tasks_per_seed'].values() if k in x]
    noise = {k: dict(zip(('sd', 'df'), pooled_sd([values(p, k) for p in points_ + own]))) for k in keys}

    def gain(p, base, k):
        a, b, (sd, df) = values(p, k), values(base, k), (noise[k]['sd'], noise[k]['df'])
        if not (a and b and df):
            return None
        d, h = float(np.mean(a) - np.mean(b)), t_quantile(CLEAR, df) * sd * math.sqrt(1 / len(a) + 1 / len(b))
        whole = min(len(a), len(b)) >= len(glue_seeds.split(','))  # the plan's seeds on both sides, or not yet
        return {'diff': d, 'half95': h, 'clear': d - h > 0 and whole, 'seeds': [len(a), len(b)]}
    gains, first = [], {}
    for p in points_[1:]:
        row = {'tokens': p['tokens'], 'step': p['step']}
        for k in keys:
            row[k] = g = gain(p, points_[0], k)
            if g and own:
                g['over_own_lr'] = o = gain(p, own[0], k)
                g['clear'] = g['clear'] and (o is None or o['clear'])
            if g and g['clear'] and k not in first:
                first[k] = {'tokens': p['tokens'], 'diff': g['diff'], 'train_hours': p['train_hours']}
        if probes:  # one number per model (no seeds): the change alone
            a, b = p['probe'], points_[0]['probe']
            row['probe'] = a and b and {k: a[k] - b[k] for k in PROBES}
        gains.append(row)
    n_ft = len(glue_seeds.split(','))
    trend = {k: gain_trend([(r['tokens'], r[k]['diff']) for r in gains if r[k]]) for k in keys}
    sd_d = {k: noise[k]['sd'] and noise[k]['sd'] * math.sqrt(2 / n_ft) for k in keys}  # paired seeds, fine-tuning
    u = head.get('unigram_loss')  # noise alone
    return {'seed': seed, 'learning_rate': lr_of(pre), 'recipe': ' '.join(recipe(pre)), 'glue_lr': g_lr,
            'tokens_per_step': tokens_per_step(cfg), 'steps': pre.step, 'unigram_loss': u, 'tokens_per_s': rate,
            'plateau_exit_step': first_step_below(evals, u - drop) if evals else None,
            'final': evals and {'step': evals[-1]['step'], 'mlm_loss': evals[-1]['loss'],
                                'mlm_accuracy': evals[-1]['accuracy']} or None,
            **({'score_tasks': ','.join(on)} if on else {}),
            'points': points_, 'untrained_own_lr': own[0] if own else None, 'noise': noise, 'gain': gains,
            'first_clear': {k: first.get(k) for k in keys}, 'trend': trend,
            'seeds_for_delta': {k: sd_d[k] and {str(d): math.ceil(((1.96 + 0.84) * sd_d[k] / d) ** 2 + 2)
                                                for d in (1, 2, 3)} for k in keys},
            'curve': [{'step': r['step'], 'tokens': r['step'] * tokens_per_step(cfg), 'mlm_loss': r['loss'],
                       'mlm_accuracy': r['accuracy']} for r in evals],
            'reruns': {n: rerun(evals, recs[n][1]) for n in sorted(recs) if n.startswith(pre.name + '.rerun')},
            **({'baselines': baselines_of(recs, [s for s in steps if s.kind == 'probe'])} if probes else {})}


def baselines_of(recs, probe_steps):
    """The numbers that need no model (probe.py's baselines: STS-B Jaccard, MRPC and RTE majority), from the first
    probe record; every probe record must agree (the same GLUE files), else one line."""
    rs = [recs[s.name] for s in probe_steps if s.name in recs]
    keys = ('stsb_jaccard', 'mrpc_majority', 'rte_majority')
    if any({k: r[k] for k in keys} != {k: rs[0][k] for k in keys} for r in rs):
        raise SystemExit(f"{WHO}: the probe records in {records}/ disagree on the baselines: they read different GLUE "
                         "files; move the odd ones away")
    return rs and {'stsb_jaccard': rs[0]['stsb_jaccard'], 'mrpc_majority': rs[0]['mrpc_majority']['score'],
                   'rte_majority': rs[0]['rte_majority']['accuracy']} or None


def rerun(first, again):
    """A pre-training made again (its snapshots' fine-tunes name it): how far, its last loss, and whether every eval
    both made is the same (the same CPU, torch and threads: the same bits, so the same snapshots)."""
    old = {r['step']: (r['loss'], r['accuracy']) for r in first}
    return {'step': again[-1]['step'], 'loss': again[-1]['loss'],
            'as_first': all(old.get(r['step'], (r['loss'], r['accuracy'])) == (r['loss'], r['accuracy'])
                            for r in again)}


def comparison_summary(cfg, recs):
    """study_glue's summary of paired arms (per_arm, comparisons with the original, MLM at equal steps and at equal GPU
    time), with each run's plateau exit and its comparison, and the MLM loss at the cap's."""
    steps = plan(cfg, recs, 'comparison')
    if isinstance(steps, tuple):
        return None
    pres = [s for s in steps if s.kind not in FOLLOW]
    pre, glue, ms, exits, probed = {}, {}, {}, {}, {k: {} for k in PROBES}
    for p in (p for p in pres if p.name in recs):
        arm, sd = arm_of(p.name)
        head, ev = recs[p.name]
        pre.setdefault(arm, {})[sd] = ev
        made = lambda kind: [recs[s.name] for s in steps if s.kind == kind and s.owner == p.name and s.name in recs]
        for r in made('probe'):
            for k in PROBES:
                probed[k].setdefault(arm, {})[sd] = r[k]
        if p.kind == 'pretrain':
            exits.setdefault(arm, {})[sd] = first_step_below(ev, head['unigram_loss'] - drop)
            if head.get('timing', {}).get('ms_per_step'):
                ms.setdefault(arm, []).append(head['timing']['ms_per_step'])
        if runs := [r['runs'] for r in made('glue')]:
            glue.setdefault(arm, {})[sd] = {'runs': {t: {k: v for r in runs for k, v in r.get(t, {}).items()}
                                                     for t in tasks.split(',')}}
    if not pre:
        return None
    cap = next((p.step for p in pres if p.kind == 'pretrain'), 0)
    step_ms = {a: float(np.median(v)) for a, v in ms.items()}
    s = study_glue.summarize(pre, glue, {}, step_ms, cap, tasks, glue_seeds)
    loss = {a: {sd: v for sd, v in p['mlm_loss_at_cap'].items()} for a, p in s['per_arm'].items() if a != 'untrained'}
    for a in s['per_arm']:
        s['per_arm'][a].update(plateau_exit_step=exits.get(a), ms_per_step=step_ms.get(a),
                               **({'probe': {k: probed[k].get(a) for k in PROBES}} if probes else {}))
    for endpoint, values, log in (('mlm_loss_at_cap', loss, False), ('plateau_exit_step', exits, True),
                                  *((f'probe_{k}', probed[k], False) for k in PROBES if probes)):
        family = [c for a in values if a not in (study_glue.REFERENCE, 'untrained') and
                  (c := compare(values, a, log=log))]
        for c, p in zip(family, holm([c['p_t'] for c in family])):
            s['comparisons'].append({'endpoint': endpoint, **c, 'p_holm': p})
        if endpoint.startswith('probe_') and (c := compare(values, 'untrained')):  # outside the family, as GLUE-4's
            s['comparisons'].append({'endpoint': endpoint, **c, 'p_holm': None})
    g4 = {a: p['glue4'] for a, p in s['per_arm'].items() if p['glue4']}
    for a in (a for a in g4 if a != 'untrained'):  # secondary, outside the family: each arm's gain, each task's gap
        if c := compare(g4, a, ref='untrained'):
            s['comparisons'].append({'endpoint': 'glue4_over_untrained', **c, 'p_holm': None})
    for t in tasks.split(','):
        per_task = {a: {sd: x[t] for sd, x in p['glue4_tasks'].items()} for a, p in s['per_arm'].items()}
        for a in (a for a in per_task if a not in (study_glue.REFERENCE, 'untrained')):
            if c := compare(per_task, a):
                s['comparisons'].append({'endpoint': f'task_{t}', **c, 'p_holm': None})
    return {'tokens': cap * tokens_per_step(cfg), 'cap': cap, 'arms': arms.split(','), 'seeds': seeds.split(','),
            'partial': any(not done(x, recs) for x in steps),
            **{k: s[k] for k in ('step_ms', 'time_matched_steps', 'ratio_by_step') if k in s}}, s['per_arm'], \
        s['comparisons']


def missing_jobs(cfg, recs):
    out = []
    for which in ('pilot', 'calibration', 'comparison'):
        steps = plan(cfg, recs, which)
        if isinstance(steps, tuple):
            out.append(f"{which}: {steps[1]}")
        else:
            out += [f"{which}: {s.name}" for s in steps if not done(s, recs)]
    return out


def summarize(cfg, recs):
    gpus = {r[0].get('gpu') if isinstance(r, tuple) else r.get('gpu') for r in recs.values()}
    cmp_ = comparison_summary(cfg, recs)
    return {'gpu': sorted(g for g in gpus if g), 'model': {k: cfg[k] for k in ('n_layer', 'n_head', 'n_embd', 'n_inner',
                                                                                'block_size', 'batch_size', 'dtype')},
            'pilot': pilot_summary(cfg, recs), 'calibration': calibration_summary(cfg, recs),
            'comparison': cmp_ and cmp_[0], 'per_arm': cmp_[1] if cmp_ else {}, 'comparisons': cmp_[2] if cmp_ else [],
            'missing': missing_jobs(cfg, recs)}


# ----------------------------------------------------------------------------- main
def file_at(path):
    """The file that lies where the folder path, or a folder above it, would be made (None: it can be a folder)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return None if os.path.isdir(p) else p


def positive(text):
    """Whether text is a finite number > 0."""
    try:
        return 0 < float(text) < math.inf
    except ValueError:
        return False


def twice(text):
    """Whether a comma list of numbers names one number twice (1e-3 beside 0.001)."""
    numbers = [float(x) for x in text.split(',') if positive(x)]
    return len(set(numbers)) < len(numbers)


def from_clone(cfg):
    """Runs this command again from a clone of one commit (under out_dir/code), so that the code a long run trains
    with stays fixed while main changes: the commit of the phase's records, else HEAD (a tree with changes is
    refused: a run's record names its commit). Every path setting is made absolute, to stay in this tree."""
    git = lambda *a: subprocess.run(['git', '-C', ROOT, *a], capture_output=True, text=True)
    recs = read_records()
    steps = plan(cfg, recs, phase)
    seen = {c for st in ([] if isinstance(steps, tuple) else steps) if st.name in recs
            for c in [(recs[st.name][0] if isinstance(recs[st.name], tuple) else recs[st.name]).get('commit')] if c}
    check(WHO, (commit or len(seen) <= 1, f"the {phase}'s records name several commits ({', '.join(sorted(seen))}): set "
                                "--commit= to the one to run from"))
    sha = commit or (seen.pop() if seen else '')
    if not sha:
        check(WHO, (not git('status', '--porcelain', '--untracked-files=no').stdout,
                    "the tree has uncommitted changes: commit them (a run's record names the commit it ran from), "
                    "or set --clone=False"))
        sha = git('rev-parse', 'HEAD').stdout.strip()
    full = git('rev-parse', '--verify', '--quiet', sha + '^{commit}').stdout.strip()  # 7a2a283: its whole sha
    check(WHO, (full, f"{'--commit=' if commit else 'the records name commit '}{sha}, no commit of {ROOT}: give one of "
                      "its git log's"))
    sha = full
    dest = os.path.abspath(os.path.join(out_dir, 'code', sha[:12]))
    clone_at(sha, dest, WHO)  # whole, or made again
    paths = {k: os.path.abspath(globals()[k]) for k in ('records', 'figures', 'out_dir', 'data_dir', 'carry', 'out',
                                                        'work') if globals()[k]}
    paths.update(summary=summary and os.path.abspath(summary), glue_dir=glue_dir and os.path.abspath(glue_dir),
                 **({'corpora': ','.join(map(os.path.abspath, corpora.split(',')))} if corpora else {}))  # only if
    # set: a clone of a commit from before the setting refuses it as unknown
    args = [a if a.startswith('--') else os.path.relpath(os.path.abspath(a), ROOT) for a in sys.argv[1:]]
    print(f"{WHO}: running from {dest} (commit {sha[:12]})", flush=True)
    os.chdir(dest)
    os.execv(sys.executable, [sys.executable, os.path.join(dest, 'studies', 'study_small.py'), *args,
                              *[f'--{k}={v}' for k, v in paths.items()], '--clone=False'])


def main(given):
    global carry, data_dir, out_dir, records, summary, figures, out, glue_dir, DATA, FOLDER_DATA, budget_s, stop_s
    global arms, tasks, seeds, glue_seeds, pilot_tasks, calib_tasks
    if dry:
        for k, v in DRY.items():
            globals()[k] = globals()[k] if k in given else v
        paths = {'carry': 'carry', 'data_dir': 'data/english', 'out_dir': 'runs', 'records': 'records',
                 'summary': 'summary.json', 'figures': 'study_small'}
        for k, v in paths.items():
            globals()[k] = globals()[k] if k in given else os.path.join(work, v)
    out = out or os.environ.get('OUT') or os.path.join(work if dry else out_dir, 'out')
    if hours > 0:
        budget_s = stop_s = hours * 3600
    folders = [('work', work)] * dry + [('records', records), ('carry', carry), ('out_dir', out_dir), ('out', out),
                                        ('data_dir', data_dir)]
    # every comma list checked once (configurator.comma_list), set in its plain spelling: seed '01' is seed 1
    arms, tasks = (','.join(comma_list(WHO, k, v, names)) for k, v, names in
                   (('arms', arms, list(ARMS)), ('tasks', tasks, list(TASKS))))
    seeds, glue_seeds = (','.join(comma_list(WHO, k, v, numbers=True)) for k, v in
                         (('seeds', seeds), ('glue_seeds', glue_seeds)))
    pilot_tasks, calib_tasks = (v and ','.join(sorted(comma_list(WHO, k, v, tasks.split(',')), key=list(TASKS).index))
                                for k, v in (('pilot_tasks', pilot_tasks), ('calib_tasks', calib_tasks)))  # in
    # finetunes' order: a summary does not depend on the order they were given in either
    for k in ('pilot_lrs', 'pilot_glue_lrs', 'points') + (('corpora',) if corpora else ()):
        comma_list(WHO, k, globals()[k])
    check(WHO, (phase in ('pilot', 'calibration', 'comparison'), f"phase must be pilot, calibration or comparison, "
                                                                   f"got {phase!r}"),
          (phase != 'comparison' or tokens or not train, f"the comparison {NO_PLAN}"),
          *[(False, f"{k} must name a folder, and {f} is a file" if v.strip() else
             f"{k} is empty (an unset shell variable?): name a folder")
            for k, v in folders if not v.strip() or (f := file_at(v))],
          *[(False, f"{k} sets {', '.join(a)}, which the study sets itself (its plan, its names): drop it from {k}")
            for k, v, own in (('train_args', train_args, STUDY_TRAIN_KEYS), ('glue_args', glue_args, STUDY_GLUE_KEYS))
            if (a := [x for x in v.split() if x.split('=')[0][2:] in own])],
          (seed >= 0, f"seed must be a whole number >= 0, got {seed}"),
          (all(count(p) > 0 for p in points.split(',') + [pilot_tokens] + ([tokens] if tokens else [])),
           f"points, pilot_tokens and tokens must be token counts > 0, got {points!r}, {pilot_tokens!r} and {tokens!r}"),
          (jobs >= 1 and threads >= 0 and 0 < budget_s <= stop_s and time_scale > 0,
           "jobs must be >= 1, threads >= 0, 0 < budget_s <= stop_s, time_scale > 0"),
          (device in ('cuda', 'cpu'), f"device must be cuda or cpu, got {device!r}"),
          (pilot_glue_model in ('first', 'best'), f"pilot_glue_model must be first or best, got {pilot_glue_model!r}"),
          (hours >= 0, f"hours must be >= 0, got {hours:g}"),
          (not corpora or all(os.path.abspath(d) != os.path.abspath(data_dir) for d in corpora.split(',')) and len(
              {corpus_tag(d) for d in corpora.split(',')}) == len(corpora.split(',')),
           f"corpora must name folders other than data_dir, each folder name once, got {corpora!r}"),
          (pilot_dropout == '' or re.fullmatch(r'\d*\.?\d+', pilot_dropout) and float(pilot_dropout) < 1,
           f"pilot_dropout must be '' or a dropout in [0, 1), got {pilot_dropout!r}"),
          (learning_rate >= 0 and glue_lr >= 0, f"learning_rate and glue_lr must be > 0, or 0 for the pilot's pick, got "
                                                f"{learning_rate:g} and {glue_lr:g}"),
          (all(map(positive, (pilot_lrs + ',' + pilot_glue_lrs).split(','))),
           f"pilot_lrs and pilot_glue_lrs must be comma lists of learning rates > 0, got {pilot_lrs!r} and "
           f"{pilot_glue_lrs!r}"),
          (not any(twice(v) for v in (pilot_lrs, pilot_glue_lrs)),  # 1e-3 and 0.001: one run, planned twice
           f"pilot_lrs and pilot_glue_lrs must name each learning rate once, got {pilot_lrs!r} and {pilot_glue_lrs!r}"))
    if summary and not (unpack or prepare or predict):  # replaced at the end: a summary of this study's alone
        check_replaceable(summary, lambda o: {'pilot', 'calibration', 'comparison', 'missing'} <= o.keys(), WHO,
                          "summary of study_small.py's", f"--summary={summary}")
    if unpack:
        return unpack_archive(unpack) or 0
    if prepare:
        return prepare_carry(carry, data_dir, glue_dir, glue_tasks(), WHO) or 0
    glue_dir = glue_dir or os.path.join(carry, 'glue')
    cfg = base_config()
    if predict:
        return print_prediction(cfg) or 0
    if clone and train:
        from_clone(cfg)
    stopped = False
    if train:
        os.makedirs(out, exist_ok=True)
        interrupt.log_to(os.path.join(out, 'study_small.log'))  # all of it: the device tool returns only the end
        print(f"{WHO}: {' '.join(sys.argv[1:])} ({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
        dev = device_check()
        if dry:
            dry_inputs(work, carry, glue_tasks(), WHO)
        if os.path.isdir(os.path.join(carry, 'gpt2')):  # tiktoken cannot fetch the GPT-2 files offline
            os.environ.setdefault('GPT2_BPE_DIR', os.path.abspath(os.path.join(carry, 'gpt2')))
        os.environ['PYTHONUNBUFFERED'] = '1'
        unpack_data(carry, data_dir, cfg['block_size'], WHO)
        check_glue(glue_dir, glue_tasks(), carry, WHO)
        u, data, vocab = {}, {}, None  # per corpus: its U and its fingerprint, which its runs' records keep
        for d in [data_dir, *filter(None, corpora.split(','))]:
            try:  # the other corpora must have data_dir's vocabulary: the untrained model is theirs too
                _, val, meta = load_dataset(d, vocab, cfg['block_size'])
            except SystemExit as e:
                raise SystemExit(f"{WHO}: {e}")
            vocab = meta['vocab_size']
            u[d] = unigram_loss(d, cfg['block_size'], cfg['batch_size'], cfg['eval_iters'])
            data[d] = fingerprint(d, meta, val)
        DATA, FOLDER_DATA = set(data.values()), data
        runner, stopped = run_phase(cfg, dev, u, data)
        never = [x for x, st in runner.steps.items() if x not in runner.started and x not in runner.dropped and
                 not done(st, runner.recs)]  # the stop came before they were reached
        n, left = len(runner.written), list(runner.dropped) + runner.stopped + never
        print(f"{WHO}: this run recorded {n} job{'s' * (n != 1)} in {time.monotonic() - T0:.0f} s "
              f"({os.path.join(out, 'records.tar')}); left for the next run: {', '.join(left) or 'nothing'}",
              flush=True)
    try:
        recs = read_records()
        check(WHO, (recs, f"no record in {records}/: run a phase with --train=True first"))
        if not train:  # no data here: the records' one fingerprint says which data they ran on
            DATA = {r[0].get('data') for r in recs.values() if isinstance(r, tuple)} - {None}
        s = summarize(cfg, recs)
        report(s, len(glue_seeds.split(',')), drop)
        if summary:
            write_json(summary, s)
        if figures:
            figure(s, recs, [(' '.join(a[2:] for a in recipe(p)), recs[p.name][1]) for p in pilot_steps(cfg, recs)
                             if p.name in recs], tokens_per_step(cfg), tasks, seed, figures)
    except SystemExit as e:
        if not train:
            raise
        print(f"{WHO}: no summary after the run ({e}); its records are kept: --train=False makes it", flush=True)
    return 3 if stopped else 0


if __name__ == '__main__':
    given_ = {}
    configure(globals(), given=given_)
    with interrupt.stops_cleanly(WHO, "the running job saved and stopped, the finished ones are recorded: the same "
                                      "command resumes it from its checkpoint" if device == 'cpu' else
                                 "the running jobs stopped, the finished ones are recorded (and in records.tar): "
                                 "the same command continues where it stopped"):  # in the background too; SIGTERM
        sys.exit(main(given_))  # (a scheduler's stop) as well

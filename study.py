"""
The study (README "The study"): when does each attention operator leave the initial loss plateau, and does
the speed-up follow the operator or its initialisation? Every arm x seed is a plain train.py run of the base
config; this script runs them (a few at a time, each on its own cores), then reads their logs and writes the
summary (assets/study.json) and the figures (plot.py).

    python prepare_oscar.py --source=gcide      # the corpus, once (Debian/Ubuntu: apt-get install dict-gcide)
    python study.py                             # 5 arms x 3 seeds, two runs at a time: ~6 h on 2 CPU cores
    python study.py --quick=True                # original and pairwise, seed 1, 800 steps: a first look (~25 min)
    python study.py --train=False               # the summary and figures of the runs that finished so far
    python study.py --base=config/study_gpu.py --jobs=1 --threads=0 --summary=assets/study_gpu.json \
        --figures=assets/study_gpu --out_dir=out/study_gpu          # bert-small scale on one GPU

Runs that finished are not run again and interrupted ones are resumed: re-running the command continues.
"""
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

import torch

from common import MACHINE_KEYS, first_step_below, load_checkpoint, lock_dir, read_evals, unlock_dir, write_json
from configurator import check, configure

# -----------------------------------------------------------------------------
base = 'config/study.py'  # the train.py config every arm starts from
arms = 'original,symmetric,pairwise,pairwise_small_s,original_sym_init'  # a comma list of the ARMS below
seeds = '1,2,3'  # seed changes the initialisation and the data order; the eval set is the same for all
quick = False  # a first look: original and pairwise, seed 1, QUICK's shorter schedule
threshold = 4.8  # the criterion: first eval step with eval loss <= threshold (how it was fixed: README)
jobs = 2  # train.py runs at a time
threads = 1  # torch threads per run (OMP_NUM_THREADS); 0 = torch's default
train_args = ''  # extra train.py arguments for every run, space-separated, e.g. '--device=cuda'
out_dir = 'out/study'  # one folder per run: <out_dir>/<arm>_s<seed>
summary = 'assets/study.json'  # '' = none
figures = 'assets/study'  # plot.py's output prefix; '' = none
train = True  # False: run nothing; summarise the finished runs (a partial study: the missing ones are listed)
# -----------------------------------------------------------------------------
ARMS = {  # name: (legend label, train.py overrides of the base config)
    'original': ('original', ['--attention_type=original']),
    'symmetric': ('symmetric', ['--attention_type=symmetric']),
    'pairwise': ('pairwise', ['--attention_type=pairwise']),
    'pairwise_small_s': ('pairwise with S ~ N(0; 0.02^2)', ['--attention_type=pairwise', '--s_init_std=0.02']),
    'original_sym_init': ('original with key = query at init', ['--attention_type=original', '--symmetric_init=True']),
}
QUICK = ['--max_iters=800']  # the quick variant's shorter schedule


def run_state(run, cmd):
    """'new', 'resume' or 'done' for a run folder and the train.py arguments that make it. A checkpoint of other
    settings is an error naming them (a changed base config or --train_args): results never mix silently."""
    ckpt, log = os.path.join(run, 'ckpt.pt'), os.path.join(run, 'log.jsonl')
    if os.path.isdir(run):  # a run that is training now (another study, a hand-started train.py) is not touched
        try:
            lock_dir(run, 'study.py')
        except SystemExit as e:
            if train:
                raise SystemExit(f"study: {e}")
            return 'running'
        unlock_dir(run)
    if not os.path.exists(ckpt):
        if os.path.exists(log) and train:  # stopped before its first checkpoint: nothing to resume from
            os.replace(log, f"{log}.stopped-{int(time.time())}")
            print(f"  {run} stopped before its first checkpoint: starting it again (its log: log.jsonl.stopped-*)")
        return 'new'
    ck = load_checkpoint(ckpt, resume=True)
    want = configure(dict(ck['config']), argv=cmd)  # the run's settings, overridden by what this command gives
    differ = [f"{k} {ck['config'][k]!r} -> {v!r}" for k, v in want.items()
              if k not in MACHINE_KEYS and v != ck['config'][k]]
    if differ:
        raise SystemExit(f"study: {run} holds a run of other settings ({', '.join(differ)}): move it away or "
                         "use another --out_dir")
    return 'done' if ck['iter_num'] >= want['max_iters'] else 'resume'


def run_summary(run, level):
    """Per run: steps to the criterion (None: not reached), final loss, accuracy and diagnostics, the curves."""
    evals = read_evals(run)
    last = evals[-1]
    return {'steps_to_criterion': first_step_below(evals, level), 'final_step': last['step'],
            'final_loss': last['loss'], 'final_accuracy': last.get('accuracy'),
            'final_attn_entropy': last.get('attn_entropy'), 'final_collapse': last.get('collapse'),
            'minutes': round((last['time'] - evals[0]['time']) / 60, 1) if 'time' in last and 'time' in evals[0] else None,
            'curve': [[r['step'], round(r['loss'], 5)] for r in evals],
            'attn_entropy': [[r['step'], [round(e, 4) for e in r['attn_entropy']]] for r in evals if 'attn_entropy' in r],
            'collapse': [[r['step'], round(r['collapse'], 4)] for r in evals if 'collapse' in r]}


def spread(values):
    """mean, min, max of a list; None when a value is missing (a run that never reached the criterion)."""
    if not values or any(v is None for v in values):
        return {'mean': None, 'min': None, 'max': None, 'n': len(values)}
    return {'mean': sum(values) / len(values), 'min': min(values), 'max': max(values), 'n': len(values)}


def summarize(runs, level):
    """runs: {arm: {seed: run_summary}} -> per arm: steps to the criterion and final loss over seeds; and the
    ratios of steps (original / pairwise, original / symmetric, ...) per seed, paired by seed."""
    per_arm = {arm: {'steps_to_criterion': spread([r['steps_to_criterion'] for r in rs.values()]),
                     'final_loss': spread([r['final_loss'] for r in rs.values()]),
                     'reached': sum(r['steps_to_criterion'] is not None for r in rs.values())}
               for arm, rs in runs.items()}
    ratios = {}
    for num in ('original', 'original_sym_init'):
        for den in ('pairwise', 'symmetric', 'pairwise_small_s', 'original_sym_init'):
            if num in runs and den in runs and num != den:
                common = sorted(set(runs[num]) & set(runs[den]), key=int)
                per_seed = {s: (runs[num][s]['steps_to_criterion'] / runs[den][s]['steps_to_criterion']
                                if runs[num][s]['steps_to_criterion'] and runs[den][s]['steps_to_criterion'] else None)
                            for s in common}
                # numerator never reached it, denominator did: the ratio is at least (last step / denominator's)
                at_least = {s: runs[num][s]['final_step'] / runs[den][s]['steps_to_criterion'] for s in common
                            if not runs[num][s]['steps_to_criterion'] and runs[den][s]['steps_to_criterion']}
                ratios[f"{num}/{den}"] = {'per_seed': per_seed, **spread(list(per_seed.values())),
                                          'at_least_per_seed': at_least}
    return per_arm, ratios


def fmt(s, f='{:.0f}'):
    if s['mean'] is None:
        return 'not reached by every seed'
    return f.format(s['mean']) + (f" ({f.format(s['min'])}-{f.format(s['max'])})" if s['n'] > 1 else '')


def main():
    arm_list = ['original', 'pairwise'] if quick else arms.split(',')
    seed_list = ['1'] if quick else seeds.split(',')
    check('study', (all(a in ARMS for a in arm_list), f"arms must be a comma list of {', '.join(ARMS)}"),
          (all(s.isdigit() for s in seed_list), f"seeds must be a comma list of integers, got {seeds!r}"),
          (jobs >= 1 and threads >= 0, "jobs must be >= 1 and threads >= 0"))
    level, extra = threshold, (QUICK if quick else []) + train_args.split()
    suffix = '_quick' if quick else ''  # the quick variant never overwrites the full study's files
    root = out_dir + suffix
    if train:
        lock_dir(root, 'study.py')  # one study per folder (each train.py run also holds its own)
    plan = [(a, s) for s in seed_list for a in arm_list]  # seed-major: a partial study has every arm
    folder = {p: os.path.join(root, f"{p[0]}_s{p[1]}") for p in plan}
    args = {p: [base, *ARMS[p[0]][1], f'--seed={p[1]}', f'--out_dir={folder[p]}', *extra] for p in plan}
    env = {**os.environ, **({'OMP_NUM_THREADS': str(threads)} if threads else {})}
    pending, running, t_start, started = list(plan), {}, time.time(), 0
    print(f"study: {len(plan)} runs of {base} ({len(arm_list)} arms x {len(seed_list)} seeds), {jobs} at a time"
          f"{f', {threads} thread(s) each' if threads else ''}; logs in {root}/<arm>_s<seed>/; criterion: first "
          f"eval loss <= {level}", flush=True)
    if not train:  # summarise what finished; run nothing
        state = {p: run_state(folder[p], args[p]) for p in plan}
        missing = [f"{a}_s{sd}" for (a, sd), st in state.items() if st != 'done']
        print(f"  not finished, left out: {', '.join(missing)}" if missing else "  every run finished")
        plan, pending = [p for p in plan if state[p] == 'done'], []
        check('study', (plan, f"no finished run in {root}: run it with --train=True"))
    commands = {folder[p]: ' '.join(['train.py', *args[p]]) for p in plan}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                key = pending.pop(0)
                run, state = folder[key], run_state(folder[key], args[key])
                if state == 'done':
                    continue
                os.makedirs(run, exist_ok=True)
                with open(os.path.join(run, 'train.txt'), 'a') as f:
                    cmd = [sys.executable, 'train.py', *args[key]] + (['--init_from=resume'] if state == 'resume' else [])
                    running[run] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), time.time())
                started += 1
                print(f"  started {run}", flush=True)
            time.sleep(2)
            for run, (p, t0) in list(running.items()):
                if p.poll() is None:
                    continue
                del running[run]
                if p.returncode:  # stop here: the same cause (no dataset, a bad setting) would fail every run
                    with open(os.path.join(run, 'train.txt')) as f:
                        last = (f.read().strip().splitlines() or [''])[-1]
                    raise SystemExit(f"study: {run} failed (exit {p.returncode}): {last}")
                r = run_summary(run, level)
                print(f"  done {run} in {(time.time() - t0) / 60:.1f} min: eval loss {r['final_loss']:.4f}, "
                      f"criterion reached at step {r['steps_to_criterion']}", flush=True)
    except BaseException:  # Ctrl-C or a failed run: the others save their checkpoint and stop
        for p, _ in running.values():
            p.send_signal(signal.SIGINT)
        for p, _ in running.values():
            p.wait()
        if sys.exc_info()[0] is KeyboardInterrupt:
            raise SystemExit("study: interrupted; the same command continues where it stopped")
        raise
    minutes = (time.time() - t_start) / 60

    runs = {}
    for a, sd in sorted(plan, key=lambda p: (arm_list.index(p[0]), int(p[1]))):
        runs.setdefault(a, {})[sd] = run_summary(folder[(a, sd)], level)
    arm_list = [a for a in arm_list if a in runs]
    first = load_checkpoint(os.path.join(folder[plan[0]], 'ckpt.pt'))['config']
    settings = {k: v for k, v in first.items() if k not in MACHINE_KEYS + ('seed', 'attention_type', 's_init_std',
                                                                      'symmetric_init')}  # what every run shares
    per_arm, ratios = summarize(runs, level)
    print(f"\n| arm | seeds | first step with eval loss <= {level}: mean (min-max) | final eval loss |\n|---|---|---|---|")
    for a in arm_list:
        st = per_arm[a]['steps_to_criterion']
        steps = fmt(st) if st['mean'] is not None else (f"not reached by {st['n'] - per_arm[a]['reached']} of "
                                                         f"{st['n']} runs (> {max(r['final_step'] for r in runs[a].values())})")
        print(f"| {ARMS[a][0]} | {', '.join(runs[a])} | {steps} | "
              f"{fmt(per_arm[a]['final_loss'], '{:.3f}')} |")
    print("\n| ratio of steps to the criterion | per seed | mean (min-max) |\n|---|---|---|")
    for k, v in ratios.items():
        per = ', '.join(f"{x:.2f}" if x else f"> {v['at_least_per_seed'][sd]:.2f}" if sd in v['at_least_per_seed']
                        else '-' for sd, x in v['per_seed'].items())
        print(f"| {k} | {per} | {fmt(v, '{:.2f}')} |")
    if summary:
        path = suffix.join(os.path.splitext(summary))
        write_json(path, {
            'criterion': f"first eval step with eval loss <= {level} (fixed before the study's runs)",
            'threshold': level, 'base_config': base, 'settings': settings,
            'extra_args': extra, 'arms': {a: ARMS[a][0] for a in arm_list}, 'seeds': {a: list(runs[a]) for a in arm_list},
            'per_arm': per_arm, 'ratios': ratios, 'runs': runs, 'commands': commands,
            'date': datetime.date.today().isoformat(),
            'wall_minutes': round(minutes, 1) if started == len(plan) else None,  # None: some ran in an earlier call
            'machine': f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; torch {torch.__version__};"
                       f" {jobs} runs at a time, {threads or 'default'} thread(s) each"})
        print(f"wrote {path}")
    if figures:
        dirs = [folder[(a, sd)] for a in arm_list for sd in runs[a]]
        labels = [ARMS[a][0] for a in arm_list for sd in runs[a]]
        subprocess.run([sys.executable, 'plot.py', f"--runs={','.join(dirs)}", f"--labels={','.join(labels)}",
                        f"--threshold={level}", f"--out={figures}{suffix}"], check=True)
    print(f"study: {len(plan)} runs, {started} of them run now, in {minutes:.0f} min")


if __name__ == '__main__':
    configure(globals())
    main()

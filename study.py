"""
The study (README "The study"): when does each attention operator leave the initial loss plateau, and does
the speed-up follow the operator or its initialisation? Every arm x seed is a plain train.py run of the base
config; this script runs them (a few at a time, each on its own cores), then reads their logs and writes the
summary (assets/study.json) and the figures (plot.py).

    python prepare_oscar.py --source=gcide      # the corpus, once (Debian/Ubuntu: apt-get install dict-gcide)
    python study.py                             # 5 arms x 3 seeds, two runs at a time: ~4.5 h on 2 CPU cores
    python study.py --quick=True                # original and pairwise, seed 1, 800 steps: a first look
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

from common import first_step_below, lock_dir, read_evals, write_json

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
# -----------------------------------------------------------------------------
ARMS = {  # name: (legend label, train.py overrides of the base config)
    'original': ('original', ['--attention_type=original']),
    'symmetric': ('symmetric', ['--attention_type=symmetric']),
    'pairwise': ('pairwise', ['--attention_type=pairwise']),
    'pairwise_small_s': ('pairwise with S ~ N(0; 0.02^2)', ['--attention_type=pairwise', '--s_init_std=0.02']),
    'original_sym_init': ('original with key = query at init', ['--attention_type=original', '--symmetric_init=True']),
}
QUICK = ['--max_iters=800']  # the quick variant's shorter schedule


def base_settings(path):
    """The plain assignments of a config file (train.py runs it the same way)."""
    values = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, 'exec'), {}, values)
    except (OSError, SyntaxError) as e:
        raise SystemExit(f"study: cannot read the base config {path}: {e}")
    return values


def run_summary(run, level):
    """Per run: steps to the criterion (None: not reached), final loss, accuracy and diagnostics, the curves."""
    evals = read_evals(run)
    last = evals[-1]
    return {'steps_to_criterion': first_step_below(evals, level), 'final_step': last['step'],
            'final_loss': last['loss'], 'final_accuracy': last.get('accuracy'),
            'final_attn_entropy': last.get('attn_entropy'), 'final_collapse': last.get('collapse'),
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
                ratios[f"{num}/{den}"] = {'per_seed': per_seed, **spread(list(per_seed.values()))}
    return per_arm, ratios


def fmt(s, f='{:.0f}'):
    if s['mean'] is None:
        return 'not reached by every seed'
    return f.format(s['mean']) + (f" ({f.format(s['min'])}-{f.format(s['max'])})" if s['n'] > 1 else '')


def main():
    arm_list = ['original', 'pairwise'] if quick else arms.split(',')
    seed_list = ['1'] if quick else seeds.split(',')
    if unknown := [a for a in arm_list if a not in ARMS]:
        raise SystemExit(f"study: unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if not all(s.isdigit() for s in seed_list):
        raise SystemExit(f"study: seeds must be a comma list of integers, got {seeds!r}")
    settings, level = base_settings(base), threshold
    data = settings.get('dataset', '')
    data = data if os.sep in data else os.path.join('data', data)
    if not os.path.exists(os.path.join(data, 'meta.json')):
        raise SystemExit(f"study: no dataset in {data}: make it with prepare_oscar.py (the study's corpus: python "
                         "prepare_oscar.py --source=gcide, after sudo apt-get install dict-gcide on Debian/Ubuntu)")
    extra = (QUICK if quick else []) + train_args.split()
    suffix = '_quick' if quick else ''  # the quick variant never overwrites the full study's files
    root = out_dir + suffix
    lock_dir(root, 'study.py')  # one study per folder (each train.py run also holds its own)
    plan = [(a, s) for s in seed_list for a in arm_list]  # seed-major: a partial study has every arm
    commands = {}
    env = {**os.environ, **({'OMP_NUM_THREADS': str(threads)} if threads else {})}
    pending, running, failed, t_start = list(plan), {}, [], time.time()
    print(f"study: {len(plan)} runs of {base} ({len(arm_list)} arms x {len(seed_list)} seeds), {jobs} at a time"
          f"{f', {threads} thread(s) each' if threads else ''}; logs in {root}/<arm>_s<seed>/; criterion: first "
          f"eval loss <= {level}", flush=True)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                arm, seed = pending.pop(0)
                run = os.path.join(root, f"{arm}_s{seed}")
                cmd = [sys.executable, 'train.py', base, *ARMS[arm][1], f'--seed={seed}', f'--out_dir={run}', *extra]
                commands[run] = ' '.join(cmd[1:])
                if finished(run):
                    continue
                if os.path.exists(os.path.join(run, 'ckpt.pt')):
                    cmd.append('--init_from=resume')
                os.makedirs(run, exist_ok=True)
                with open(os.path.join(run, 'train.txt'), 'a') as f:
                    running[run] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env), time.time())
                print(f"  started {run}", flush=True)
            time.sleep(2)
            for run, (p, t0) in list(running.items()):
                if p.poll() is not None:
                    del running[run]
                    if p.returncode:
                        failed.append(run)
                        print(f"  FAILED {run} (exit {p.returncode}): see {run}/train.txt", flush=True)
                    else:
                        r = run_summary(run, level)
                        print(f"  done {run} in {(time.time() - t0) / 60:.1f} min: eval loss {r['final_loss']:.4f}, "
                              f"criterion reached at step {r['steps_to_criterion']}", flush=True)
    except KeyboardInterrupt:
        for p, _ in running.values():
            p.send_signal(signal.SIGINT)  # train.py saves its checkpoint and stops
        for p, _ in running.values():
            p.wait()
        raise SystemExit("study: interrupted; the same command continues where it stopped")
    if failed:
        raise SystemExit(f"study: {len(failed)} run(s) failed: {', '.join(failed)}")
    minutes = (time.time() - t_start) / 60

    runs = {a: {s: run_summary(os.path.join(root, f"{a}_s{s}"), level) for s in seed_list} for a in arm_list}
    per_arm, ratios = summarize(runs, level)
    print(f"\n| arm | seeds | first step with eval loss <= {level}: mean (min-max) | final eval loss |\n|---|---|---|---|")
    for a in arm_list:
        print(f"| {ARMS[a][0]} | {len(seed_list)} | {fmt(per_arm[a]['steps_to_criterion'])} | "
              f"{fmt(per_arm[a]['final_loss'], '{:.3f}')} |")
    print("\n| ratio of steps to the criterion | per seed | mean (min-max) |\n|---|---|---|")
    for k, v in ratios.items():
        per = ', '.join('-' if x is None else f"{x:.2f}" for x in v['per_seed'].values())
        print(f"| {k} | {per} | {fmt(v, '{:.2f}')} |")
    if summary:
        import torch
        path = suffix.join(os.path.splitext(summary))
        write_json(path, {
            'criterion': f"first eval step with eval loss <= {level} (fixed before the study's runs)",
            'threshold': level, 'base_config': base, 'settings': {k: v for k, v in settings.items() if k.islower()},
            'extra_args': extra, 'arms': {a: ARMS[a][0] for a in arm_list}, 'seeds': seed_list,
            'per_arm': per_arm, 'ratios': ratios, 'runs': runs, 'commands': commands,
            'date': datetime.date.today().isoformat(), 'wall_minutes': round(minutes, 1),
            'machine': f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; torch {torch.__version__};"
                       f" {jobs} runs at a time, {threads or 'default'} thread(s) each"})
        print(f"wrote {path}")
    if figures:
        dirs = [os.path.join(root, f"{a}_s{s}") for a in arm_list for s in seed_list]
        labels = [ARMS[a][0] for a in arm_list for s in seed_list]
        subprocess.run([sys.executable, 'plot.py', f"--runs={','.join(dirs)}", f"--labels={','.join(labels)}",
                        f"--threshold={level}", f"--out={figures}{suffix}"], check=True)
    print(f"study: {len(plan)} runs in {minutes:.0f} min")


def finished(run):
    """A run whose last eval is at its config's max_iters (read from its own log and checkpoint)."""
    ckpt = os.path.join(run, 'ckpt.pt')
    if not os.path.exists(ckpt):
        return False
    import torch
    state = torch.load(ckpt, map_location='cpu', weights_only=True)
    return state['iter_num'] >= state['config']['max_iters']


if __name__ == '__main__':
    from configurator import configure

    configure(globals())
    main()

"""
The study (README "The study"): when does each attention operator leave the initial loss plateau, and does
the speed-up follow the operator or its initialisation? Every arm x seed is a plain train.py run of the base
config. Each finished run's eval records are kept in assets/study/<arm>_s<seed>.jsonl (a few KB, committed): the
summary (assets/study.json) and the figures are made from those files alone.

    python prepare_oscar.py --source=gcide      # the corpus, once (Debian/Ubuntu: apt-get install dict-gcide)
    python study.py                             # runs only the runs that assets/study/ lacks, two at a time
    python study.py --train=False               # the summary and figures from the records, nothing run

The criterion, fixed before the study's runs (README "The study"): the first eval step whose loss is at least
`drop` nats below U, the eval loss of the frequency (unigram) predictor on the same eval tokens. A run stops
(train.py's target_loss) once it has met the sweep's deepest criterion and reached `min_steps` (the uncensored
endpoint is the eval loss at min_steps); one that never does runs to the cap (the base config's max_iters).
Interrupted runs are resumed from out/study/; re-running the command continues.
"""
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import plot
from configurator import check, configure, read_file
from dataloader import dataset_dir, load_dataset
from rundir import (END_KEYS, MACHINE_KEYS, atomic_write, first_step_below, load_checkpoint, lock_dir, locked, read_evals,
                    run_changes, write_json)

# -----------------------------------------------------------------------------
base = 'config/study.py'  # the train.py config every arm starts from
arms = ''  # '' = every arm of ARMS (below), in its order; or a comma list of them
seeds = ''  # '' = n_seeds (or n_seeds_primary) paired seeds from first_seed on; a comma list = these, every arm
n_seeds = 5  # paired seeds per arm when seeds is '' (the exploratory arms)
n_seeds_primary = 15  # paired seeds of the primary arms: from a power calculation, fixed before their runs (README)
primary = 'original,pairwise,original_scaled'  # the confirmatory comparisons: each arm here against the original
first_seed = 2  # seed 1 made the pilot runs that fixed the criterion and the cap (README): not part of the results
drop = 0.7  # the criterion: first eval step with loss <= U - drop (U: the unigram predictor's eval loss)
sweep = '0.5,0.6,0.7,0.8,0.9'  # other drops, to show whether the order depends on the one criterion
min_steps = 1000  # a run that met the criterion stops at the first eval at or after this step
jobs = 2  # train.py runs at a time
threads = 1  # torch threads per run (OMP_NUM_THREADS); 0 = torch's default
train_args = ''  # extra train.py arguments for every run, space-separated, e.g. '--device=cuda'
out_dir = 'out/study'  # the runs' working folders (checkpoints): <out_dir>/<arm>_s<seed>
records = 'assets/study'  # the finished runs' eval records, one <arm>_s<seed>.jsonl each
summary = 'assets/study.json'  # '' = none
figures = 'assets/study'  # output prefix of the figures; '' = none
train = True  # False: run nothing; summarise the records there are (the missing runs are listed)
# -----------------------------------------------------------------------------
ARMS = {  # name: (legend label, train.py overrides of the base config)
    'original': ('original', ['--attention_type=original']),
    'pairwise': ('pairwise', ['--attention_type=pairwise']),
    'pairwise_small_s': ('pairwise, S ~ N(0, 0.02^2)', ['--attention_type=pairwise', '--s_init_std=0.02']),
    'symmetric': ('symmetric', ['--attention_type=symmetric']),
    # sqrt(d) = 8 for the base config's d = 64: the original's scores start as wide as pairwise's (tests/test_model.py)
    'original_scaled': ('original, scores x sqrt(d)', ['--attention_type=original', '--score_scale=8.0']),
    'pairwise_frozen_s': ('pairwise, S frozen at N(0, 1)', ['--attention_type=pairwise', '--freeze_s=True']),
    'original_sym_init': ('original, key = query at init', ['--attention_type=original', '--symmetric_init=True']),
}
RUN_KEYS_IGNORED = tuple(k for k in MACHINE_KEYS if k != 'dtype')  # where a run ran; its precision counts


# ----------------------------------------------------------------------------- statistics (numpy only)
def loss_at(evals, step):
    return next((r['loss'] for r in evals if r['step'] == step), None)


def kaplan_meier(times, events):
    """Survival ('still on the plateau') after each distinct event step: [(step, S)], starting at (0, 1). times:
    the event step, or the last step of a censored run (events False): it leaves the risk set without an event."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    curve, s = [(0, 1.0)], 1.0
    for t in np.unique(times[events]):
        at_risk, d = (times >= t).sum(), (events & (times == t)).sum()
        s *= 1 - d / at_risk
        curve.append((int(t), float(s)))
    return curve


def km_median(curve):
    """The first step at which survival is <= 0.5; None: more than half still on the plateau at the end."""
    return next((t for t, s in curve if s <= 0.5), None)


def rmst(curve, cap):
    """Restricted mean steps to the criterion: the area under the survival curve up to the cap."""
    steps = [t for t, _ in curve if t < cap] + [cap]
    return float(sum((b - a) * s for (a, s), b in zip(curve, steps[1:])))


def bootstrap_ci(x, n=10_000, seed=0):
    """The 2.5 and 97.5 percentiles of the mean of x resampled with replacement (over seeds); None for one value.
    With 3 values it is always [min, max] (a resample of one value three times has chance 1/27 > 2.5%)."""
    if len(x) < 2:
        return None
    x = np.asarray(x, float)
    means = x[np.random.default_rng(seed).integers(0, len(x), (n, len(x)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_ratio(num, den, cap):
    """Ratio of steps to the criterion of two runs of one seed: '1.50', '> 1.50' (the numerator censored),
    '< 1.50' (the denominator censored), or '-' (both censored)."""
    if num is not None and den is not None:
        return f"{num / den:.2f}"
    if den is not None:
        return f"> {cap / den:.2f}"
    return f"< {num / cap:.2f}" if num is not None else "-"


def unigram_loss(data_dir, block_size, batch_size, eval_iters):
    """U: the cross-entropy of predicting each eval token from its frequency in train.bin (add-one smoothed),
    over the ordinary tokens of the eval blocks train.py uses (the first eval_iters * batch_size of val.bin).
    Masking picks positions uniformly among those tokens, so U is the expected eval loss of that predictor."""
    train_data, val_data, meta = load_dataset(data_dir, None, block_size)
    n = min(meta['special'].values())
    tokens = np.asarray(train_data).reshape(-1)
    counts = np.bincount(tokens[tokens < n], minlength=n) + 1.0
    val = np.asarray(val_data[:eval_iters * batch_size]).reshape(-1)
    return float(-np.log(counts / counts.sum())[val[val < n]].mean())


# ----------------------------------------------------------------------------- runs and records
def read_record(path):
    """(head, eval records) of a committed run record, head holding the run's config and U; None if there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        head = f.readline()
    try:
        head = json.loads(head)
        head['config'], head['unigram_loss']
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"study: {path} is not a study record (its first line must hold the run's config): "
                         "move it away and run again")
    try:
        return head, read_evals(path)
    except SystemExit as e:
        raise SystemExit(f"study: {e}; move it away and run again")


def write_record(path, run, command, u):
    """The run's settings and its eval records (from out_dir/log.jsonl) as the committed record."""
    settings = load_checkpoint(os.path.join(run, 'ckpt.pt'))['config']
    head = {'type': 'config', 'config': settings, 'unigram_loss': u, 'command': command, 'torch': torch.__version__,
            'machine': f"{platform.machine()}, {os.cpu_count()} cores", 'cpu': cpu_name(), 'commit': code_commit(),
            'date': datetime.date.today().isoformat()}
    lines = [json.dumps(head)] + [json.dumps({k: round(v, 4) if isinstance(v, float) and k != 'loss' else  # loss
                                                 [round(e, 4) for e in v] if isinstance(v, list) else v  # exact: the
                                              for k, v in r.items()}) for r in read_evals(run)]  # criterion reads it
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    atomic_write(path, lambda f: f.write('\n'.join(lines) + '\n'), mode='w')


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            return next((line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), platform.processor())
    except OSError:
        return platform.processor()


def code_commit():
    """The git commit of the code that trains (runs train from a clone of a fixed commit), '+changes' if its tracked
    files differ from it; None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(['git', '-C', here, *a], capture_output=True, text=True)
    head = git('rev-parse', 'HEAD')
    if head.returncode:
        return None
    return head.stdout.strip() + ('+changes' if git('status', '--porcelain', '--untracked-files=no').stdout else '')


def differ(have, cmd):
    """What makes the run made with the settings `have` another run than the train.py command cmd asks for (not
    where it ran, nor how far: see rundir.run_changes)."""
    return run_changes(have, configure(dict(have), argv=cmd), ignore=RUN_KEYS_IGNORED)


def stop_level(u):
    """Runs go on until the deepest criterion of the sweep is met (else its drops above `drop` would be censored by
    the run's own progress, not by the cap)."""
    return u - max([drop] + [float(x) for x in sweep.split(',') if x])


def record_complete(evals, u, cap):
    """The record has all the study needs: the run reached the cap, or met the deepest criterion and min_steps."""
    last = evals[-1]['step']
    return last >= cap or (first_step_below(evals, stop_level(u)) is not None and last >= min_steps)


# ----------------------------------------------------------------------------- the study
def plan_runs():
    arm_list = arms.split(',') if arms else list(ARMS)
    check('study', (all(a in ARMS for a in arm_list), f"arms must be a comma list of {', '.join(ARMS)}"),
          (all(s.isdigit() for s in seeds.split(',')) if seeds else True, f"seeds must be a comma list of integers"),
          (jobs >= 1 and threads >= 0 and min_steps >= 0, "jobs must be >= 1, threads and min_steps >= 0"),
          (n_seeds >= 1 and n_seeds_primary >= 1, "n_seeds and n_seeds_primary must be >= 1"),
          (all(a in ARMS for a in primary.split(',') if a), f"primary must be a comma list of {', '.join(ARMS)}"))
    plan = []
    for arm in arm_list:
        n = n_seeds_primary if arm in primary.split(',') else n_seeds
        for sd in (seeds.split(',') if seeds else [str(first_seed + i) for i in range(n)]):
            cmd = [base, *ARMS[arm][1], f'--seed={sd}', *train_args.split()]
            plan.append((arm, sd, cmd))
    return sorted(plan, key=lambda p: (int(p[1]), arm_list.index(p[0])))  # seed-major: a partial study has every arm


def run_all(plan, u, cap):
    """Trains the runs whose records are missing or unfinished, `jobs` at a time; writes each record as it ends."""
    todo, level = [], u - drop
    for arm, sd, cmd in plan:
        rec, run = read_record(os.path.join(records, f"{arm}_s{sd}.jsonl")), os.path.join(out_dir, f"{arm}_s{sd}")
        changed = differ(rec[0]['config'], cmd) if rec else []
        if changed:
            raise SystemExit(f"study: {records}/{arm}_s{sd}.jsonl is a run of other settings ({', '.join(changed)}): "
                             "move it away or use another --records")
        if rec and record_complete(rec[1], u, cap):
            continue
        ckpt = os.path.join(run, 'ckpt.pt')
        resume = os.path.exists(ckpt) and not differ(load_checkpoint(ckpt, resume=True)['config'], cmd)
        if os.path.exists(ckpt) and not resume:
            raise SystemExit(f"study: {run} holds a run of other settings: move it away or use another --out_dir")
        stop = [f'--target_loss={stop_level(u)}', f'--min_iters={min_steps}']  # train.py stops once it is met
        todo.append((arm, sd, cmd + stop + [f'--out_dir={run}'] + (['--init_from=resume'] if resume else []), run))
    env = {**os.environ, **({'OMP_NUM_THREADS': str(threads)} if threads else {})}
    running = {}
    print(f"study: {len(plan) - len(todo)} of {len(plan)} runs recorded in {records}/; {len(todo)} to train, {jobs} "
          f"at a time; criterion: eval loss <= {level:.4f}", flush=True)
    try:
        while todo or running:
            while todo and len(running) < jobs:
                arm, sd, cmd, run = todo.pop(0)
                with locked(run, 'study.py'):  # another study or train.py there: one line, nothing started
                    pass
                with open(os.path.join(run, 'train.txt'), 'a') as f:
                    p = subprocess.Popen([sys.executable, 'train.py', *cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
                running[run] = (p, arm, sd, cmd, time.time())
                print(f"  started {run}", flush=True)
            time.sleep(2)
            for run, (p, arm, sd, cmd, t0) in list(running.items()):
                if p.poll() is None:
                    continue
                del running[run]
                if p.returncode:
                    with open(os.path.join(run, 'train.txt')) as f:
                        last = (f.read().strip().splitlines() or [''])[-1]
                    raise SystemExit(f"study: {run} failed (exit {p.returncode}): {last}")
                write_record(os.path.join(records, f"{arm}_s{sd}.jsonl"), run, ' '.join(['python train.py', *cmd]), u)
                evals = read_evals(run)
                print(f"  done {run} in {(time.time() - t0) / 60:.1f} min: step {evals[-1]['step']}, criterion met at "
                      f"step {first_step_below(evals, level)}; record: {records}/{arm}_s{sd}.jsonl", flush=True)
    except BaseException:  # Ctrl-C or a failed run: the others save their checkpoint and stop
        for p, *_ in running.values():
            p.send_signal(signal.SIGINT)
        for p, *_ in running.values():
            p.wait()
        if sys.exc_info()[0] is KeyboardInterrupt:
            raise SystemExit("study: interrupted; the same command continues where it stopped")
        raise


def censored_summary(runs, u, cap):
    """runs: {arm: {seed: evals}} -> the summary: per arm the runs that met the criterion, the Kaplan-Meier median
    and restricted mean steps, the eval loss at min_steps; paired with the original by seed: loss differences with
    a bootstrap interval and ratios of steps (bounds where censored); the same medians for every drop of the sweep."""
    def times(evals, level):
        t = first_step_below(evals, level)
        return (t, True) if t is not None else (evals[-1]['step'], False)

    level = u - drop
    runs = {arm: {sd: [r for r in e if r['step'] <= cap] for sd, e in rs.items()} for arm, rs in runs.items()}
    out = {'per_arm': {}, 'paired_with_original': {}, 'sweep': {}}
    for arm, rs in runs.items():
        tt, ev = zip(*[times(e, level) for e in rs.values()])
        curve = kaplan_meier(tt, ev)
        losses = [loss_at(e, min_steps) for e in rs.values()]
        out['per_arm'][arm] = {
            'seeds': list(rs), 'reached': int(sum(ev)), 'n': len(rs),
            'steps_to_criterion': {s: (t if e else None) for s, t, e in zip(rs, tt, ev)},
            'km_median': km_median(curve), 'rmst': round(rmst(curve, cap), 1), 'km_curve': curve,
            f'loss_at_{min_steps}': {'mean': float(np.mean(losses)), 'sd': float(np.std(losses, ddof=1)) if len(rs) > 1
                                     else None, 'per_seed': dict(zip(rs, losses))} if None not in losses else None}
    for arm, rs in runs.items():
        both = sorted((s for s in set(rs) & set(runs.get('original', {})) if loss_at(rs[s], min_steps) is not None
                         and loss_at(runs['original'][s], min_steps) is not None), key=int)
        if arm == 'original' or not both:
            continue
        diff = [loss_at(rs[s], min_steps) - loss_at(runs['original'][s], min_steps) for s in both]
        out['paired_with_original'][arm] = {
            'seeds': both, f'loss_diff_at_{min_steps}': float(np.mean(diff)), 'ci95': bootstrap_ci(diff),
            'ratio_original_over_arm': {s: paired_ratio(first_step_below(runs['original'][s], level),
                                                        first_step_below(rs[s], level), cap) for s in both}}
    for d in (float(x) for x in sweep.split(',') if x):
        out['sweep'][f"{d:g}"] = {
            arm: {'km_median': km_median(kaplan_meier(*zip(*[times(e, u - d) for e in rs.values()]))),
                  'reached': sum(first_step_below(e, u - d) is not None for e in rs.values()), 'n': len(rs)}
            for arm, rs in runs.items()}
    return out


def survival_figure(per_arm, cap, path):
    plt = plot.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    for arm, a in per_arm.items():
        steps, surv = zip(*a['km_curve'])
        ax.step(list(steps) + [cap], list(surv) + [surv[-1]], where='post',
                label=f"{ARMS[arm][0]} ({a['n']} seed{'s' if a['n'] > 1 else ''})")
    ax.set(xlabel='step', ylabel='fraction of runs still on the plateau', ylim=(-0.03, 1.03), xlim=(0, cap),
           title=f'Kaplan-Meier: runs not yet at eval loss <= U - {drop:g}')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    plot.save(fig, path)
    plt.close(fig)


def fmt_steps(a, cap):
    return str(a['km_median']) if a['km_median'] is not None else f"> {cap}"


def base_settings():
    """The base config's own settings, checked, and the cap (its max_iters)."""
    base_cfg = read_file(base)
    need = ('dataset', 'max_iters', 'block_size', 'batch_size', 'eval_iters', 'eval_interval')
    check('study', (set(need) <= set(base_cfg), f"{base} must set {', '.join(need)}"))
    cap = base_cfg['max_iters']
    check('study', (cap >= min_steps and min_steps % base_cfg['eval_interval'] == 0,
                    f"min_steps must be a multiple of eval_interval ({base_cfg['eval_interval']}) and <= max_iters "
                    f"({cap})"))
    return base_cfg, cap


def read_records(plan):
    return {(arm, sd): read_record(os.path.join(records, f"{arm}_s{sd}.jsonl")) for arm, sd, _ in plan}


def unigram_level(recs, base_cfg):
    """U: from the data when the study trains (checked against the records' own), else from the records (a fresh
    clone has no data/)."""
    us = {round(r[0]['unigram_loss'], 6) for r in recs.values() if r}
    check('study', (len(us) <= 1, f"the records in {records}/ were made on different data (U = {sorted(us)})"))
    check('study', (train or us, f"no finished run recorded in {records}/: run the study with --train=True"))
    if not train:
        return next(r[0]['unigram_loss'] for r in recs.values() if r)
    data_dir = dataset_dir(base_cfg['dataset'])
    u = unigram_loss(data_dir, base_cfg['block_size'], base_cfg['batch_size'], base_cfg['eval_iters'])
    check('study', (not us or abs(us.pop() - u) < 1e-4, f"{data_dir} is not the data the records in {records}/ "
                                                        f"were made on (another U): prepare it again or move them"))
    return u


def finished_runs(plan, recs, u, cap):
    """({arm: {seed: evals}} of the finished runs that match the plan, the names of the others, the shared settings)."""
    runs, missing, shared = {}, [], {}
    for arm, sd, cmd in plan:
        rec = recs[(arm, sd)]
        if rec and not differ(rec[0]['config'], cmd) and record_complete(rec[1], u, cap):
            runs.setdefault(arm, {})[sd], shared = rec[1], rec[0]['config']
        else:
            missing.append(f"{arm}_s{sd}")
    print(f"study: {sum(map(len, runs.values()))} runs recorded" + (f"; not yet run: {', '.join(missing)}" if missing
                                                                      else ", every run of the plan"))
    check('study', (runs, f"no finished run recorded in {records}/: run the study with --train=True"))
    return runs, missing, shared


def report(runs, missing, shared, u, cap):
    """The summary's tables (Markdown, printed), assets/study.json and the figures."""
    s, level = censored_summary(runs, u, cap), u - drop
    print(f"\ncriterion: eval loss <= U - {drop:g} = {level:.4f} (U = {u:.4f}, the unigram predictor's eval loss); "
          f"cap {cap} steps\n\n| arm | seeds | met the criterion | median steps (Kaplan-Meier) | restricted mean steps "
          f"| eval loss at {min_steps}: mean (sd) |\n|---|---|---|---|---|---|")
    for arm, a in s['per_arm'].items():
        l = a[f'loss_at_{min_steps}']
        loss = f"{l['mean']:.3f}" + (f" ({l['sd']:.3f})" if l['sd'] is not None else "") if l else "-"
        print(f"| {ARMS[arm][0]} | {len(a['seeds'])} | {a['reached']} of {a['n']} | {fmt_steps(a, cap)} "
              f"| {a['rmst']:.0f} | {loss} |")
    print(f"\n| arm - original, paired by seed | seeds | eval loss at {min_steps}: mean difference [95% bootstrap] "
          f"| steps to criterion, original / arm, per seed |\n|---|---|---|---|")
    for arm, p in s['paired_with_original'].items():
        ci = f" [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]" if p['ci95'] else ""
        print(f"| {ARMS[arm][0]} | {len(p['seeds'])} | {p[f'loss_diff_at_{min_steps}']:+.3f}{ci} "
              f"| {', '.join(p['ratio_original_over_arm'].values())} |")
    print("\n| drop (nats below U) | " + " | ".join(ARMS[a][0] for a in runs) + " |\n|---|" + "---|" * len(runs))
    for d, row in s['sweep'].items():
        print(f"| {d} | " + " | ".join(f"{fmt_steps(r, cap)} ({r['reached']}/{r['n']})" for r in row.values())
              + " |")
    if summary:
        overridden = {o.split('=')[0] for _, overrides in ARMS.values() for o in overrides}
        write_json(summary, {
            'criterion': f"first eval step with eval loss <= U - {drop:g}, U = {u:.5f} (unigram predictor); cap {cap}",
            'unigram_loss': u, 'level': level, 'drop': drop, 'cap': cap, 'min_steps': min_steps, 'base_config': base,
            'settings': {k: v for k, v in shared.items() if k not in RUN_KEYS_IGNORED + END_KEYS + ('seed',)
                         and f'--{k}' not in overridden},
            'arms': {a: {'label': ARMS[a][0], 'overrides': ARMS[a][1]} for a in runs}, 'missing': missing, **s})
        print(f"wrote {summary}")
    if figures:
        paths = [os.path.join(records, f"{a}_s{sd}.jsonl") for a in runs for sd in runs[a]]
        plot.main(paths, '', [ARMS[a][0] for a in runs for _ in runs[a]], level, figures)  # labels hold commas
        survival_figure(s['per_arm'], cap, f"{figures}_survival")


def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIGINT ignored)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a scheduler's stop: the runs save, then stop too
    plan = plan_runs()
    base_cfg, cap = base_settings()
    u = unigram_level(read_records(plan), base_cfg)
    if train:
        lock_dir(out_dir, 'study.py')  # one study per folder (each train.py run also holds its own)
        run_all(plan, u, cap)
    report(*finished_runs(plan, read_records(plan), u, cap), u, cap)


if __name__ == '__main__':
    configure(globals())
    main()

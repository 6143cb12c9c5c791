"""
The study (docs/study.md): when does each attention operator leave the initial loss plateau, and does
the speed-up follow the operator or its initialisation? Every arm x seed is a plain train.py run of the base
config. Each finished run's eval records are kept in assets/study/<arm>_s<seed>.jsonl (a few KB, committed): the
summary (assets/study.json) and the figures are made from those files alone.

    python prepare_oscar.py --source=gcide      # the corpus, once (Debian/Ubuntu: apt-get install dict-gcide)
    python studies/study.py                     # runs only the runs that assets/study/ lacks, two at a time
    python studies/study.py --train=False       # the summary and figures from the records, nothing run

The criterion, fixed before the study's runs (docs/study.md): the first eval step whose loss is at least
`drop` nats below U, the eval loss of the frequency (unigram) predictor on the same eval tokens. A run stops
(train.py's target_loss) once it has met the sweep's deepest criterion and reached `min_steps`; one that never
does runs to the cap (the base config's max_iters). The uncensored endpoint is the eval loss at `loss_step`, which
every run reaches.
Interrupted runs are resumed from out/study/; re-running the command continues.
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: the studies run
# from it as `python studies/<study>.py`, and import its scripts and lib/
if __name__ == '__main__':  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import math
from functools import partial

import numpy as np

from configurator import check, comma_list, configure
from finetune_glue import spearman
from lib.checkpoint import load_checkpoint
from lib.dataloader import dataset_dir
from lib.files import lock_dir, write_json
from lib.run import END_KEYS
import plot
from plot import first_step_below, read_evals
from studies.jobs import BASE_CONFIG, RUN_KEYS_IGNORED, Job, differ, read_checked, read_record, run_jobs, \
    unigram_loss, write_record
from studies.stats import holm, kaplan_meier, km_median, paired_t, rmst, sign_flip_p, tost

# -----------------------------------------------------------------------------
base = 'studies/config/study.py'  # the train.py config every arm starts from
arms = ''  # '' = every arm of ARMS (below), in its order; or a comma list of them
seeds = ''  # '' = each arm's pre-registered number of paired seeds (SEEDS) from first_seed on; a comma list = these
first_seed = 2  # seed 1 made the pilot runs that fixed the criterion and the cap (docs/study.md): not part of the results
drop = 0.7  # the criterion: first eval step with loss <= U - drop (U: the unigram predictor's eval loss)
sweep = '0.5,0.6,0.7,0.8,0.9'  # other drops, to show whether the order depends on the one criterion
min_steps = 1000  # a run that met the criterion stops at the first eval at or after this step
loss_step = 1000  # the eval-loss endpoint's step, fixed before the runs; <= min_steps (runs to the cap keep it)
jobs = 2  # train.py runs at a time
threads = 1  # torch threads per run (OMP_NUM_THREADS); 0 = torch's default
train_args = ''  # extra train.py arguments for every run, space-separated, e.g. '--device=cuda'
out_dir = 'out/study'  # the runs' working folders (checkpoints): <out_dir>/<arm>_s<seed>
records = 'assets/study'  # the finished runs' eval records, one <arm>_s<seed>.jsonl each
summary = 'assets/study.json'  # '' = none
figures = 'assets/study'  # output prefix of the figures; '' = none
train = True  # False: run nothing; summarise the records there are (the missing runs are listed)
# -----------------------------------------------------------------------------
ARMS = {  # name: (legend label, train.py overrides of the base config, family)
    'original': ('original', ['--attention_type=original'], 'primary'),
    'pairwise': ('pairwise', ['--attention_type=pairwise'], 'primary'),
    'pairwise_small_s': ('pairwise, S ~ N(0, 0.02^2)', ['--attention_type=pairwise', '--s_init_std=0.02'],
                         'exploratory'),
    'symmetric': ('symmetric', ['--attention_type=symmetric'], 'exploratory'),
    # sqrt(d) = 8 for the base config's d = 64: the original's scores start as wide as pairwise's (tests/test_model.py)
    'original_scaled': ('original, scores x sqrt(d)', ['--attention_type=original', '--score_scale=8.0'], 'primary'),
    'pairwise_frozen_s': ('pairwise, S frozen at N(0, 1)', ['--attention_type=pairwise', '--freeze_s=True'],
                          'exploratory'),
    'original_sym_init': ('original, key = query at init', ['--attention_type=original', '--symmetric_init=True'],
                          'exploratory'),
    # start or step, c = 8: a multiplier c widens the initial scores c times AND moves them c times further per Adam
    # step; these arms take the two apart (docs/study.md)
    'original_wide_start': ('original, scores x 8, q/k lr / 8',
                            ['--attention_type=original', '--score_scale=8.0', '--qk_lr_scale=0.125'], 'start_or_step'),
    'original_large_step': ('original, q/k lr x 8', ['--attention_type=original', '--qk_lr_scale=8.0'],
                            'start_or_step'),
    'original_wide_init': ('original, q/k init std x sqrt(8)',
                           ['--attention_type=original', '--qk_init_scale=2.8284271247461903'], 'start_or_step'),
    'original_heat': ('original, heat treatment (x 8 -> 1 by step 500)',
                      ['--attention_type=original', '--score_scale=8.0', '--score_scale_warmup=500'], 'start_or_step'),
}
SEEDS = {'primary': 15, 'exploratory': 5, 'start_or_step': 10}  # paired seeds per arm, fixed before the runs (docs/study.md)
REFERENCES = {'primary': ['original'], 'exploratory': ['original'], 'start_or_step': ['original', 'original_scaled']}
EQUIVALENCE = ('original_scaled', 'pairwise', np.log(1.25))  # TOST on log steps: a margin fixed before the runs
ENTROPY_DROP, ENTROPY_REF = 0.8, 25  # the entropy endpoint: mean entropy < 0.8 x its value at step 25 (docs/study.md)
NEW_SEEDS = 7  # seeds from here on were run after the second stage was fixed: the replication


# ----------------------------------------------------------------------------- endpoints
def loss_at(evals, step):
    return next((r['loss'] for r in evals if r['step'] == step), None)


def entropy_step(evals, drop=ENTROPY_DROP, ref=ENTROPY_REF):
    """The entropy endpoint: the first eval step after `ref` whose attention entropy (the mean over the layers)
    is below drop x its value at `ref`; None if never (or no diagnostics)."""
    mean = lambda r: float(np.mean(r['attn_entropy']))
    start = next((mean(r) for r in evals if r['step'] == ref and 'attn_entropy' in r), None)
    return None if start is None else next((r['step'] for r in evals if r['step'] > ref and mean(r) < drop * start),
                                           None)


def rank_correlation(pairs):
    """Spearman's rho of the pairs; None (null in the summary: JSON has no nan) with fewer than 3 pairs (two are
    always +-1) or a constant side (undefined)."""
    rho = spearman(*zip(*pairs)) if len(pairs) >= 3 else math.nan
    return None if math.isnan(rho) else rho


def stop_level(u, drop, sweep):
    """Runs go on until the deepest criterion of the sweep is met (else its drops above `drop` would be censored by
    the run's own progress, not by the cap)."""
    return u - max([drop, *sweep])


def record_complete(evals, cap, stop, min_steps):
    """The record has all the study needs: the run reached the cap, or met the stop level and min_steps."""
    last = evals[-1]['step']
    return last >= cap or (first_step_below(evals, stop) is not None and last >= min_steps)


# ----------------------------------------------------------------------------- the runs
def recorded(path, cap, stop, min_steps):
    """The run's record is there and complete."""
    rec = read_record(path)
    return bool(rec) and record_complete(rec[1], cap, stop, min_steps)


def plan_runs(arms, seeds, first_seed, base, train_args):
    """[(arm, seed, train.py arguments)], seed-major: a partial study has every arm. arms: a comma list of ARMS, ''
    = all; seeds: a comma list, '' = each family's number of seeds (SEEDS) from first_seed on."""
    arm_list = arms.split(',') if arms else list(ARMS)
    plan = []
    for arm in arm_list:
        for sd in (seeds.split(',') if seeds else [str(first_seed + i) for i in range(SEEDS[ARMS[arm][2]])]):
            plan.append((arm, sd, [base, *ARMS[arm][1], f'--seed={sd}', *train_args.split()]))
    return sorted(plan, key=lambda p: (int(p[1]), arm_list.index(p[0])))


def finish(rec, run, command, u, level):
    """A run that ended well: its record written; how far it went and when it met the criterion."""
    write_record(rec, run, command, u)
    evals = read_evals(run)
    return f"step {evals[-1]['step']}, criterion met at step {first_step_below(evals, level)}; record: {rec}"


def run_all(plan, u, cap, level, stop, min_steps, records, out_dir, jobs, threads):
    """Trains the runs whose records are missing or unfinished, `jobs` at a time, each until it has met the stop
    level and min_steps (or the cap); writes each record as it ends."""
    todo = []
    for arm, sd, cmd in plan:
        path, run = os.path.join(records, f"{arm}_s{sd}.jsonl"), os.path.join(out_dir, f"{arm}_s{sd}")
        rec = read_record(path)
        changed = differ(rec[0]['config'], cmd) if rec else []
        if changed:
            raise SystemExit(f"study: {records}/{arm}_s{sd}.jsonl is a run of other settings ({', '.join(changed)}): "
                             "move it away or use another --records")
        if rec and record_complete(rec[1], cap, stop, min_steps):
            continue
        ckpt = os.path.join(run, 'ckpt.pt')
        resume = os.path.exists(ckpt) and not differ(load_checkpoint(ckpt, resume=True)['config'], cmd)
        if os.path.exists(ckpt) and not resume:
            raise SystemExit(f"study: {run} holds a run of other settings: move it away or use another --out_dir")
        cmd = cmd + [f'--target_loss={stop}', f'--min_iters={min_steps}', f'--out_dir={run}'] + \
            (['--init_from=resume'] if resume else [])  # train.py stops once it has met both
        todo.append(Job(run, run, 'train.txt', ['train.py', *cmd],
                        partial(finish, path, run, ' '.join(['python train.py', *cmd]), u, level),
                        recorded=partial(recorded, path, cap, stop, min_steps)))  # by another study.py since: skipped
    print(f"study: {len(plan) - len(todo)} of {len(plan)} runs recorded in {records}/; {len(todo)} to train, {jobs} "
          f"at a time; criterion: eval loss <= {level:.4f}", flush=True)
    run_jobs(todo, jobs, threads, 'study')


# ----------------------------------------------------------------------------- the summary
def run_endpoints(evals, u, cap, drop, loss_step):
    """One run's endpoints: steps to the criterion (None: censored), the log of those steps (a censored run counts
    as the cap: conservative), the eval loss at loss_step and at the cap, the entropy step and its log (a run
    whose entropy never drops counts as its last step)."""
    t, e = first_step_below(evals, u - drop), entropy_step(evals)
    return {'steps': t, 'log_steps': math.log(t or cap), f'loss_at_{loss_step}': loss_at(evals, loss_step),
            'loss_at_cap': loss_at(evals, cap), 'entropy_step': e,
            'log_entropy_step': math.log(e or evals[-1]['step']) if 'attn_entropy' in evals[-1] else None}


def compare(arm_runs, ref_runs, endpoint):
    """Paired comparison arm - reference on an endpoint over the seeds both have: the t-interval, the t-test and the
    exact sign-flip p, and the same on the new seeds alone (the replication)."""
    both = sorted((sd for sd in set(arm_runs) & set(ref_runs)
                   if arm_runs[sd][endpoint] is not None and ref_runs[sd][endpoint] is not None), key=int)
    if len(both) < 2:
        return None

    def stats(seeds):
        d = [arm_runs[sd][endpoint] - ref_runs[sd][endpoint] for sd in seeds]
        mean, ci, p = paired_t(d)
        return {'seeds': seeds, 'n': len(seeds), 'mean': mean, 'ci95': [float(ci[0]), float(ci[1])], 'p_t': float(p),
                'p_sign_flip': sign_flip_p(d), 'per_seed': dict(zip(seeds, d))}
    out = stats(both)
    new = [sd for sd in both if int(sd) >= NEW_SEEDS]
    out['new_seeds'] = stats(new) if len(new) >= 2 else None
    return out


def censored_summary(runs, u, cap, drop, loss_step, sweep):
    """runs: {arm: {seed: evals}} -> the summary: per arm the runs that met the criterion, the Kaplan-Meier median
    and restricted mean steps, the eval loss at loss_step, the entropy endpoint and how it goes with the exit; the
    paired comparisons of each arm with its references (t-intervals, t and exact sign-flip tests, Holm within each
    family and endpoint, the new seeds alone); the equivalence test; the medians at every drop of the sweep (a list
    of drops)."""
    def censored(t, evals):  # (time, event) for Kaplan-Meier: a run without the event leaves at its last step
        return (t, True) if t is not None else (evals[-1]['step'], False)

    times = lambda evals, level: censored(first_step_below(evals, level), evals)

    level = u - drop
    runs = {arm: {sd: [r for r in e if r['step'] <= cap] for sd, e in rs.items()} for arm, rs in runs.items()}
    ends = {arm: {sd: run_endpoints(e, u, cap, drop, loss_step) for sd, e in rs.items()} for arm, rs in runs.items()}
    out = {'per_arm': {}, 'comparisons': [], 'equivalence': None, 'sweep': {}}
    for arm, rs in runs.items():
        tt, ev = zip(*[times(e, level) for e in rs.values()])
        curve = kaplan_meier(tt, ev)
        losses = [ends[arm][sd][f'loss_at_{loss_step}'] for sd in rs]  # run_endpoints has it
        ent = {sd: ends[arm][sd]['entropy_step'] for sd in rs}
        pairs = [(ent[sd], ends[arm][sd]['steps']) for sd in rs if ent[sd] is not None and ends[arm][sd]['steps']]
        out['per_arm'][arm] = {
            'seeds': list(rs), 'reached': int(sum(ev)), 'n': len(rs),
            'steps_to_criterion': {s: (t if e else None) for s, t, e in zip(rs, tt, ev)},
            'km_median': km_median(curve), 'rmst': round(rmst(curve, cap), 1), 'km_curve': curve,
            f'loss_at_{loss_step}': {'mean': float(np.mean(losses)), 'sd': float(np.std(losses, ddof=1)) if len(rs) > 1
                                     else None, 'per_seed': dict(zip(rs, losses))} if None not in losses else None,
            'entropy_step': ent, 'entropy_step_median': km_median(kaplan_meier(*zip(*[censored(ent[sd], rs[sd])
                                                                                      for sd in rs]))),
            'entropy_vs_exit': {'n': len(pairs), 'spearman': rank_correlation(pairs),
                                'lag_median': float(np.median([b - a for a, b in pairs])) if pairs else None}}
    endpoints = ['log_steps', f'loss_at_{loss_step}', 'log_entropy_step', 'loss_at_cap']
    for arm in runs:
        for ref in REFERENCES[ARMS[arm][2]]:
            for endpoint in endpoints:
                c = compare(ends[arm], ends[ref], endpoint) if ref in runs and ref != arm else None
                if c:
                    out['comparisons'].append({'arm': arm, 'reference': ref, 'family': ARMS[arm][2],
                                               'endpoint': endpoint, **c})
    for family in SEEDS:  # Holm within each family and endpoint, over its comparisons (and again on the new seeds)
        for endpoint in endpoints:
            group = [c for c in out['comparisons'] if c['family'] == family and c['endpoint'] == endpoint]
            for c, p in zip(group, holm([c['p_t'] for c in group])):
                c['p_holm'] = p
            group = [c for c in group if c['new_seeds']]
            for c, p in zip(group, holm([c['new_seeds']['p_t'] for c in group])):
                c['new_seeds']['p_holm'] = p
    arm, ref, margin = EQUIVALENCE
    if arm in ends and ref in ends:
        both = sorted(set(ends[arm]) & set(ends[ref]), key=int)
        if len(both) >= 2:
            ci, p = tost([ends[arm][sd]['log_steps'] - ends[ref][sd]['log_steps'] for sd in both], margin)
            out['equivalence'] = {'arm': arm, 'reference': ref, 'endpoint': 'log_steps', 'margin': float(margin),
                                  'n': len(both), 'ci90': [float(ci[0]), float(ci[1])], 'p_tost': float(p),
                                  'shown': bool(-margin < ci[0] and ci[1] < margin)}
    for d in sweep:
        out['sweep'][f"{d:g}"] = {
            arm: {'km_median': km_median(kaplan_meier(*zip(*[times(e, u - d) for e in rs.values()]))),
                  'reached': sum(first_step_below(e, u - d) is not None for e in rs.values()), 'n': len(rs)}
            for arm, rs in runs.items()}
    return out


def survival_figure(per_arm, cap, drop, path):
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


def base_settings(base, min_steps, loss_step):
    """The base config's own settings, checked, and the cap (its max_iters)."""
    base_cfg = read_checked(base, BASE_CONFIG, 'study')
    cap = base_cfg['max_iters']
    check('study', (cap >= min_steps >= loss_step >= 0 and min_steps % base_cfg['eval_interval'] == 0
                    and loss_step % base_cfg['eval_interval'] == 0,
                    f"min_steps and loss_step must be multiples of eval_interval ({base_cfg['eval_interval']}), "
                    f"0 <= loss_step <= min_steps <= max_iters ({cap})"))
    return base_cfg, cap


def read_records(plan, records):
    return {(arm, sd): read_record(os.path.join(records, f"{arm}_s{sd}.jsonl")) for arm, sd, _ in plan}


def unigram_level(recs, base_cfg, records, train):
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


def finished_runs(plan, recs, cap, stop, min_steps, records):
    """({arm: {seed: evals}} of the finished runs that match the plan, the names of the others, the shared settings):
    finished, a run reached the cap or met the stop level and min_steps."""
    runs, missing, shared, short = {}, [], {}, []
    for arm, sd, cmd in plan:
        rec = recs[(arm, sd)]
        if rec and not differ(rec[0]['config'], cmd) and record_complete(rec[1], cap, stop, min_steps):
            runs.setdefault(arm, {})[sd], shared = rec[1], rec[0]['config']
        elif rec and not differ(rec[0]['config'], cmd):  # a record ends where its run did: this one was cut
            short.append(f"{arm}_s{sd}.jsonl (last step {rec[1][-1]['step']})")
        else:
            missing.append(f"{arm}_s{sd}")
    check('study', (not short, f"records in {records}/ end before the cap ({cap}) and the criterion: "
                               f"{', '.join(short)}: restore them (git checkout {records}) or complete them with "
                               "--train=True; no summary was written"))
    print(f"study: {sum(map(len, runs.values()))} runs recorded" + (f"; not yet run: {', '.join(missing)}" if missing
                                                                      else ", every run of the plan"))
    check('study', (runs, f"no finished run recorded in {records}/: run the study with --train=True"))
    return runs, missing, shared


ENDPOINT_NAMES = {'log_steps': 'steps to the criterion (ratio, arm / reference)',
                  'log_entropy_step': 'steps to the entropy drop (ratio, arm / reference)',
                  'loss_at_cap': 'eval loss at the cap (difference, nats)'}


def comparison_table(comparisons, endpoint, loss_step):
    """One endpoint's paired comparisons as a Markdown table: log endpoints as ratios of steps."""
    ratio = endpoint.startswith('log_')
    num = (lambda x: f"{math.exp(x):.2f}") if ratio else (lambda x: f"{x:+.3f}")
    rows = [c for c in comparisons if c['endpoint'] == endpoint]
    if not rows:
        return
    print(f"\n*{ENDPOINT_NAMES.get(endpoint, f'eval loss at step {loss_step} (difference, nats)')}: mean [95% "
          f"t-interval]; p: paired t, exact sign-flip, Holm (t, within the family); seeds {NEW_SEEDS}+ alone*\n\n"
          f"| arm - reference | family | seeds | mean [95% CI] | p (t) | p (sign-flip) | p (Holm) "
          f"| seeds {NEW_SEEDS}+: n, mean [95% CI], p (t) |\n|---|---|---|---|---|---|---|---|")
    for c in rows:
        new = c['new_seeds']
        rep = f"{new['n']}, {num(new['mean'])} [{num(new['ci95'][0])}, {num(new['ci95'][1])}], {new['p_t']:.3g}" \
            if new else "-"
        print(f"| {ARMS[c['arm']][0]} - {ARMS[c['reference']][0]} | {c['family']} | {c['n']} | {num(c['mean'])} "
              f"[{num(c['ci95'][0])}, {num(c['ci95'][1])}] | {c['p_t']:.3g} | {c['p_sign_flip']:.3g} | "
              f"{c['p_holm']:.3g} | {rep} |")


def entropy_figure(runs, per_arm, drop, path):
    """Per arm, each seed's mean attention entropy against steps (thin lines), its entropy step (o) and the step it
    met the criterion (x)."""
    plt = plot.pyplot()
    arms = [a for a in runs if any('attn_entropy' in r for e in runs[a].values() for r in e)]
    cols = min(4, len(arms))
    rows = -(-len(arms) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), dpi=150, squeeze=False, sharex=True,
                             sharey=True)
    for ax, arm in zip(axes.flat, arms):
        for sd, evals in runs[arm].items():
            steps = [r['step'] for r in evals if 'attn_entropy' in r]
            ent = {r['step']: float(np.mean(r['attn_entropy'])) for r in evals if 'attn_entropy' in r}
            line = ax.plot(steps, [ent[t] for t in steps], lw=0.7, alpha=0.8)[0]
            for t, m in ((per_arm[arm]['entropy_step'][sd], 'o'), (per_arm[arm]['steps_to_criterion'][sd], 'x')):
                if t is not None and t in ent:
                    ax.plot([t], [ent[t]], m, color=line.get_color(), ms=3)
        ax.set_title(f"{ARMS[arm][0]} ({len(runs[arm])})", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(arms):]:
        ax.axis('off')
    axes[0, 0].set_ylabel('attention entropy / log(keys)', fontsize=7)
    fig.suptitle(f"mean attention entropy per seed; o: below {ENTROPY_DROP:g} x its step-{ENTROPY_REF} value, "
                 f"x: eval loss <= U - {drop:g}", fontsize=8)
    plot.save(fig, path)
    plt.close(fig)


def per_seed_table(per_arm, cap):
    """Each run's steps to the criterion and its entropy step, seeds as rows: what the paired tests pair."""
    def cell(a, sd):
        if sd not in a['seeds']:
            return "-"
        t, e = a['steps_to_criterion'][sd], a['entropy_step'][sd]
        return f"{t if t is not None else f'> {cap}'} ({e if e is not None else 'never'})"
    seeds = sorted({sd for a in per_arm.values() for sd in a['seeds']}, key=int)
    print(f"\n*Steps to the criterion per seed (the entropy step in brackets; > {cap}: censored at the cap; -: not "
          f"run):*\n\n| seed | " + " | ".join(ARMS[a][0] for a in per_arm) + " |\n|---|" + "---|" * len(per_arm))
    for sd in seeds:
        print(f"| {sd} | " + " | ".join(cell(a, sd) for a in per_arm.values()) + " |")


def summarize(runs, missing, shared, u, cap, drop, loss_step, sweep, min_steps, base):
    """The summary (assets/study.json): the criterion and settings, then censored_summary's results."""
    overridden = {o.split('=')[0] for _, overrides, _ in ARMS.values() for o in overrides}
    return {
        'criterion': f"first eval step with eval loss <= U - {drop:g}, U = {u:.5f} (unigram predictor); cap {cap}",
        'unigram_loss': u, 'level': u - drop, 'drop': drop, 'cap': cap, 'min_steps': min_steps,
        'loss_step': loss_step, 'base_config': base,
        'entropy_endpoint': f"first eval step after {ENTROPY_REF} with mean attention entropy < {ENTROPY_DROP:g} x "
                            f"its step-{ENTROPY_REF} value",
        'settings': {k: v for k, v in shared.items() if k not in RUN_KEYS_IGNORED + END_KEYS + ('seed',)
                     and f'--{k}' not in overridden},
        'arms': {a: {'label': ARMS[a][0], 'overrides': ARMS[a][1], 'family': ARMS[a][2]} for a in runs},
        'missing': missing, **censored_summary(runs, u, cap, drop, loss_step, sweep)}


def report(s):
    """The summary's tables, in Markdown (docs/study.md pastes them)."""
    cap, loss_step = s['cap'], s['loss_step']
    print(f"\ncriterion: eval loss <= U - {s['drop']:g} = {s['level']:.4f} (U = {s['unigram_loss']:.4f}, the unigram "
          f"predictor's eval loss); cap {cap} steps\n\n| arm | seeds | met the criterion | median steps (Kaplan-Meier) "
          f"| restricted mean steps | eval loss at {loss_step}: mean (sd) | median entropy step (Kaplan-Meier) | "
          f"entropy step vs exit: Spearman, median lag |\n|---|---|---|---|---|---|---|---|")
    for arm, a in s['per_arm'].items():
        l, ev = a[f'loss_at_{loss_step}'], a['entropy_vs_exit']
        loss = f"{l['mean']:.3f}" + (f" ({l['sd']:.3f})" if l['sd'] is not None else "") if l else "-"
        ent = f"{a['entropy_step_median']:.0f}" if a['entropy_step_median'] is not None else "> its runs"
        rel = (f"{ev['spearman']:+.2f}" if ev['spearman'] is not None else "-") + \
            (f", {ev['lag_median']:.0f} ({ev['n']})" if ev['lag_median'] is not None else "")
        print(f"| {ARMS[arm][0]} | {len(a['seeds'])} | {a['reached']} of {a['n']} | {fmt_steps(a, cap)} "
              f"| {a['rmst']:.0f} | {loss} | {ent} | {rel} |")
    for endpoint in ('log_steps', f'loss_at_{loss_step}', 'log_entropy_step', 'loss_at_cap'):
        comparison_table(s['comparisons'], endpoint, loss_step)
    e = s['equivalence']
    if e:
        print(f"\nEquivalence, {ARMS[e['arm']][0]} - {ARMS[e['reference']][0]}, steps to the criterion: 90% interval "
              f"of the ratio [{math.exp(e['ci90'][0]):.2f}, {math.exp(e['ci90'][1]):.2f}] against the margin "
              f"[{math.exp(-e['margin']):.2f}, {math.exp(e['margin']):.2f}] (n = {e['n']}, TOST p = "
              f"{e['p_tost']:.3g}): {'shown' if e['shown'] else 'not shown'}")
    print("\n*Median steps to each level of the sweep (Kaplan-Meier: a run that never reaches a level is censored "
          "at its last step; in brackets the runs that reached it):*\n\n| drop (nats below U) | "
          + " | ".join(ARMS[a][0] for a in s['per_arm']) + " |\n|---|" + "---|" * len(s['per_arm']))
    for d, row in s['sweep'].items():
        print(f"| {d} | " + " | ".join(f"{fmt_steps(r, cap)} ({r['reached']}/{r['n']})" for r in row.values())
              + " |")
    per_seed_table(s['per_arm'], cap)


def draw(runs, s, records, prefix):
    """The figures: <prefix>_loss and _diagnostics (plot.py's, from the records), _survival and _entropy."""
    paths = [os.path.join(records, f"{a}_s{sd}.jsonl") for a in runs for sd in runs[a]]
    plot.main(paths, '', [ARMS[a][0] for a in runs for _ in runs[a]], s['level'], prefix)  # labels hold commas
    survival_figure(s['per_arm'], s['cap'], s['drop'], f"{prefix}_survival")
    entropy_figure(runs, s['per_arm'], s['drop'], f"{prefix}_entropy")


def numbers(text):
    """A comma list of numbers, or None where one is not a number."""
    try:
        return [float(x) for x in text.split(',') if x]
    except ValueError:
        return None


def main():
    arm_list = ','.join(comma_list('study', 'arms', arms, list(ARMS))) if arms else ''  # '': every arm, seed
    seed_list = ','.join(comma_list('study', 'seeds', seeds, numbers=True)) if seeds else ''  # as planned
    check('study', (jobs >= 1 and threads >= 0 and min_steps >= 0, "jobs must be >= 1, threads and min_steps >= 0"),
          (records.strip() and out_dir.strip(), "records and out_dir must name folders (an unset shell variable?)"),
          (numbers(','.join(comma_list('study', 'sweep', sweep)) if sweep else '') is not None,
           "sweep must be a comma list of drops in nats, e.g. 0.5,0.6"))
    drops = numbers(sweep)
    check('study', (len(set(drops)) == len(drops), f"sweep names a drop twice ({sweep!r}): name each once"))
    plan = plan_runs(arm_list, seed_list, first_seed, base, train_args)
    base_cfg, cap = base_settings(base, min_steps, loss_step)
    u = unigram_level(read_records(plan, records), base_cfg, records, train)
    stop = stop_level(u, drop, drops)
    if train:
        lock_dir(out_dir, 'studies/study.py')  # one study per folder (each train.py run also holds its own)
        run_all(plan, u, cap, u - drop, stop, min_steps, records, out_dir, jobs, threads)
    runs, missing, shared = finished_runs(plan, read_records(plan, records), cap, stop, min_steps, records)
    s = summarize(runs, missing, shared, u, cap, drop, loss_step, drops, min_steps, base)
    report(s)
    if summary:
        write_json(summary, s)
        print(f"wrote {summary}")
    if figures:
        draw(runs, s, records, figures)


if __name__ == '__main__':
    configure(globals())
    with interrupt.stops_cleanly('study', "the running runs saved and stopped, the finished ones are recorded: the "
                                          "same command continues where it stopped"):  # in the background too
        main()

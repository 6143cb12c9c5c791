"""
The second study (docs/study_glue.md): the seed papers' other claims at laptop scale. Pre-trains each arm (the
original, symmetric and pairwise operators and HybridBERT's hybrid with sub-layer LayerNorms; and the untrained
model, for GLUE only) with paired seeds, fine-tunes each final model on four GLUE tasks with several seeds, and runs
the checkpoint benchmark (Figure 3) on one seed's snapshots. Each finished job's record is kept in
assets/study_glue/ (small files, committed): the summary and figures are made from those files alone.

    python prepare_oscar.py --source=prose             # the corpus, once (docs/data.md)
    python studies/study_glue.py --glue_dir=<GLUE folder>   # runs only the jobs whose records are missing, 2 at a time
    python studies/study_glue.py --train=False              # the summary and figures from the records, nothing run

The plan, endpoints and tests were fixed before the runs (docs/study_glue.md). An interrupted job is resumed from
out/study_glue/; re-running the command continues.
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: the studies run
# from it as `python studies/<study>.py`, and import its scripts and lib/
if __name__ == '__main__':  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import datetime
from functools import partial

import numpy as np
import torch

from configurator import check, comma_list, configure
from finetune_glue import TASKS, damaged
from lib.dataloader import dataset_dir
from lib.files import read_json, write_json
import plot
from studies.jobs import (BASE_CONFIG, BENCHMARK_RECORD, GLUE_RECORD, STEP_TIMES, Job, code_commit, cpu_name,
                          differ, read_checked, read_record, run_jobs, same_request, unigram_loss, write_record)
from studies.stats import holm, paired_t, sign_flip_p, tost

# -----------------------------------------------------------------------------
base = 'studies/config/study_glue.py'  # the train.py config every arm starts from
arms = 'original,symmetric,pairwise,hybrid,untrained'  # a comma list of ARMS (below)
seeds = '2,3,4,5,6'  # paired pre-training seeds (seed 1 made the pilot)
glue_dir = ''  # GLUE in the original layout (SST-2/, MRPC/, STS-B/, RTE/): needed to fine-tune, not to summarise
tasks = 'sst2,mrpc,stsb,rte'  # GLUE-4: the plain mean of their per-task numbers (the paper's metrics)
glue_seeds = '1,2,3'  # fine-tuning seeds per pre-trained model
glue_args = '--learning_rate=1e-4 --max_train_samples=10000 --dtype=float32'  # the fine-tuning setting the pilot
                                                                               # fixed (docs/study_glue.md)
benchmark_seed = 2  # the pre-training seed whose snapshots are fine-tuned (fine-tuning seed 1) for Figure 3
jobs = 2  # jobs at a time
threads = 1  # torch threads per job (OMP_NUM_THREADS); 0 = torch's default
out_dir = 'out/study_glue'  # the jobs' working folders: <out_dir>/<arm>_s<seed>
records = 'assets/study_glue'  # the finished jobs' records
summary = 'assets/study_glue.json'  # '' = none
figures = 'assets/study_glue'  # output prefix of the figures; '' = none
train = True  # False: run nothing; summarise the records there are (the missing ones are listed)
# -----------------------------------------------------------------------------
ARMS = {  # name: (legend label, train.py overrides of the base config)
    'original': ('original', ['--attention_type=original']),
    'symmetric': ('symmetric', ['--attention_type=symmetric']),
    'pairwise': ('pairwise', ['--attention_type=pairwise']),
    'hybrid': ('hybrid (original + additive, sub-LN)', ['--attention_type=hybrid', '--sub_ln=True']),
    'untrained': ('original, untrained', ['--attention_type=original', '--max_iters=0']),  # GLUE only
}
BENCH_NAMES = {'hybrid': 'hybrid+sub_ln'}  # an arm's name in bench.py --attention_types, where it differs
MARGIN = 1.0  # GLUE-4 points: an operator is "as good as" the original only if the 90% interval lies inside +-1
CLAIM = 2.0  # HybridBERT's MLM accuracy ratio under a fixed budget
PLANNED_SD = {'mlm': 0.066, 'glue4': 0.42}  # the plan's sd of a paired difference: log ratio; GLUE-4 points
PAPER_TABLE3 = {'original': (78.74, 72.72), 'symmetric': (74.82, 69.61), 'pairwise': (79.36, 73.38)}  # GLUE, base/small
REFERENCE = 'original'  # every arm is compared with it, paired by seed; Holm over the pre-trained arms per endpoint


# ----------------------------------------------------------------------------- jobs and records
def plan_jobs():
    """[(kind, arm, seed, command, its working folder, its record)] in the order they run: seed-major, each model's
    fine-tuning right after its pre-training, so that a partial study has whole (arm, seed) pairs."""
    arm_list, seed_list = arms.split(','), seeds.split(',')  # checked: plain_lists()
    check('study_glue', (jobs >= 1 and threads >= 0, "jobs must be >= 1, threads >= 0"))
    glue = [f'--tasks={tasks}', *glue_args.split()]
    out = []
    for sd in seed_list:
        for arm in arm_list:
            run, rec = os.path.join(out_dir, f"{arm}_s{sd}"), os.path.join(records, f"{arm}_s{sd}")
            out.append(('pretrain', arm, sd, [base, *ARMS[arm][1], f'--seed={sd}'], run, rec + '.jsonl'))
            out.append(('glue', arm, sd, [f'--init_from={run}/ckpt.pt', f'--seeds={glue_seeds}', *glue,
                                          f'--out_dir={run}/glue'], run, rec + '.glue.json'))
            if int(sd) == benchmark_seed and arm != 'untrained':
                out.append(('benchmark', arm, sd, [f'--benchmark={run}', '--seeds=1', *glue,
                                                   f'--out_dir={run}/benchmark'], run, rec + '.benchmark.json'))
    return out


def plain_lists():
    """The comma-list settings checked once (configurator.comma_list) and set in their plain spelling: seed '01' is
    the seed 1 whose results finetune_glue.py records as '1'."""
    global arms, seeds, tasks, glue_seeds
    arms, tasks = (','.join(comma_list('study_glue', k, v, names)) for k, v, names in
                   (('arms', arms, list(ARMS)), ('tasks', tasks, list(TASKS))))
    seeds, glue_seeds = (','.join(comma_list('study_glue', k, v, numbers=True)) for k, v in
                         (('seeds', seeds), ('glue_seeds', glue_seeds)))


def read_glue_record(rec, who='study_glue'):
    """A GLUE record, checked as finetune_glue.py checks its results (damaged: a seed '01' beside '1', a score
    outside its metric's range or not their mean), its runs exactly the tasks and seeds its request asked for: else
    one line, never counted."""
    r = read_checked(rec, GLUE_RECORD, who)
    fix = f"restore it (git checkout {rec}) or move it away and run again"
    if bad := damaged(r['runs']):
        raise SystemExit(f"{who}: {rec}: the result of {bad} is damaged: {fix}")
    q, runs = r['request'], {t: sorted(v) for t, v in r['runs'].items()}
    asked = {t: sorted(q['seeds'].split(',')) for t in q['tasks'].split(',')} if {'tasks', 'seeds'} <= set(q) else None
    if any(t not in TASKS for t in runs) or (asked is not None and runs != asked):
        raise SystemExit(f"{who}: {rec}: its runs ({', '.join(f'{t} seeds {v}' for t, v in runs.items())}) are not "
                         f"what its request asked for (tasks {q.get('tasks')}, seeds {q.get('seeds')}): {fix}")
    return r


def job_done(kind, cmd, rec):
    """The job's record is there, and of these settings (another one is refused: nothing is overwritten)."""
    if kind == 'pretrain':
        r = read_record(rec, 'study_glue')
        if r and (changed := differ(r[0]['config'], cmd)):
            raise SystemExit(f"study_glue: {rec} is a run of other settings ({', '.join(changed)}): move it away")
        return r is not None
    if not os.path.exists(rec):
        return False
    r = read_glue_record(rec) if kind == 'glue' else read_checked(rec, BENCHMARK_RECORD, 'study_glue')
    asked = [a for a in cmd if not a.startswith(('--init_from', '--benchmark', '--out_dir'))]  # where: not what
    if not same_request(r['request'], asked):
        raise SystemExit(f"study_glue: {rec} was made with other settings "
                         f"({' '.join(f'--{k}={v}' for k, v in r['request'].items())}): move it away")
    # the pre-training run it fine-tuned, trained again since (another run id): these results are another model's
    # (records made before run ids name none: not checked)
    pre = rec.rsplit('.', 2)[0] + '.jsonl'
    head = (read_record(pre, 'study_glue') or [{}])[0]
    named = [r.get('protocol', {}).get('pretrained', {})] + [x.get('pretrained', {}) for x in r.get('records', [])]
    others = {p.get('run_id') for p in named} - {None, head.get('run_id')}
    if head.get('run_id') and others:
        raise SystemExit(f"study_glue: {rec} holds results of another pre-training run (run {', '.join(others)}) "
                         f"than {pre} (run {head['run_id']}): move it away")
    return True


def command(kind, cmd, run):
    """The job's command line: a pre-training resumes its checkpoint; fine-tuning needs the GLUE folder."""
    if kind == 'pretrain':
        return ['train.py', *cmd, f'--out_dir={run}'] + (['--init_from=resume'] if os.path.exists(
            os.path.join(run, 'ckpt.pt')) else [])
    check('study_glue', (glue_dir, "set --glue_dir=<GLUE folder> to fine-tune (SST-2/, MRPC/, STS-B/, RTE/ inside)"))
    return ['finetune_glue.py', *cmd, f'--data_dir={glue_dir}']


def write_glue_record(kind, cmd, run, rec, extra=None):
    """The fine-tuning results (glue_results.json or benchmark.json), the request that made them and where, with the
    caller's `extra` facts: written once, whole."""
    src = os.path.join(run, 'glue', 'glue_results.json') if kind == 'glue' else os.path.join(run, 'benchmark',
                                                                                             'benchmark.json')
    res = read_json(src, 'GLUE results')
    request = dict(a[2:].split('=', 1) for a in cmd if not a.startswith(('--init_from', '--benchmark', '--out_dir')))
    head = {'request': request, 'torch': torch.__version__, 'cpu': cpu_name(), 'commit': code_commit(),
            'date': datetime.date.today().isoformat()}
    if kind == 'glue':
        res = {'runs': res['runs'], 'protocol': {k: v for k, v in res['protocol'].items()
                                                 if k not in ('init_from', 'data_dir')}}
    else:
        res = {'records': [{k: r[k] for k in ('step', 'score', 'numbers', 'pretrained') if k in r}
                           for r in res['records']],
               'step_95': res['step_95'], 'final_score': res['final_score']}
    write_json(rec, {**head, **res, **(extra or {})})


def finish(kind, cmd, run, rec, u):
    """A job that ended well: its record written."""
    if kind == 'pretrain':
        write_record(rec, run, ' '.join(['python train.py', *cmd]), u)
    else:
        write_glue_record(kind, cmd, run, rec)
    return rec


def run_all(plan, u):
    """Runs the jobs whose records are missing, `jobs` at a time, each once what it needs is recorded (fine-tuning
    its model's pre-training); writes each record as its job ends."""
    todo = [Job(f"{kind} {arm}_s{sd}", run, f'{kind}.txt', command(kind, cmd, run),
                partial(finish, kind, cmd, run, rec, u),
                needs='' if kind == 'pretrain' else os.path.join(records, f"{arm}_s{sd}.jsonl"),
                recorded=partial(job_done, kind, cmd, rec))  # by another study_glue.py since: skipped
            for kind, arm, sd, cmd, run, rec in plan if not job_done(kind, cmd, rec)]
    print(f"study_glue: {len(plan) - len(todo)} of {len(plan)} jobs recorded in {records}/; {len(todo)} to run, "
          f"{jobs} at a time", flush=True)
    run_jobs(todo, jobs, threads, 'study_glue')


# ----------------------------------------------------------------------------- the summary
def glue4(rec, tasks, glue_seeds):
    """A model's GLUE-4: per fine-tuning seed the plain mean of its task numbers, then the mean over the seeds; and
    the per-task means. None unless every task has every seed."""
    want, runs = tasks.split(','), rec['runs']
    seeds_ = glue_seeds.split(',')
    if not all(sd in runs.get(t, {}) for t in want for sd in seeds_):
        return None
    per = lambda t, sd: np.mean([m['score'] for m in runs[t][sd]['dev'].values()])
    return {'score': float(np.mean([np.mean([per(t, sd) for t in want]) for sd in seeds_])),
            'tasks': {t: float(np.mean([per(t, sd) for sd in seeds_])) for t in want}}


def compare(values, arm, ref=REFERENCE, log=False):
    """Paired comparison arm - ref over the seeds both have: mean difference (of logs: a ratio) with its 95%
    t-interval, the t-test and the exact sign-flip p."""
    both = sorted((sd for sd in set(values.get(arm, {})) & set(values.get(ref, {}))
                   if values[arm][sd] is not None and values[ref][sd] is not None), key=int)
    if len(both) < 2 or (log and min(min(values[arm][sd], values[ref][sd]) for sd in both) <= 0):
        return None
    f = np.log if log else (lambda x: x)
    d = [float(f(values[arm][sd]) - f(values[ref][sd])) for sd in both]
    mean, ci, p = paired_t(d)
    g = np.exp if log else (lambda x: x)
    return {'arm': arm, 'reference': ref, 'n': len(both), 'seeds': both, 'mean': float(g(mean)),
            'ci95': [float(g(ci[0])), float(g(ci[1]))], 'p_t': float(p), 'p_sign_flip': sign_flip_p(d),
            'per_seed': dict(zip(both, d)), 'sd': float(np.std(d, ddof=1))}  # realised spread (of logs for a ratio)


def time_matched_step(arm, step_ms, cap):
    """The step at which `arm` has spent the time the fastest pre-trained arm needs for `cap` steps (each arm's
    ms/step from one quiet bench.py run)."""
    fastest = min(step_ms[a] for a in step_ms if a in ARMS and a != 'untrained')
    return cap * fastest / step_ms[arm]


def interpolate(evals, step, key):
    """The eval record's `key` at `step`, linear between the evals around it (None outside the evals)."""
    pts = [(r['step'], r[key]) for r in evals]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if s0 <= step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return next((v for s_, v in pts if s_ == step), None)


def ratio_by_step(pre, arm, ref=REFERENCE):
    """{step: the geometric mean over paired seeds of arm / ref MLM accuracy}, at every eval where both are > 0:
    where on its curve each arm is when the endpoints read it."""
    acc = lambda a, sd: {r['step']: r['accuracy'] for r in pre[a][sd]}
    logs = {}
    for sd in sorted(set(pre[arm]) & set(pre[ref]), key=int):  # a fixed order: the same sums every run
        x, y = acc(arm, sd), acc(ref, sd)
        for st in x.keys() & y.keys():
            if x[st] > 0 and y[st] > 0:
                logs.setdefault(st, []).append(np.log(x[st] / y[st]))
    return {str(st): float(np.exp(np.mean(v))) for st, v in sorted(logs.items())}


def summarize(pre, glue, bench, step_ms, cap, tasks, glue_seeds):
    """pre: {arm: {seed: evals}}; glue: {arm: {seed: glue record}}; bench: {arm: benchmark record} -> the summary."""
    at = lambda evals, step, key: next((r[key] for r in evals if r['step'] == step), None)
    trained = [a for a in pre if a != 'untrained']
    acc = {a: {sd: at(e, cap, 'accuracy') for sd, e in pre[a].items()} for a in trained}
    out = {'cap': cap, 'tasks': tasks.split(','), 'per_arm': {}, 'comparisons': [], 'step_ms': step_ms or None,
           'benchmark': {}}
    endpoints = {'mlm_accuracy_at_cap': acc}
    if step_ms and all(a in step_ms for a in trained):
        steps = {a: time_matched_step(a, step_ms, cap) for a in trained}
        endpoints['mlm_accuracy_at_equal_time'] = {a: {sd: interpolate(e, steps[a], 'accuracy')
                                                       for sd, e in pre[a].items()} for a in trained}
        out['time_matched_steps'] = steps
    out['ratio_by_step'] = {a: ratio_by_step(pre, a) for a in trained if a != REFERENCE and REFERENCE in pre}
    g4_of = {a: {sd: s for sd, r in rs.items() if (s := glue4(r, tasks, glue_seeds))} for a, rs in glue.items()}
    g4 = {a: {sd: s['score'] for sd, s in rs.items()} for a, rs in g4_of.items()}
    endpoints['glue4'] = g4
    for a in pre:
        out['per_arm'][a] = {'seeds': sorted(pre[a], key=int),
                             'mlm_loss_at_cap': {sd: at(e, cap, 'loss') for sd, e in pre[a].items()},
                             'mlm_accuracy_at_cap': acc.get(a), 'glue4': g4.get(a) or None,
                             'glue4_tasks': {sd: s['tasks'] for sd, s in g4_of.get(a, {}).items()}}
    for endpoint, values in endpoints.items():
        family = [c for a in trained if a != REFERENCE and (c := compare(values, a, log=endpoint != 'glue4'))]
        for c, p in zip(family, holm([c['p_t'] for c in family])):
            out['comparisons'].append({'endpoint': endpoint, **c, 'p_holm': p})
    for c in out['comparisons']:
        if c['endpoint'] == 'glue4' and c['n'] >= 2:  # equivalence within the margin fixed before the runs
            ci, p = tost(list(c['per_seed'].values()), MARGIN)
            c['tost'] = {'margin': MARGIN, 'ci90': [float(ci[0]), float(ci[1])], 'p': float(p),
                         'shown': bool(-MARGIN < ci[0] and ci[1] < MARGIN)}
        if c['arm'] == 'hybrid' and c['endpoint'].startswith('mlm_accuracy'):  # HybridBERT's "2x", decided by the CI
            lo, hi = c['ci95']
            c['claim_2x'] = 'holds' if lo > 1 and hi >= CLAIM else 'rejected' if hi < CLAIM else 'undetermined'
    if (c := compare(g4, 'untrained')) is not None:  # what pre-training bought: outside the family
        out['comparisons'].append({'endpoint': 'glue4', **c, 'p_holm': None})
    for a, r in bench.items():
        out['benchmark'][a] = {'steps': [x['step'] for x in r['records']], 'glue4': [x['score'] for x in r['records']],
                               'step_95': r['step_95']}
    return out


def report(s):
    """The summary as Markdown tables (docs/study_glue.md and the README paste them); a table with no rows is left
    out, and a partial summary says so first."""
    if s.get('missing'):
        print(f"\n**Partial: of the plan's jobs, {len(s['missing'])} not yet run; no comparison below is a result.**")
    ms = lambda v, f='.4f': (f"{np.mean(v):{f}}" + (f" (sd {np.std(v, ddof=1):{f}})" if len(v) > 1 else '')
                             if v else '-')
    g4 = {a: list((p['glue4'] or {}).values()) for a, p in s['per_arm'].items()}
    print(f"\n| arm | seeds | MLM accuracy at step {s['cap']} | GLUE-4 |\n|---|---|---|---|")
    for a, p in s['per_arm'].items():
        print(f"| {ARMS[a][0]} | {len(p['seeds'])} | {ms(list((p['mlm_accuracy_at_cap'] or {}).values()))} | "
              f"{ms(g4[a], '.2f')} |")
    print("\n*Table 3 at laptop scale: the paper's GLUE (the mean of its 9 task numbers, MNLI m and mm apart; 5 "
          "fine-tuning seeds of one pre-training run) beside GLUE-4 here (mean (sd) over pre-training seeds, each the "
          "mean of its fine-tuning seeds), and its tasks*\n\n| arm | paper, bert-base | paper, bert-small | GLUE-4 "
          "here | " + ' | '.join(s['tasks']) + " |\n|---|---|---|---|" + '---|' * len(s['tasks']))
    for a, p in s['per_arm'].items():
        base, small = PAPER_TABLE3.get(a, ('-', '-'))
        per = [[x[t] for x in p['glue4_tasks'].values()] for t in s['tasks']]
        print(f"| {ARMS[a][0]} | {base} | {small} | {ms(g4[a], '.2f')} (n = {len(g4[a])}) | " +
              ' | '.join(f"{np.mean(v):.2f}" if v else '-' for v in per) + " |")
    steps = sorted({int(st) for r in s['ratio_by_step'].values() for st in r})
    if steps:
        print("\n*MLM accuracy, arm / original, geometric mean over paired seeds, at every eval*\n\n| arm | " +
              ' | '.join(map(str, steps)) + " |\n|---|" + '---|' * len(steps))
        for a, r in s['ratio_by_step'].items():
            print(f"| {ARMS[a][0]} | " + ' | '.join(f"{r[str(st)]:.2f}" if str(st) in r else '-' for st in steps) +
                  " |")
    if s['comparisons']:
        print("\n*arm vs original, paired by seed: accuracy as a ratio, GLUE-4 as a difference (points); mean [95% "
              f"t-interval]; sd of the paired differences (of logs for a ratio; the plan assumed {PLANNED_SD['mlm']:g} "
              f"and {PLANNED_SD['glue4']:g}); p: paired t, exact sign-flip, Holm over the three operators; GLUE-4: "
              f"equivalence (TOST, 90% interval inside +-{MARGIN:g}); hybrid: HybridBERT's {CLAIM:g}x*\n\n| endpoint | "
              "arm | n | mean [95% CI] | sd | p (t) | p (sign-flip) | p (Holm) | equivalence or 2x |\n"
              "|---|---|---|---|---|---|---|---|---|")
        for c in s['comparisons']:
            fmt = (lambda x: f"{x:+.2f}") if c['endpoint'] == 'glue4' else (lambda x: f"{x:.3f}x")
            holm_p = f"{c['p_holm']:.3g}" if c['p_holm'] is not None else 'outside the family'
            verdict = (f"{'shown' if c['tost']['shown'] else 'not shown'} [{c['tost']['ci90'][0]:+.2f}, "
                       f"{c['tost']['ci90'][1]:+.2f}]" if 'tost' in c else
                       f"2x {c['claim_2x']}" if 'claim_2x' in c else '-')
            print(f"| {c['endpoint']} | {ARMS[c['arm']][0]} | {c['n']} | {fmt(c['mean'])} [{fmt(c['ci95'][0])}, "
                  f"{fmt(c['ci95'][1])}] | {c['sd']:.3f} | {c['p_t']:.3g} | {c['p_sign_flip']:.3g} | {holm_p} | "
                  f"{verdict} |")
    for a, b in s['benchmark'].items():
        print(f"Figure 3, {ARMS[a][0]} (seed {benchmark_seed}): GLUE-4 " + ', '.join(
            f"{st}: {g:.2f}" for st, g in zip(b['steps'], b['glue4'])) + f"; 95% of the final at step {b['step_95']}")


def figure(pre, s, path):
    """MLM accuracy against step per arm (mean over seeds, thin lines per seed), and GLUE-4 against step (Figure 3)."""
    plt = plot.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=150)
    for i, (a, rs) in enumerate((a, rs) for a, rs in pre.items() if a != 'untrained'):
        for e in rs.values():
            ax.plot([r['step'] for r in e], [r['accuracy'] for r in e], color=f"C{i}", lw=0.5, alpha=0.4)
        steps = [r['step'] for r in next(iter(rs.values()))]
        ax.plot(steps, np.mean([[r['accuracy'] for r in e] for e in rs.values()], 0), color=f"C{i}",
                label=f"{ARMS[a][0]} ({len(rs)} seeds)")
        if a in s['benchmark']:
            b = s['benchmark'][a]
            bx.plot(b['steps'], b['glue4'], 'o-', color=f"C{i}", label=ARMS[a][0])
    untrained = ((s['per_arm'].get('untrained') or {}).get('glue4') or {}).get(str(benchmark_seed))
    if untrained is not None and s['benchmark']:  # step 0 of the same seed: what pre-training bought
        bx.axhline(untrained, color='gray', ls='--', lw=1,
                   label=f"untrained ({len(glue_seeds.split(','))} fine-tuning seeds)")
    ax.set(xlabel='step', ylabel='MLM accuracy (eval set)', title='Pre-training')
    bx.set(xlabel='pre-training step', ylabel='GLUE-4 (dev)', title=f'Checkpoint benchmark (seed {benchmark_seed})')
    for x in (ax, bx):
        x.grid(alpha=0.3)
        x.legend(fontsize=7)
    plot.save(fig, path)
    plt.close(fig)


def main():
    plain_lists()
    base_cfg = read_checked(base, BASE_CONFIG, 'study_glue')
    cap = base_cfg['max_iters']
    plan = plan_jobs()
    if train:
        u = unigram_loss(dataset_dir(base_cfg['dataset']), base_cfg['block_size'], base_cfg['batch_size'],
                         base_cfg['eval_iters'])
        run_all(plan, u)
    pre, glue, bench, missing = {}, {}, {}, []
    for kind, arm, sd, cmd, run, rec in plan:
        if not job_done(kind, cmd, rec):
            missing.append(f"{kind} {arm}_s{sd}")
        elif kind == 'pretrain':
            pre.setdefault(arm, {})[sd] = read_record(rec, 'study_glue')[1]
        elif kind == 'glue':
            glue.setdefault(arm, {})[sd] = read_glue_record(rec)
        else:
            bench[arm] = read_checked(rec, BENCHMARK_RECORD, 'study_glue')
    print(f"study_glue: {len(plan) - len(missing)} of {len(plan)} jobs recorded" +
          (f"; not yet run: {', '.join(missing)}" if missing else ", every job of the plan"))
    check('study_glue', (pre, f"no finished run recorded in {records}/: run the study with --train=True"))
    times = os.path.join(records, 'step_times.json')  # bench.py --json=... of the arms, one quiet run
    raw = read_checked(times, STEP_TIMES, 'study_glue')['ms_per_step'] if os.path.exists(times) else {}
    step_ms = {a: raw[BENCH_NAMES.get(a, a)] for a in ARMS if BENCH_NAMES.get(a, a) in raw}
    s = summarize(pre, glue, bench, step_ms, cap, tasks, glue_seeds)
    s['missing'] = missing
    report(s)
    if summary:
        write_json(summary, s)
    if figures:
        figure(pre, s, figures)


if __name__ == '__main__':
    configure(globals())
    with interrupt.stops_cleanly('study_glue', "the running jobs saved and stopped, the finished ones are recorded: "
                                               "the same command continues where it stopped"):  # in the background too
        main()

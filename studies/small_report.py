"""
The third study's summary (studies/study_small.py) as text and figure: its Markdown tables (docs/study_small.md and
docs/study_laptop.md paste them) and its figure, from the summary and the records alone; and the numbers the summary
is read by.
"""
import numpy as np

import plot

CLEAR = 0.975  # a gain is clear when the one-sided 97.5% bound of (snapshot - untrained) lies above 0
TREND_TARGET = 2.0  # points of gain: where the calibration's trend line reaches it (REFERENCE §4c: a clear STS-B gain)
TREND_AT = f'tokens_at_{TREND_TARGET:g}'  # its key in the summary
PROBES = ('stsb_cosine', 'sst2_logreg')  # probe.py's numbers of a model; its baselines need none
WHO = 'study_small'


def tokens_text(n):
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def report_calibration(c, f, n_ft, drop, corpus=''):
    """One calibration run's table (report): n_ft fine-tuning seeds planned, drop the plateau exit's."""
    ts, sub = [k for k in c['noise'] if k not in ('glue4', 'score')], 'score' in c['noise']  # sub: calib_tasks' mean
    print(f"\n*Calibration{corpus}: the original operator, seed {c['seed']}, {c['recipe']}, {c['steps']} steps; "
          f"fine-tuning lr {c['glue_lr']:g} (mean over seeds; gain: over the untrained model, with its {CLEAR:.1%} "
          f"one-sided bound from the pooled fine-tuning sd)*\n\n| tokens | hours | eval loss | MLM accuracy | GLUE-4 (seeds) | "
          + ('score (seeds) | ' if sub else '') + ' | '.join(ts) + " | gain [half] |\n|---|---|---|---|---|"
          + '---|' * (len(ts) + sub) + '---|')
    gains = {g['step']: g for g in c['gain']}
    mark = lambda x: ' clear' if x['clear'] else f" {min(x['seeds'])} of {n_ft} seeds" if min(x['seeds']) < n_ft \
        else ''
    for p in c['points'] + ([c['untrained_own_lr']] if c['untrained_own_lr'] else []):
        g = gains.get(p['step'], {}) if p['step'] else {}
        label = tokens_text(p['tokens']) if p['step'] else f"untrained, lr {p['glue_lr']:g}"
        print(f"| {label} | {f(p['train_hours'])} | {f(p['mlm_loss'], '.4f')} | {f(p['mlm_accuracy'], '.4f')} | "
              f"{f(p['glue4'])} ({len(p['glue4_per_seed'])}) | " +
              (f"{f(p['score'])} ({len(p['score_per_seed'])})" + (f" ({g['score']['diff']:+.2f} "
               f"[{g['score']['half95']:.2f}]{mark(g['score'])})" if g.get('score') else '') + " | " if sub else '') +
              ' | '.join(f(p['tasks'].get(t)) + (f" ({g[t]['diff']:+.2f} [{g[t]['half95']:.2f}]"
                                                   f"{mark(g[t])})" if g.get(t) else '')
                         for t in ts) + " | " +
              (f"{g['glue4']['diff']:+.2f} [{g['glue4']['half95']:.2f}]{mark(g['glue4'])}"
               if g.get('glue4') else '-') + " |")
    print("first clear gain: " + '; '.join(f"{k} " + (f"at {tokens_text(v['tokens'])} tokens ({v['diff']:+.2f})"
                                                     if v else "none") for k, v in c['first_clear'].items()) +
          f"; plateau exit (loss <= U - {drop:g}): step {c['plateau_exit_step']}")
    for n, r in c['reruns'].items():
        print(f"made again: {n}, to step {r['step']}: " + (
            "every eval the first run's, bit for bit" if r['as_first'] else "its evals differ from the first run's"))
    at = lambda v: "- (no measurable rise)" if v[TREND_AT] is None else \
        f"~{tokens_text(v[TREND_AT])} tokens (extrapolated)"
    print("trend of the gains (per doubling of the tokens): " + '; '.join(
        f"{k} " + (f"{v['per_doubling']:+.2f} [{v['half95']:.2f}] over {v['points']} points, +{TREND_TARGET:g} at "
                   f"{at(v)}" if v else "-") for k, v in c['trend'].items()))
    if 'baselines' in c:  # probes: one number per model, frozen; the baselines need no model
        rows = []
        for p in c['points']:
            g = gains.get(p['step'], {}).get('probe') if p['step'] else None
            nums = ', '.join(f"{k} {p['probe'][k]:.2f}" + (f" ({g[k]:+.2f})" if g else '') for k in PROBES) \
                if p['probe'] else '-'
            rows.append(f"{tokens_text(p['tokens']) if p['step'] else 'untrained'}: {nums}")
        print("frozen probes (dev; change from the untrained model): " + '; '.join(rows) + "; baselines: " +
              ', '.join(f"{k} {v:.2f}" for k, v in (c['baselines'] or {}).items()))


def report(s, n_ft, drop):
    """The summary as Markdown tables (docs/study_small.md pastes them)."""
    f = lambda x, fmt='.2f': '-' if x is None else f"{x:{fmt}}"
    print(f"\n{WHO}: device {', '.join(s['gpu']) or '-'}; " + (f"{len(s['missing'])} jobs of the plans not yet run"
                                                                if s['missing'] else "every job of the plans recorded"))
    if p := s['pilot']:
        print(f"\n*Pilot: pre-training recipe ({tokens_text(p['tokens'])} tokens, {p['steps']} steps, seed {p['seed']}); "
              f"picked: {p['picked'] or '-'}*\n\n| lr | dropout | eval loss | MLM accuracy | tokens/s |\n"
              "|---|---|---|---|---|")
        for r in p['runs'].values():
            print(f"| {r['lr']:g} | {r['dropout']:g} | " + ('diverged | - | - |' if r['diverged'] else
                                                           f"{r['mlm_loss']:.4f} | {r['mlm_accuracy']:.4f} | "
                                                           f"{f(r['tokens_per_s'], ',.0f')} |"))
        if p['glue']:
            print(f"\n*Pilot: fine-tuning lr (mean of {p['glue_tasks']}, one seed); picked: {p['picked_glue_lr']}; "
                  f"the untrained model's own: {p['untrained_glue_lr']}*\n\n| lr | {p['glue_model'] or '-'} | "
                  "untrained |\n|---|---|---|")
            for r in p['glue'].values():
                print(f"| {r['lr']:g} | {f(r['pilot_model'] and r['pilot_model']['score'])} | "
                      f"{f(r['untrained'] and r['untrained']['score'])} |")
    if c := s['calibration']:
        report_calibration(c, f, n_ft, drop)
        for name, x in c.get('corpora', {}).items():
            report_calibration(x, f, n_ft, drop, f" on {name}")
    if s['per_arm']:
        probed = PROBES if any('probe' in p for p in s['per_arm'].values()) else ()
        print(f"\n*Comparison: {tokens_text(s['comparison']['tokens'])} tokens ({s['comparison']['cap']} steps); mean "
              "over seeds*\n\n| arm | seeds | eval loss | MLM accuracy | GLUE-4 | plateau exit | ms/step |" +
              ''.join(f" {k} (frozen) |" for k in probed) + "\n|---|---|---|---|---|---|---|" + '---|' * len(probed))
        m = lambda d: f"{np.mean([v for v in d.values() if v is not None]):.4f}" if d and any(
            v is not None for v in d.values()) else '-'
        for a, p in s['per_arm'].items():
            print(f"| {a} | {len(p['seeds'])} | {m(p['mlm_loss_at_cap'])} | {m(p['mlm_accuracy_at_cap'])} | "
                  f"{m(p['glue4'])} | {m(p['plateau_exit_step'])} | {f(p['ms_per_step'])} |" +
                  ''.join(f" {m(p['probe'][k])} |" for k in probed))
        if s['comparison'].get('partial'):
            print("\n**Partial: some of the comparison's jobs have not run; no comparison below is a result.**")
        for c in s['comparisons']:
            ratio = c['endpoint'] in ('mlm_accuracy_at_cap', 'mlm_accuracy_at_equal_time', 'plateau_exit_step')
            fmt = (lambda x: f"{x:.3f}x") if ratio else (lambda x: f"{x:+.3f}")
            print(f"{c['endpoint']}, {c['arm']} vs {c['reference']} (n {c['n']}): {fmt(c['mean'])} "
                  f"[{fmt(c['ci95'][0])}, {fmt(c['ci95'][1])}], p {c['p_t']:.3g}, sign-flip {c['p_sign_flip']:.3g}" +
                  (f", Holm {c['p_holm']:.3g}" if c['p_holm'] is not None else '') +
                  (f"; equivalence (90% in +-{c['tost']['margin']:g}) {'' if c['tost']['shown'] else 'not '}shown "
                   f"[{c['tost']['ci90'][0]:+.3f}, {c['tost']['ci90'][1]:+.3f}]" if 'tost' in c else ''))
    by_phase = {}  # 'phase: job' names, grouped: a phase's first few, then its count
    for m in s['missing']:
        ph, _, job = m.partition(': ')
        by_phase.setdefault(ph, []).append(job)
    if by_phase:
        print("not yet run: " + '; '.join(f"{ph}: {', '.join(js[:4])}" + (f", ... ({len(js)} in all)" if len(js) > 4
                                                                        else '') for ph, js in by_phase.items()))


def figure(s, recs, pilot, tps, tasks, seed, path):
    """MLM eval loss against tokens (the pilot's runs, `pilot`: [(recipe, evals)], and the calibration's), GLUE-4
    against tokens (the calibration's snapshots and untrained model), and MLM accuracy against step per comparison
    arm: the panels that have data. tps: tokens a step; the records `recs` by name."""
    c = s['calibration']
    calib = recs.get(f"calib_s{seed}") if c else None
    panels = [x for x in ('loss', 'glue', 'cmp') if {'loss': pilot or calib, 'glue': c and any(
        p['tasks'] for p in c['points'][1:]), 'cmp': s['per_arm']}[x]]
    if not panels:
        return
    plt = plot.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), dpi=150, squeeze=False)
    ax = dict(zip(panels, axes[0]))
    if 'loss' in ax:
        for p, ev in pilot:
            ax['loss'].plot([r['step'] * tps / 1e6 for r in ev], [r['loss'] for r in ev], lw=0.8, ls='--',
                            label=f"pilot, {p}")
        if calib:
            ax['loss'].plot([r['step'] * tps / 1e6 for r in calib[1]], [r['loss'] for r in calib[1]], color='k',
                            label=f"calibration, lr {c['learning_rate']:g}")
            ax['loss'].axhline(calib[0]['unigram_loss'], color='gray', lw=0.8, ls=':', label='U (token frequencies)')
        for j, name in enumerate(c.get('corpora', {}) if c else []):  # the same val set: the curves compare
            if r := recs.get(f"calib_{name}_s{seed}"):
                ax['loss'].plot([e['step'] * tps / 1e6 for e in r[1]], [e['loss'] for e in r[1]], color=f"C{7 + j}",
                                label=f"calibration on {name}")
        ax['loss'].set(xlabel='tokens seen (M)', ylabel='MLM eval loss', title='Pre-training')
    if 'glue' in ax:
        pts = [p for p in c['points'][1:] if p['glue4'] is not None]
        x = lambda p: p['tokens'] / 1e6
        ax['glue'].plot([x(p) for p in pts], [p['glue4'] for p in pts], 'o-', color='k', label='GLUE-4')
        if (sub := [p for p in c['points'][1:] if p.get('score') is not None]):  # calib_tasks' mean, every point
            ax['glue'].plot([x(p) for p in sub], [p['score'] for p in sub], 'D-', color='k', ms=4, lw=1.2,
                            label=f"score ({c['score_tasks']})")
            if c['points'][0].get('score') is not None:
                ax['glue'].axhline(c['points'][0]['score'], color='k', ls=':', lw=0.8)
        for j, (name, other) in enumerate(c.get('corpora', {}).items()):
            on = [p for p in other['points'][1:] if p['glue4'] is not None]
            ax['glue'].plot([x(p) for p in on], [p['glue4'] for p in on], 's-', color=f"C{7 + j}", ms=4,
                            label=f"GLUE-4 on {name}")
        seeds = lambda p, v, color, **kw: ax['glue'].plot([x(p)] * len(v), v, '.', color=color, alpha=0.4, **kw)
        for p in pts:  # each fine-tuning seed's score, faint: the spread a gain is measured against
            seeds(p, list(p['glue4_per_seed'].values()), 'k')
        for i, t in enumerate(tasks.split(',')):  # the untrained model's as a line: tokens 0 has no place on a log axis
            on = [p for p in c['points'][1:] if t in p['tasks']]
            ax['glue'].plot([x(p) for p in on], [p['tasks'][t] for p in on], 'o-' if len(on) > 1 else 'o', lw=0.8,
                            ms=3, color=f"C{i}", label=t)
            for p in on:
                seeds(p, [r[t] for r in p['tasks_per_seed'].values() if t in r], f"C{i}", ms=3)
            if t in c['points'][0]['tasks']:
                ax['glue'].axhline(c['points'][0]['tasks'][t], color=f"C{i}", ls=':', lw=0.8)
        names = tasks.split(',')
        for j, (k, t) in enumerate(zip(PROBES, ('stsb', 'sst2'))):  # the frozen probes: no seeds, no fine-tuning
            on = [p for p in c['points'][1:] if p.get('probe')]
            colour = f"C{names.index(t) if t in names else len(names) + j}"
            if on:
                ax['glue'].plot([x(p) for p in on], [p['probe'][k] for p in on], 'x--', lw=0.8, color=colour,
                                label=f"{k} (frozen)")
            if c['points'][0].get('probe'):
                ax['glue'].axhline(c['points'][0]['probe'][k], color=colour, ls='-.', lw=0.6)
        if c['points'][0]['glue4'] is not None:
            ax['glue'].axhline(c['points'][0]['glue4'], color='gray', ls='--', lw=1, label='untrained (GLUE-4)')
        ax['glue'].set(xlabel='tokens seen (M)', ylabel='dev score', xscale='log',
                       title=f"GLUE (fine-tuning lr {c['glue_lr']:g}; dotted: untrained)")
        ax['glue'].set_xticks([x(p) for p in c['points'][1:]], [f"{x(p):.1f}" for p in c['points'][1:]])
        ax['glue'].minorticks_off()
    if 'cmp' in ax:
        for i, a in enumerate(a for a in s['per_arm'] if a != 'untrained'):
            runs = [recs[f"{a}_s{sd}"][1] for sd in s['per_arm'][a]['seeds']]
            for ev in runs:
                ax['cmp'].plot([r['step'] for r in ev], [r['accuracy'] for r in ev], color=f"C{i}", lw=0.5, alpha=0.4)
            ax['cmp'].plot([r['step'] for r in runs[0]], np.mean([[r['accuracy'] for r in ev] for ev in runs], 0),
                           color=f"C{i}", label=f"{a} ({len(runs)} seeds)")
        ax['cmp'].set(xlabel='step', ylabel='MLM accuracy (eval set)', title='Comparison')
    for a in ax.values():
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    plot.save(fig, path)
    plt.close(fig)

import json
import os
import shutil

import numpy as np
import pytest

from conftest import ROOT, run_script, same
from studies.jobs import read_record
from studies import study_glue
from test_glue import write

TASKS = study_glue.tasks  # GLUE-4: sst2, mrpc, stsb, rte


def glue4_record(scores):
    """A glue record whose every task scores `scores[seed]` (one number per dev set)."""
    return {'runs': {t: {sd: {'dev': {t: {'score': x}}} for sd, x in scores.items()}
                     for t in ('sst2', 'mrpc', 'stsb', 'rte')}}


def test_summary_against_scipy():
    """Paired comparisons with the original: accuracy as a ratio (t on logs), GLUE-4 as a difference; p against
    scipy's paired t-test; Holm over the three operators; the untrained model outside the family; the time-matched
    step from the arms' step times."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    seeds = ['2', '3', '4', '5']
    acc = {a: {sd: 0.1 + 0.05 * i + 0.01 * rng.random() for sd in seeds}
           for i, a in enumerate(['original', 'symmetric', 'pairwise', 'hybrid'])}
    evals = lambda a, sd: [{'step': 0, 'loss': 10.0, 'accuracy': 0.0},
                           {'step': 50, 'loss': 6.0, 'accuracy': acc[a][sd] / 2},
                           {'step': 100, 'loss': 5.0, 'accuracy': acc[a][sd]}]
    pre = {a: {sd: evals(a, sd) for sd in seeds} for a in acc}
    g = {a: {sd: 50 + 3 * i + rng.random() for sd in seeds} for i, a in enumerate(list(acc) + ['untrained'])}
    glue = {a: {sd: glue4_record({'1': x - 1, '2': x + 1}) for sd, x in v.items()} for a, v in g.items()}
    ms = {'original': 100.0, 'symmetric': 90.0, 'pairwise': 95.0, 'hybrid': 150.0}
    s = study_glue.summarize(pre, glue, {}, ms, 100, TASKS, '1,2')
    assert s['time_matched_steps'] == pytest.approx({'original': 90, 'symmetric': 100, 'pairwise': 90 / 0.95,
                                                     'hybrid': 60})
    c = next(c for c in s['comparisons'] if c['endpoint'] == 'mlm_accuracy_at_equal_time' and c['arm'] == 'hybrid')
    at = lambda a, sd, step: acc[a][sd] / 2 + (acc[a][sd] / 2) * (step - 50) / 50  # between the evals at 50 and 100
    assert c['per_seed']['3'] == pytest.approx(np.log(at('hybrid', '3', 60) / at('original', '3', 90)))
    by = {(c['endpoint'], c['arm']): c for c in s['comparisons']}
    for a in ('symmetric', 'pairwise', 'hybrid'):
        c = by[('mlm_accuracy_at_cap', a)]
        t = stats.ttest_rel(np.log([acc[a][sd] for sd in seeds]), np.log([acc['original'][sd] for sd in seeds]))
        assert c['p_t'] == pytest.approx(t.pvalue, rel=1e-6) and c['n'] == 4
        ratio = np.exp(np.mean(np.log([acc[a][sd] / acc['original'][sd] for sd in seeds])))
        assert c['mean'] == pytest.approx(ratio) and c['ci95'][0] < ratio < c['ci95'][1]
        c = by[('glue4', a)]
        t = stats.ttest_rel([g[a][sd] for sd in seeds], [g['original'][sd] for sd in seeds])
        assert c['p_t'] == pytest.approx(t.pvalue, rel=1e-6)
        assert c['mean'] == pytest.approx(np.mean([g[a][sd] - g['original'][sd] for sd in seeds]))
    ps = sorted(by[('glue4', a)]['p_t'] for a in ('symmetric', 'pairwise', 'hybrid'))
    assert min(by[('glue4', a)]['p_holm'] for a in ('symmetric', 'pairwise', 'hybrid')) == pytest.approx(3 * ps[0])
    assert by[('glue4', 'untrained')]['p_holm'] is None  # outside the family
    assert s['per_arm']['original']['glue4']['2'] == pytest.approx(g['original']['2'])  # mean over the ft seeds
    assert ('mlm_accuracy_at_equal_time', 'hybrid') in by
    d = [g['pairwise'][sd] - g['original'][sd] for sd in seeds]  # the realised spread, beside the plan's
    assert by[('glue4', 'pairwise')]['sd'] == pytest.approx(stats.tstd(d))
    r = s['ratio_by_step']['hybrid']  # every eval where both are above 0: not step 0
    assert list(r) == ['50', '100'] and 'original' not in s['ratio_by_step']
    assert r['50'] == pytest.approx(stats.gmean([acc['hybrid'][sd] / acc['original'][sd] for sd in seeds]))


def test_a_partial_summary_says_so_and_prints_no_empty_table(capsys):
    evals = lambda accs: [{'step': 100 * i, 'loss': 6.0, 'accuracy': a} for i, a in enumerate(accs)]
    pre = {'original': {'2': evals([0.0, 0.1, 0.2])}, 'hybrid': {'2': evals([0.0, 0.05, 0.3])}}
    s = study_glue.summarize(pre, {}, {}, {}, 200, TASKS, '1,2')  # one seed: nothing to compare yet
    s['missing'] = ['glue original_s2', 'glue hybrid_s2']
    study_glue.report(s)
    out = capsys.readouterr().out
    assert "Partial: of the plan's jobs, 2 not yet run" in out and '| endpoint |' not in out
    assert '| hybrid (original + additive, sub-LN) | 0.50 | 1.50 |' in out  # the ratio at steps 100 and 200
    assert '| original | 78.74 | 72.72 | - (n = 0) | - | - | - | - |' in out  # the paper's beside no GLUE-4 yet


def test_glue4_needs_every_task_and_seed():
    r = glue4_record({'1': 60.0, '2': 70.0})
    assert study_glue.glue4(r, TASKS, '1,2')['score'] == 65.0
    del r['runs']['rte']['2']
    assert study_glue.glue4(r, TASKS, '1,2') is None


def test_the_whole_study_on_tiny_runs(data_dir, tmp_path):
    """Pre-training, GLUE and the checkpoint benchmark as jobs two at a time; each record written as its job ends;
    the same command again runs nothing; a fresh clone's records alone give the same summary."""
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    glue = tmp_path / "glue"
    for folder, head, rows in (('SST-2', ['sentence', 'label'], [['a gem', 1], ['dull', 0], ['fine', 1]]),
                               ('RTE', ['index', 'sentence1', 'sentence2', 'label'],
                                [[0, 'a', 'b', 'entailment'], [1, 'c', 'd', 'not_entailment']])):
        for name in ('train.tsv', 'dev.tsv'):
            write(glue, folder, name, [head, *rows])
    base = tmp_path / "tiny.py"
    base.write_text(f'dataset = "{data}"\nn_layer, n_head, n_embd, n_inner = 2, 2, 32, 64\nblock_size = 64\n'
                    'batch_size = 8\ngradient_accumulation_steps = 1\nmax_iters = 6\nlearning_rate = 1e-2\n'
                    'warmup_iters = 2\neval_interval = 2\neval_iters = 2\nlog_interval = 2\nsave_interval = 2\n'
                    'checkpoint_interval = 3\ncompile = False\ndtype = "float32"\n')
    args = ["studies/study_glue.py", f"--base={base}", "--arms=original,hybrid,untrained", "--seeds=2,3",
            "--tasks=sst2,rte", "--glue_seeds=1,2", "--glue_args=--epochs=1 --batch_size=2 --max_seq_len=64",
            f"--glue_dir={glue}",
            "--benchmark_seed=2", f"--out_dir={tmp_path}/runs", f"--records={tmp_path}/rec",
            f"--summary={tmp_path}/s.json", f"--figures={tmp_path}/fig"]
    run = lambda *extra: run_script(*args, *extra, timeout=900)
    p = run()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "0 of 14 jobs recorded" in p.stdout and "every job of the plan" in p.stdout
    rec = tmp_path / "rec"
    head, ev = read_record(str(rec / "hybrid_s3.jsonl"))
    assert head["config"]["attention_type"] == "hybrid" and head["config"]["sub_ln"] and ev[-1]["step"] == 6
    assert [r["step"] for r in read_record(str(rec / "untrained_s2.jsonl"))[1]] == [0]
    g = json.loads((rec / "original_s2.glue.json").read_text())
    assert set(g["runs"]) == {"sst2", "rte"} and set(g["runs"]["rte"]) == {"1", "2"}
    assert g["request"]["epochs"] == "1" and "init_from" not in g["protocol"]  # no path of this machine
    b = json.loads((rec / "original_s2.benchmark.json").read_text())
    assert [r["step"] for r in b["records"]] == [3, 6]  # the snapshots, then the final model
    assert not (rec / "original_s3.benchmark.json").exists() and not (rec / "untrained_s2.benchmark.json").exists()
    s = json.loads((tmp_path / "s.json").read_text())
    assert {c["arm"] for c in s["comparisons"] if c["endpoint"] == "glue4"} == {"hybrid", "untrained"}
    assert (tmp_path / "fig.png").stat().st_size > 1000

    p = run()  # again: nothing runs, the same summary
    assert p.returncode == 0 and "14 of 14 jobs recorded" in p.stdout and "started" not in p.stdout
    assert json.loads((tmp_path / "s.json").read_text()) == s
    p = run("--glue_args=--epochs=2 --batch_size=2 --max_seq_len=64")
    assert p.returncode == 1 and "was made with other settings" in p.stderr and "Traceback" not in p.stderr

    shutil.rmtree(data)  # a fresh clone: the records alone
    shutil.rmtree(tmp_path / "runs")
    p = run("--train=False", "--glue_dir=", f"--summary={tmp_path}/again.json", "--figures=")
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "again.json").read_text()) == s


def test_equivalence_and_the_2x_verdict():
    """GLUE-4 equivalence only when the 90% interval of the paired differences lies inside +-MARGIN; HybridBERT's 2x
    holds when the ratio's 95% interval is above 1 and reaches 2, is rejected when it lies below 2."""
    seeds = ['2', '3', '4', '5', '6']
    evals = lambda x: [{'step': 100, 'loss': 5.0, 'accuracy': x}]
    for hyb, verdict in (([0.4, 0.42, 0.38, 0.41, 0.39], 'holds'), ([0.21, 0.22, 0.19, 0.2, 0.2], 'rejected'),
                         ([0.1, 0.5, 0.2, 0.45, 0.15], 'undetermined')):
        pre = {'original': {sd: evals(0.2) for sd in seeds}, 'hybrid': {sd: evals(x) for sd, x in zip(seeds, hyb)}}
        glue = {'original': {sd: glue4_record({'1': 60.0 + i}) for i, sd in enumerate(seeds)},
                'hybrid': {sd: glue4_record({'1': 60.0 + i + d}) for i, (sd, d) in
                           enumerate(zip(seeds, [0.1, -0.1, 0.2, 0.0, -0.1]))}}
        s = study_glue.summarize(pre, glue, {}, {}, 100, TASKS, '1')
        c = next(c for c in s['comparisons'] if c['endpoint'] == 'mlm_accuracy_at_cap')
        assert c['claim_2x'] == verdict, (hyb, c['ci95'])
        g = next(c for c in s['comparisons'] if c['endpoint'] == 'glue4')
        assert g['tost']['shown'] and -1 < g['tost']['ci90'][0] < g['tost']['ci90'][1] < 1
    glue['hybrid'] = {sd: glue4_record({'1': 60.0 + i + d}) for i, (sd, d) in enumerate(zip(seeds, [2, -2, 1, 0, -1]))}
    s = study_glue.summarize(pre, glue, {}, {}, 100, TASKS, '1')
    g = next(c for c in s['comparisons'] if c['endpoint'] == 'glue4')
    assert not g['tost']['shown']  # a wide interval around 0 shows nothing


def test_a_cut_pre_training_record_is_one_line_naming_study_glue(tmp_path):
    from test_train import one_line_error

    rec = tmp_path / "rec"
    shutil.copytree(os.path.join(ROOT, "assets", "study_glue"), rec)
    path = rec / "original_s2.jsonl"
    path.write_bytes(path.read_bytes()[:-20])
    p = run_script("studies/study_glue.py", "--train=False", f"--records={rec}", "--summary=", "--figures=",
                   timeout=300)
    one_line_error(p, f"study_glue: {path} is not a whole study record (ValueError: its last line is cut)")


def test_the_committed_summary_is_what_the_committed_records_give(tmp_path):
    """A fresh clone rebuilds assets/study_glue.json from the records alone (the unfinished jobs listed in it): a
    record committed without its summary brought up to date, or a summary edited by hand, fails here."""
    p = run_script("studies/study_glue.py", "--train=False", f"--summary={tmp_path}/s.json", "--figures=",
                   timeout=300)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(ROOT, "assets", "study_glue.json")) as f:
        assert same(json.loads((tmp_path / "s.json").read_text()), json.load(f))



def test_the_readme_table_is_the_committed_summary():
    """The README's Table 3 at laptop scale states the committed summary's numbers: a summary rebuilt from new
    records without the README brought up to date (or a number typed by hand) fails here."""
    with open(os.path.join(ROOT, "assets", "study_glue.json")) as f:
        s = json.load(f)
    assert not s['missing'], "the summary is partial: the README states no result yet"
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index('| arm | paper\'s GLUE, base / small |'):readme.index('*Table 3 at laptop scale.')]
    rows = {r.split('|')[1].strip(): r for r in table.splitlines()[2:] if r.startswith('|')}
    names = {'original': 'original', 'symmetric': 'symmetric', 'pairwise': 'pairwise', 'hybrid': 'hybrid (sub-LN)',
             'untrained': 'original, untrained'}
    cmp = {(c['endpoint'], c['arm']): c for c in s['comparisons']}
    assert set(rows) == set(names.values())
    for arm, name in names.items():
        row, p = rows[name], s['per_arm'][arm]
        g4 = list(p['glue4'].values())
        if arm in study_glue.PAPER_TABLE3:  # the paper's GLUE (base / small), as study_glue.py prints it
            assert "| {:.2f} / {:.2f} |".format(*study_glue.PAPER_TABLE3[arm]) in row, (arm, row)
        assert f"{np.mean(g4):.2f} (sd {np.std(g4, ddof=1):.2f})" in row, (arm, row)
        if p['mlm_accuracy_at_cap']:
            assert f"{np.mean(list(p['mlm_accuracy_at_cap'].values())):.4f}" in row, (arm, row)
        if c := cmp.get(('glue4', arm)):  # the original is the reference: no row of its own
            assert f"{c['mean']:+.2f} [{c['ci95'][0]:+.2f}, {c['ci95'][1]:+.2f}]" in row, (arm, row)
        if c := cmp.get(('mlm_accuracy_at_cap', arm)):
            assert f"{c['mean']:.3f}x [{c['ci95'][0]:.3f}x, {c['ci95'][1]:.3f}x]" in row, (arm, row)
    hybrid = cmp[('mlm_accuracy_at_equal_time', 'hybrid')]  # HybridBERT's 2x, as the README states it
    assert f"{hybrid['mean']:.3f}x the\noriginal's accuracy [{hybrid['ci95'][0]:.3f}x, {hybrid['ci95'][1]:.3f}x]" \
        in readme.replace('\n  ', '\n'), hybrid

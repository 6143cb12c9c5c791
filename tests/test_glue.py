import json
import math
import os
import random
import shutil
import sys
import types

import numpy as np
import pytest
import torch

from conftest import run_script
import finetune_glue as fg
from lib.tokenizer import get_tokenizer
from model import Bert, BertConfig

TINY = dict(n_layer=2, n_head=2, n_embd=64, n_inner=256, block_size=128)


# ----------------------------------------------------------------------------- metrics and score

def test_metrics_by_hand():
    a = np.array
    assert fg.accuracy(a([1, 0, 1, 1]), a([1, 0, 0, 1])) == 0.75
    assert fg.f1(a([1, 1, 0, 0, 1]), a([1, 0, 0, 1, 1])) == pytest.approx(2 / 3)  # tp 2, fp 1, fn 1
    assert fg.f1(a([0, 0]), a([1, 0])) == 0.0  # no true positive
    assert fg.mcc(a([1, 1, 1, 0, 0, 0]), a([1, 1, 0, 0, 0, 1])) == pytest.approx(1 / 3)  # (2*2-1*1)/sqrt(3^4)
    assert fg.mcc(a([0, 1, 1, 0]), a([1, 0, 0, 1])) == pytest.approx(-1.0)
    for pred, gold in ((a([1, 1, 1, 1]), a([1, 0, 1, 0])), (a([1, 0]), a([1, 1])), (a([0, 0]), a([0, 0]))):
        assert fg.mcc(pred, gold) == 0.0  # degenerate confusion matrix: 0, not NaN
    assert fg.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))  # cov 5, var 2 and 114/9
    assert fg.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_task_numbers():
    pred, gold = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])
    m = fg.task_metrics('mrpc', pred, gold)  # accuracy 3/5, F1 2/3
    assert m['score'] == pytest.approx(100 * (0.6 + 2 / 3) / 2) and set(m) == {'accuracy', 'f1', 'score'}
    assert set(fg.task_metrics('cola', pred, gold)) == {'mcc', 'score'}
    assert fg.task_metrics('rte', pred, gold)['score'] == pytest.approx(60.0)
    m = fg.task_metrics('stsb', np.array([1.0, 2, 2, 10]), np.array([1.0, 3, 2, 4]))
    assert m['spearman'] == pytest.approx(300 / math.sqrt(10)) and m['pearson'] < m['spearman']
    assert m['score'] == pytest.approx((m['pearson'] + m['spearman']) / 2)
    m = fg.task_metrics('stsb', np.full(4, 2.5), np.array([1.0, 3, 2, 4]))  # a collapsed model: no correlation, 0
    assert m == {'pearson': 0.0, 'spearman': 0.0, 'score': 0.0}


TABLE3 = {  # mrpc cola mnli-m mnli-mm qqp rte stsb qnli sst2, and the paper's GLUE score
    'base original': ([85.30, 44.35, 81.66, 82.07, 88.86, 59.42, 87.30, 88.76, 90.92], 78.74),
    'base pairwise': ([87.83, 46.91, 81.60, 82.02, 88.89, 60.58, 86.88, 88.78, 90.78], 79.36),
    'small original': ([81.04, 21.39, 77.16, 77.76, 86.08, 54.87, 82.20, 85.45, 88.49], 72.72),
}


@pytest.mark.parametrize('row', TABLE3)
def test_glue_score_reproduces_table3(row):
    numbers, score = TABLE3[row]
    numbers = dict(zip(fg.NUMBERS, numbers))
    assert round(fg.glue_score(numbers), 2) == score
    assert fg.glue_score({**numbers, 'wnli': 0.0}) == fg.glue_score(numbers)  # wnli never counts


def test_summary_and_table():
    base = dict(zip(fg.NUMBERS, TABLE3['base original'][0]))
    runs = {}
    for seed, shift in (('1', -0.5), ('2', 0.5)):  # the same numbers -0.5 and +0.5: GLUE 78.24 and 79.24
        for task in fg.TASKS:
            if task != 'wnli':
                dev = {n: {'score': base[n] + shift} for n in fg.TASKS[task].dev}
                runs.setdefault(task, {})[seed] = {'dev': dev}
    s = fg.summarize(runs)
    assert s['glue']['complete'] and s['glue']['mean'] == pytest.approx(fg.glue_score(base))
    assert s['glue']['std'] == pytest.approx(math.sqrt(0.5))  # sample std of two values 1 apart
    assert s['numbers']['cola']['mean'] == pytest.approx(44.35) and s['numbers']['cola']['per_seed']['2'] == 44.85
    lines = fg.table('base original', s).splitlines()
    assert lines[0] == '| model | GLUE | mrpc | cola | mnli m/mm | qqp | rte | stsb | qnli | sst2 |'
    assert lines[2] == ('| base original | 78.74 (0.71) | 85.30 | 44.35 | 81.66/82.07 | 88.86 | 59.42 | 87.30 '
                        '| 88.76 | 90.92 |')
    part = fg.summarize({'rte': runs['rte']})  # a subset is flagged: not the GLUE score
    assert not part['glue']['complete'] and '*' in fg.table('x', part)

# ----------------------------------------------------------------------------- rank correlation (STS-B), against scipy
def test_ranks_and_spearman_by_hand():
    assert fg.ranks(np.array([10, 20, 10, 30, 20])).tolist() == [1.5, 3.5, 1.5, 5.0, 3.5]
    assert fg.ranks((3, 1, 2)).tolist() == [3.0, 1.0, 2.0]  # a tuple (as zip gives) too
    assert fg.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fg.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert fg.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))  # ranks 1 2.5 2.5 4
    assert fg.spearman([1, 5, 9], [0.1, 0.2, 30]) == pytest.approx(1.0)  # monotone, not linear


def test_spearman_is_nan_where_undefined():
    """A constant side has no rank correlation (0 / 0): nan, as scipy.stats.spearmanr gives; likewise one pair."""
    for x, y in (([1, 1, 1], [1, 2, 3]), ([1, 2, 3], [5.0, 5.0, 5.0]), ([2, 2], [2, 2]), ([1], [1])):
        assert math.isnan(fg.spearman(x, y))


def test_ranks_and_spearman_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in (2, 3, 7, 30):
        x, y = rng.integers(0, 5, n), rng.normal(size=n)  # x with ties
        assert fg.ranks(x).tolist() == scipy_stats.rankdata(x).tolist()
        if len(set(x)) > 1:
            assert fg.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
    with pytest.warns(scipy_stats.ConstantInputWarning):
        assert math.isnan(scipy_stats.spearmanr([1, 1, 1], [1, 2, 3]).statistic)  # what spearman follows


# ----------------------------------------------------------------------------- loaders


def write(root, folder, name, lines, bom=False):
    os.makedirs(root / folder, exist_ok=True)
    with open(root / folder / name, 'w', encoding='utf-8-sig' if bom else 'utf-8', newline='') as f:
        f.write(''.join('\t'.join(map(str, line)) + '\n' for line in lines))


MNLI_TRAIN = ['index', 'promptID', 'pairID', 'genre', 'sentence1_binary_parse', 'sentence2_binary_parse',
              'sentence1_parse', 'sentence2_parse', 'sentence1', 'sentence2', 'label1', 'gold_label']
MNLI_DEV = MNLI_TRAIN[:-1] + ['label2', 'label3', 'label4', 'label5', 'gold_label']


def mnli_row(a, b, y, dev):
    return [0, 1, '1e', 'fiction', '( ( x ) )', '( y )', '(ROOT x)', '(ROOT y)', a, b, y] + [y] * (5 if dev else 1)


@pytest.fixture
def glue_dir(tmp_path):
    """Two-row files of every task in the real GLUE layouts."""
    write(tmp_path, 'CoLA', 'train.tsv', [['gj04', 1, '', "Our friends won't buy this analysis."],
                                          ['gj04', 0, '*', 'They drank the pub.']])  # no header line
    write(tmp_path, 'CoLA', 'dev.tsv', [['cj99', 1, '', 'The sailors rode the breeze.']])
    write(tmp_path, 'SST-2', 'train.tsv', [['text', 'label'], ['hide new secretions ', 0], ['a gem ', 1]])
    write(tmp_path, 'SST-2', 'dev.tsv', [['sentence', 'label'], ["it 's a charming journey . ", 1]])
    mrpc = [['Quality', '#1 ID', '#2 ID', '#1 String', '#2 String'],
            [1, 702876, 702977, 'He called him "the witness", of course.', 'Referring to him as "the witness".'],
            [0, 2108705, 2108831, 'Yucaipa owned "Dominick\'s.', 'Yucaipa sold it.']]
    write(tmp_path, 'MRPC', 'train.tsv', mrpc, bom=True)
    write(tmp_path, 'MRPC', 'dev.tsv', mrpc[:2], bom=True)
    stsb = [['index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2', 'sentence1', 'sentence2',
             'score'],
            [0, 'main-news', 'headlines', 2013, '0042', 'none', 'none', '"Obama: "no deal', 'He: "No.', '2.400'],
            [1, 'main-captions', 'MSRvid', '2012test', '0001', 'none', 'none', 'A plane.', 'An air plane.', '5.0']]
    write(tmp_path, 'STS-B', 'train.tsv', stsb)
    write(tmp_path, 'STS-B', 'dev.tsv', stsb)
    qqp = [['id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate'], [7, 1, 2, 'How?', 'Why?', 0],
           [8, 3, 4, 'What is AI?', 'What is A.I.?', 1]]
    write(tmp_path, 'QQP', 'train.tsv', qqp)
    write(tmp_path, 'QQP', 'dev.tsv', qqp)
    write(tmp_path, 'MNLI', 'train.tsv', [MNLI_TRAIN, mnli_row('p1', 'h1', 'neutral', False),
                                          mnli_row('p2', 'h2', 'contradiction', False)])
    write(tmp_path, 'MNLI', 'dev_matched.tsv', [MNLI_DEV, mnli_row('pm', 'hm', 'entailment', True)])
    write(tmp_path, 'MNLI', 'dev_mismatched.tsv', [MNLI_DEV, mnli_row('pmm', 'hmm', 'contradiction', True)])
    nli = ['not_entailment', 'entailment']
    for folder, head, labels in (('QNLI', ['index', 'question', 'sentence', 'label'], nli),
                                 ('RTE', ['index', 'sentence1', 'sentence2', 'label'], nli),
                                 ('WNLI', ['index', 'sentence1', 'sentence2', 'label'], [1, 0])):
        for name in ('train.tsv', 'dev.tsv'):
            write(tmp_path, folder, name, [head, [0, 'a0', 'b0', labels[0]], [1, 'a1', 'b1', labels[1]]])
    return tmp_path


def test_loaders_on_real_layouts(glue_dir):
    d = str(glue_dir)
    cola = fg.load_task('cola', d)
    assert cola['train'] == [("Our friends won't buy this analysis.", None, 1), ('They drank the pub.', None, 0)]
    assert cola['cola'] == [('The sailors rode the breeze.', None, 1)]
    assert fg.load_task('sst2', d)['train'] == [('hide new secretions ', None, 0), ('a gem ', None, 1)]
    assert fg.load_task('sst2', d)['sst2'] == [("it 's a charming journey . ", None, 1)]
    mrpc = fg.load_task('mrpc', d)  # the BOM is not part of the header, quotes are text
    assert mrpc['train'][1] == ('Yucaipa owned "Dominick\'s.', 'Yucaipa sold it.', 0) and len(mrpc['mrpc']) == 1
    stsb = fg.load_task('stsb', d)['train']  # quoting off: the unbalanced quotes do not swallow the next row
    assert stsb == [('"Obama: "no deal', 'He: "No.', 2.4), ('A plane.', 'An air plane.', 5.0)]
    assert fg.load_task('qqp', d)['train'][1] == ('What is AI?', 'What is A.I.?', 1)
    mnli = fg.load_task('mnli', d)
    assert set(mnli) == {'train', 'mnli-m', 'mnli-mm'}
    assert mnli['train'] == [('p1', 'h1', 1), ('p2', 'h2', 2)]
    assert mnli['mnli-m'] == [('pm', 'hm', 0)] and mnli['mnli-mm'] == [('pmm', 'hmm', 2)]
    for task in ('qnli', 'rte'):
        assert fg.load_task(task, d)['train'] == [('a0', 'b0', 1), ('a1', 'b1', 0)]
    assert fg.load_task('wnli', d)['wnli'] == [('a0', 'b0', 1), ('a1', 'b1', 0)]


def test_the_loaded_splits_are_named_by_their_files(glue_dir, capsys):
    fg.task_data('rte', str(glue_dir), 16)
    fg.task_data('mnli', str(glue_dir), 16)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('rte: train 2 rows, dev 2 rows; ')
    assert lines[1].startswith('mnli: train 2 rows, dev_matched 1 rows, dev_mismatched 1 rows; ')


def test_malformed_files_name_file_and_line(glue_dir):
    path = glue_dir / 'RTE' / 'train.tsv'
    with open(path, 'a') as f:
        f.write('2\tonly two fields\n')
    with pytest.raises(SystemExit, match=r'RTE/train.tsv, line 4: 2 tab-separated fields, expected 4'):
        fg.load_task('rte', str(glue_dir))
    write(glue_dir, 'QNLI', 'dev.tsv', [['index', 'question', 'sentence', 'label'], [0, 'q', 's', 'maybe']])
    with pytest.raises(SystemExit, match=r"QNLI/dev.tsv, line 2: bad label 'maybe'"):
        fg.load_task('qnli', str(glue_dir))
    write(glue_dir, 'STS-B', 'dev.tsv', [['index', 'sentence1'], [0, 'a']])
    with pytest.raises(SystemExit, match=r'STS-B/dev.tsv: not a stsb file'):
        fg.load_task('stsb', str(glue_dir))
    (glue_dir / 'SST-2' / 'dev.tsv').write_text('')
    with pytest.raises(SystemExit, match=r'SST-2/dev.tsv: not a sst2 file'):
        fg.load_task('sst2', str(glue_dir))
    with pytest.raises(SystemExit, match=r'cannot read .*CoLA/train.tsv'):
        fg.load_task('cola', str(glue_dir / 'nowhere'))


def test_hub_path(monkeypatch):
    split = lambda a, b, y: {'premise': a, 'hypothesis': b, 'label': y}
    hub = {'train': split(['p'], ['h'], [2]), 'validation_matched': split(['m'], ['hm'], [0]),
           'validation_mismatched': split(['mm'], ['hmm'], [1])}
    monkeypatch.setitem(sys.modules, 'datasets', types.SimpleNamespace(load_dataset=lambda name, task: hub))
    assert fg.load_task('mnli', '') == {'train': [('p', 'h', 2)], 'mnli-m': [('m', 'hm', 0)],
                                        'mnli-mm': [('mm', 'hmm', 1)]}

    def offline(name, task):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub\n(offline)")
    monkeypatch.setitem(sys.modules, 'datasets', types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(SystemExit, match="cannot load nyu-mll/glue 'rte'") as e:
        fg.load_task('rte', '')
    assert '\n' not in str(e.value)


def test_encoding_layout_and_truncation():
    enc, sp = get_tokenizer()
    words = lambda n: ' '.join(['cat'] * n)  # ' cat' is one token
    assert len(enc.encode_ordinary(words(6))) == 6
    d = fg.encode([(words(6), words(6), 1), (words(2), words(1), 0), (words(12), words(3), 1)], max_len=10)
    a, b = enc.encode_ordinary(words(4)), enc.encode_ordinary(words(3))
    assert d['tok'][0].tolist() == [sp['cls'], *a, sp['sep'], *b, sp['sep']]  # longest first: 6+6 -> 4+3
    assert d['tok'][2].tolist() == [sp['cls'], *a, sp['sep'], *b, sp['sep']]  # 12+3 -> 4+3
    assert d['first'].tolist() == [6, 4, 6] and d['len'].tolist() == [10, 6, 10] and d['y'].tolist() == [1, 0, 1]
    single = fg.encode([(words(20), None, 3.5)], max_len=8)
    assert single['tok'][0].tolist() == [sp['cls'], *enc.encode_ordinary(words(6)), sp['sep']]
    assert single['y'].dtype == np.float32
    ids, mask, types = fg.batch(d, np.array([1, 0]))  # dynamic padding to the longest of the batch
    assert ids.shape == (2, 10) and ids[0, 6:].eq(sp['pad']).all()
    assert mask.tolist()[0] == [True] * 6 + [False] * 4 and mask[1].all()
    assert types.tolist() == [[0] * 4 + [1, 1] + [0] * 4, [0] * 6 + [1] * 4]
    assert fg.batch(d, np.array([0, 2]))[1] is None  # nothing padded: no mask, the fastest attention


# ----------------------------------------------------------------------------- checkpoints and end to end

def save_ckpt(path, iter_num=0, seed=0, **extra):
    torch.manual_seed(seed)
    torch.save({'model': Bert(BertConfig(**TINY)).state_dict(), 'model_args': TINY, 'iter_num': iter_num,
                **extra}, path)
    return str(path)


def test_checkpoint_errors_are_one_line(tmp_path):
    cfg, state, it, _ = fg.load_pretrained(save_ckpt(tmp_path / 'ok.pt', iter_num=7, optimizer={}, config={'a': 1}))
    assert it == 7 and cfg.n_layer == 2 and 'encoder.wte.weight' in state
    (tmp_path / 'junk.pt').write_bytes(b'not a checkpoint')
    torch.save({'model': {}}, tmp_path / 'other.pt')
    torch.save({'model': state, 'model_args': {**TINY, 'n_layer': 3}, 'iter_num': 0}, tmp_path / 'wrong.pt')
    nan = {**state, 'encoder.ln.weight': state['encoder.ln.weight'] * float('nan')}
    torch.save({'model': nan, 'model_args': TINY, 'iter_num': 0}, tmp_path / 'nan.pt')
    torch.save({'model': fg.BertClassifier(BertConfig(**TINY), 2).state_dict(), 'model_args': TINY, 'iter_num': 0,
                'num_labels': 2, 'task': 'rte'}, tmp_path / 'rte_s1.pt')  # --save_models's: fine-tuned already
    for name, msg in (('missing.pt', 'no checkpoint'), ('junk.pt', 'not a readable checkpoint'),
                      ('other.pt', 'not a train.py checkpoint'), ('wrong.pt', 'do not fit its model_args'),
                      ('nan.pt', 'non-finite'), ('rte_s1.pt', 'is a classifier fine-tuned on rte')):
        with pytest.raises(SystemExit, match=msg) as e:
            fg.load_pretrained(str(tmp_path / name))
        assert '\n' not in str(e.value)


def synthetic(root, n_train, n_dev):
    """A learnable pair task in the RTE and STS-B layouts: the colour word of sentence2 decides (entailment
    / high similarity for red); sentence1 holds a colour too, drawn independently, as a distractor."""
    words = 'the a man dog cat house tree car road city day night water fire book song'.split()

    def rows(n, seed):
        r = random.Random(seed)
        for i in range(n):
            s1, s2 = r.sample(words, 5), r.sample(words, 3)
            s1.insert(r.randrange(6), r.choice(['red', 'blue']))
            s2.insert(r.randrange(4), r.choice(['red', 'blue']))
            yield i, ' '.join(s1), ' '.join(s2), 'red' in s2, r.random()
    for name, n, seed in (('train.tsv', n_train, 0), ('dev.tsv', n_dev, 1)):
        write(root, 'RTE', name, [['index', 'sentence1', 'sentence2', 'label']] +
              [[i, a, b, 'entailment' if y else 'not_entailment'] for i, a, b, y, _ in rows(n, seed)])
        write(root, 'STS-B', name, [['index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2',
                                     'sentence1', 'sentence2', 'score']] +
              [[i, 'g', 'f', 'y', i, 'none', 'none', a, b, f"{4 * y + u:.3f}"] for i, a, b, y, u in rows(n, seed)])


def run(*args):
    return run_script('finetune_glue.py', '--device=cpu', '--max_seq_len=32', *args, timeout=300)


def test_end_to_end_learns_and_resumes(tmp_path):
    synthetic(tmp_path / 'glue', 384, 200)
    ckpt, out = save_ckpt(tmp_path / 'ckpt.pt'), tmp_path / 'out'
    args = [f'--init_from={ckpt}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte,stsb', '--epochs=5',
            '--learning_rate=3e-3', f'--out_dir={out}', '--dtype=float32']
    p = run(*args, '--seeds=1')  # as if a run of seeds 1,2 had been interrupted after seed 1
    assert p.returncode == 0, p.stderr[-2000:]
    first = json.loads((out / 'glue_results.json').read_text())
    p = run(*args, '--seeds=1,2')  # resume: seed 1 is skipped for both tasks, seed 2 is trained
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count('done already, skipped') == 2 and 'rte seed 2: rte' in p.stdout
    res = json.loads((out / 'glue_results.json').read_text())
    assert all(res['runs'][t]['1'] == first['runs'][t]['1'] for t in ('rte', 'stsb'))
    for seed in ('1', '2'):
        assert res['runs']['rte'][seed]['dev']['rte']['accuracy'] > 90  # chance: ~50
        assert res['runs']['stsb'][seed]['dev']['stsb']['score'] > 70  # chance: ~0
    assert res['numbers']['rte']['mean'] == pytest.approx(np.mean([res['runs']['rte'][s]['dev']['rte']['score']
                                                                   for s in ('1', '2')]))
    assert not res['glue']['complete'] and set(res['glue']['per_seed']) == {'1', '2'}
    assert '| original 2L/64H step 0 |' in p.stdout
    p = run(*args, '--seeds=1', '--learning_rate=1e-3')  # other settings must not mix into the same results
    assert p.returncode == 1 and 'learning_rate differ' in p.stderr
    assert f"results: {out / 'glue_results.json'}" in run(*args, '--seeds=1').stdout


def test_fine_tuning_in_bf16_learns(tmp_path):
    synthetic(tmp_path / 'glue', 384, 200)
    ckpt, out = save_ckpt(tmp_path / 'ckpt.pt'), tmp_path / 'out'
    p = run(f'--init_from={ckpt}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte', '--epochs=5', '--seeds=1',
            '--learning_rate=3e-3', f'--out_dir={out}', '--dtype=bfloat16')
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'cpu, bfloat16 (as asked)' in p.stdout
    res = json.loads((out / 'glue_results.json').read_text())
    assert res['runs']['rte']['1']['dev']['rte']['accuracy'] > 90  # chance: ~50


def test_nothing_wrong_is_recorded(tmp_path):
    synthetic(tmp_path / 'glue', 64, 32)
    ckpt, out = save_ckpt(tmp_path / 'ckpt.pt'), tmp_path / 'out'
    args = [f'--init_from={ckpt}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte', '--seeds=1', '--epochs=1',
            f'--out_dir={out}']
    p = run(*args, '--learning_rate=1e30')  # a diverged fine-tuning: an error, not a score of 50
    assert p.returncode == 1 and 'the training loss went non-finite; nothing was recorded' in p.stderr
    assert 'Traceback' not in p.stderr and not out.exists()  # nothing recorded, no folder left
    out.mkdir()
    (out / 'glue_results.json').write_text('{"protocol": {"epochs": 1}, "runs": {"rte": {"1": ')  # cut short
    p = run(*args)
    assert p.returncode == 1 and 'cannot read GLUE results' in p.stderr and 'left as it is' in p.stderr
    assert (out / 'glue_results.json').read_text().endswith('{"1": ')  # kept, never overwritten
    p = run(*args, f'--out_dir={tmp_path / "kept"}', '--save_models=True')  # classifiers are kept on request
    saved = torch.load(tmp_path / 'kept' / 'rte_s1.pt', weights_only=True)
    assert p.returncode == 0 and saved['num_labels'] == 2 and list(saved['labels']) == ['entailment', 'not_entailment']
    assert set(saved['model']) >= {'pooler.weight', 'classifier.weight', 'encoder.wte.weight'}
    assert saved['protocol']['learning_rate'] == fg.learning_rate and 'init_from' not in saved['protocol']
    (tmp_path / 'other').mkdir()  # a kept classifier of other settings is not this result's: refused, left as it is
    shutil.copy(tmp_path / 'kept' / 'rte_s1.pt', tmp_path / 'other' / 'rte_s1.pt')
    p = run(*args, f'--out_dir={tmp_path / "other"}', '--save_models=True', '--learning_rate=3e-4')
    assert p.returncode == 1 and 'fine-tuned with other settings (learning_rate 1e-05, not 0.0003)' in p.stderr
    assert 'Traceback' not in p.stderr and not (tmp_path / 'other' / 'glue_results.json').exists()
    sts = tmp_path / 'glue' / 'STS-B' / 'dev.tsv'
    lines = sts.read_text().split('\n')
    lines[2] = lines[2].rsplit('\t', 1)[0] + '\tnan'  # a NaN label: refused, naming the line
    sts.write_text('\n'.join(lines))
    with pytest.raises(SystemExit, match=r"dev.tsv, line 3: bad label 'nan' \(expected a finite number\)"):
        fg.read_tsv(str(sts), 'stsb')


def test_checkpoint_benchmark(tmp_path):
    synthetic(tmp_path / 'glue', 128, 64)
    train_out = tmp_path / 'train'
    os.makedirs(train_out / 'snapshots')
    for step in (100, 200, 300):  # the first renamed: its name is not its step
        save_ckpt(train_out / 'snapshots' / f'ckpt_{step:07d}.pt', iter_num=step + 50 * (step == 100), seed=step)
    save_ckpt(train_out / 'ckpt.pt', iter_num=400, seed=400, optimizer={})
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'benchmark.json').write_text('{"notes": 1}')  # not a benchmark's: never replaced
    p = run(f'--benchmark={train_out}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte',
            f'--out_dir={tmp_path / "mine"}')
    assert p.returncode == 1 and 'is there and is no benchmark of finetune_glue.py' in p.stderr, p.stderr[-2000:]
    assert not list((tmp_path / 'mine').glob('step_*'))  # refused before any compute
    assert (tmp_path / 'mine' / 'benchmark.json').read_text() == '{"notes": 1}'
    out = tmp_path / 'bench'
    p = run(f'--benchmark={train_out}', '--snapshot_every=2', f'--data_dir={tmp_path / "glue"}', '--tasks=rte',
            '--seeds=1', '--epochs=2', '--learning_rate=1e-3', f'--out_dir={out}')
    assert p.returncode == 1 and 'Traceback' not in p.stderr, p.stderr[-2000:]  # the others scored, that one named
    assert '1 checkpoint(s) refused and skipped' in p.stderr and 'its name says step 100, it holds step 150' in p.stderr
    b = json.loads((out / 'benchmark.json').read_text())
    assert [r['step'] for r in b['records']] == [300, 400]  # every 2nd counted back from 300, then ckpt.pt
    assert b['final_score'] == b['records'][-1]['score']
    assert b['target_95'] == pytest.approx(0.95 * b['final_score'])
    assert b['step_95'] == next(r['step'] for r in b['records'] if r['score'] >= b['target_95'])
    assert (out / 'step_0000300' / 'glue_results.json').exists()


def test_fine_tuning_dropout_is_the_protocols(tmp_path):
    """A checkpoint pre-trained with dropout 0 fine-tunes with the paper's 0.1 (hidden states, attention, classifier)
    unless --dropout=-1 asks for its own; the record and the kept classifier say which."""
    synthetic(tmp_path / 'glue', 32, 16)
    ckpt = str(tmp_path / 'd0.pt')
    torch.save({'model': Bert(BertConfig(**TINY)).state_dict(), 'model_args': {**TINY, 'dropout': 0.0},
                'iter_num': 0}, ckpt)
    cfg = fg.load_pretrained(ckpt)[0]
    for dropout, want in ((0.1, 0.1), (-1, 0.0)):
        out = tmp_path / f'out{dropout}'
        p = run(f'--init_from={ckpt}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte', '--seeds=1', '--epochs=1',
                f'--out_dir={out}', '--save_models=True', *([] if dropout == 0.1 else [f'--dropout={dropout}']))
        assert p.returncode == 0, p.stderr[-2000:]
        protocol = json.loads((out / 'glue_results.json').read_text())['protocol']
        assert (protocol['dropout'], protocol['attention_dropout']) == (want, want)
        assert torch.load(out / 'rte_s1.pt', weights_only=True)['model_args']['dropout'] == want
        model = fg.BertClassifier(fg.tuned(cfg, dropout), 2).train()  # in train mode, dropout changes each pass
        x = torch.randint(0, 100, (2, 12))
        assert (not torch.equal(model(x)[0], model(x)[0])) == (want > 0)
    p = run(f'--init_from={ckpt}', f'--data_dir={tmp_path / "glue"}', '--tasks=rte', '--seeds=1', '--epochs=1',
            f'--out_dir={tmp_path / "out0.1"}', '--dropout=-1')  # results of another dropout never mix
    assert p.returncode == 1 and 'dropout, attention_dropout differ' in p.stderr

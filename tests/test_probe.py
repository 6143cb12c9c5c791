import json
import os
import random

import numpy as np
import pytest
import torch

from conftest import run_script
import probe
from lib.tokenizer import get_tokenizer
from model import Bert, BertConfig

scipy_stats = pytest.importorskip('scipy.stats')
scipy_optimize = pytest.importorskip('scipy.optimize')
TINY = dict(n_layer=2, n_head=2, n_embd=64, n_inner=256, block_size=128)
WORDS = 'the a man dog cat house tree car road city day night water fire book song red blue is runs'.split()


def write(root, folder, name, lines):
    os.makedirs(root / folder, exist_ok=True)
    (root / folder / name).write_text(''.join('\t'.join(map(str, line)) + '\n' for line in lines))


def sentence(r):
    return ' '.join(r.choices(WORDS, k=r.randint(1, 12))) + r.choice(['', '.', ' !'])  # lengths 1-12 words: padding


@pytest.fixture
def glue(tmp_path):
    """A few dozen rows of STS-B, SST-2, MRPC and RTE in the real GLUE layouts (finetune_glue.TASKS' columns)."""
    r, root = random.Random(0), tmp_path / 'glue'
    head = ['index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2', 'sentence1', 'sentence2', 'score']
    for name, n in (('train.tsv', 10), ('dev.tsv', 30)):
        write(root, 'STS-B', name, [head] + [[i, 'g', 'f', 'y', i, 'none', 'none', sentence(r), sentence(r),
                                              f"{r.uniform(0, 5):.3f}"] for i in range(n)])
    for name, n in (('train.tsv', 40), ('dev.tsv', 20)):  # the label: does 'red' occur (learnable, not separable)
        write(root, 'SST-2', name, [['sentence', 'label']] + [[s, int('red' in s) ^ (r.random() < 0.2)]
                                                              for s in (sentence(r) for _ in range(n))])
    mrpc = ['Quality', '#1 ID', '#2 ID', '#1 String', '#2 String']
    write(root, 'MRPC', 'train.tsv', [mrpc] + [[y, 1, 2, 'a b', 'a c'] for y in (1, 0, 1)])
    write(root, 'MRPC', 'dev.tsv', [mrpc] + [[y, 1, 2, 'a b', 'a c'] for y in (1, 0, 1, 1, 0)])
    rte = ['index', 'sentence1', 'sentence2', 'label']
    write(root, 'RTE', 'train.tsv', [rte] + [[i, 'a', 'b', y] for i, y in
                                             enumerate(('entailment', 'not_entailment', 'entailment'))])
    write(root, 'RTE', 'dev.tsv', [rte] + [[i, 'a', 'b', y] for i, y in
                                           enumerate(('entailment', 'not_entailment', 'not_entailment'))])
    return str(root)


def save_ckpt(path, seed=0):
    torch.manual_seed(seed)
    torch.save({'model': Bert(BertConfig(**TINY)).state_dict(), 'model_args': TINY, 'iter_num': 0}, path)
    return str(path)


def reference_features(ckpt, texts):
    """Each text alone through the Bert's own encoder, one at a time (no padding, no batching), mean over its tokens."""
    model = Bert(BertConfig(**TINY))
    model.load_state_dict(torch.load(ckpt)['model'])
    enc, sp = get_tokenizer()
    with torch.no_grad():
        return np.stack([model.eval().encoder(torch.tensor([[sp['cls'], *enc.encode_ordinary(t.strip()), sp['sep']]]))
                         [0].mean(0).double().numpy() for t in texts])


def reference_logreg(X, y, C):
    """The same penalised log-loss, minimised by scipy in float64: (w, b)."""
    X, s = np.asarray(X, np.float64), 2.0 * np.asarray(y) - 1

    def f(v):
        m = -s * (X @ v[:-1] + v[-1])
        g = -s * C / (1 + np.exp(-m))
        return 0.5 * v[:-1] @ v[:-1] + C * np.sum(np.log1p(np.exp(m))), np.r_[v[:-1] + X.T @ g, g.sum()]
    v = scipy_optimize.minimize(f, np.zeros(X.shape[1] + 1), jac=True, method='L-BFGS-B',
                                options={'gtol': 1e-12, 'ftol': 1e-15, 'maxiter': 10000}).x
    return v[:-1], v[-1]


def test_features_and_stsb_cosine_against_references(glue, tmp_path):
    ckpt = save_ckpt(tmp_path / 'ckpt.pt')
    encoder, model = probe.encoder_of(ckpt)
    rows = probe.fg.load_task('stsb', glue)['stsb']
    texts = [r[0] for r in rows] + [r[1] for r in rows]
    ref = reference_features(ckpt, texts)
    assert np.allclose(probe.features(encoder, texts, batch_size=7), ref, atol=1e-5)  # padded batches, any order
    a, b = ref[:len(rows)], ref[len(rows):]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    rho = scipy_stats.spearmanr([r[2] for r in rows], cos).statistic
    assert probe.stsb_cosine(encoder, rows, batch_size=7) == pytest.approx(100 * rho, abs=1e-6)
    assert model['weights'] and model['step'] == 0


@pytest.mark.parametrize('C', [0.1, 1.0, 10.0])
def test_logreg_against_scipy(C):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 5))
    y = (X @ [1.0, -2, 0, 0.5, 0] + 0.3 + rng.normal(size=60) > 0).astype(int)
    w, b = probe.fit_logreg(X, y, C)
    w_ref, b_ref = reference_logreg(X, y, C)
    assert np.allclose(w, w_ref, atol=1e-4) and b == pytest.approx(b_ref, abs=1e-4)
    assert probe.fit_logreg(X, y, C)[0].tolist() == w.tolist()  # deterministic
    with pytest.raises(SystemExit, match='both classes'):
        probe.fit_logreg(X, np.ones(60), C)


def test_sst2_probe_against_reference(glue, tmp_path):
    ckpt = save_ckpt(tmp_path / 'ckpt.pt')
    sst2 = probe.fg.load_task('sst2', glue)
    Xtr, Xdev = (reference_features(ckpt, [r[0] for r in sst2[k]]) for k in ('train', 'sst2'))
    mu, sd = Xtr.mean(0), Xtr.std(0)
    w, b = reference_logreg((Xtr - mu) / sd, [r[2] for r in sst2['train']], 1.0)
    acc = 100 * np.mean((((Xdev - mu) / sd) @ w + b > 0) == np.array([r[2] for r in sst2['sst2']]))
    assert probe.sst2_logreg(probe.encoder_of(ckpt)[0], sst2['train'], sst2['sst2'], batch_size=8) == \
        pytest.approx(acc, abs=1e-9)


def test_jaccard_by_hand():
    assert probe.jaccard('A man is dancing.', 'A man is singing.') == pytest.approx(3 / 5)  # a man is / 5 words
    assert probe.jaccard('The Cat sat', 'the cat, sat!  the') == 1.0  # lower-cased sets; punctuation is no word
    assert probe.jaccard("it's a dog", 'it is a dog') == pytest.approx(3 / 5)  # it s a dog / it is a dog
    assert probe.jaccard('Dogs run.', 'Cats sleep') == 0.0


def test_majority_and_baselines(glue):
    b = probe.baselines(glue)
    assert b['mrpc_majority'] == pytest.approx({'accuracy': 60.0, 'f1': 75.0, 'score': 67.5})  # 1 always: 3 of 5
    assert b['rte_majority'] == pytest.approx({'accuracy': 100 / 3, 'score': 100 / 3})  # entailment, 1 of 3
    rows = probe.fg.load_task('stsb', glue)['stsb']
    rho = scipy_stats.spearmanr([r[2] for r in rows], [probe.jaccard(r[0], r[1]) for r in rows]).statistic
    assert b['stsb_jaccard'] == pytest.approx(100 * rho, abs=1e-9)
    assert probe.majority('rte', [('a', 'b', 1), ('a', 'b', 0)], [('a', 'b', 0)])['accuracy'] == 100.0  # tie: id 0


def test_run_writes_its_file_and_refuses_others(glue, tmp_path, capsys):
    ckpt, out = save_ckpt(tmp_path / 'ckpt.pt'), tmp_path / 'out'
    res = probe.run(ckpt, glue, str(out), batch_size=16)
    saved = json.loads((out / 'probe.json').read_text())
    assert saved == res and saved['pretrained'] == probe.encoder_of(ckpt)[1]
    assert 'STS-B cosine' in capsys.readouterr().out
    assert {k: v for k, v in probe.run(ckpt, glue, str(out)).items() if k != 'seconds'} == \
        {k: v for k, v in res.items() if k != 'seconds'}  # the same model again: rewritten, the same numbers
    other = save_ckpt(tmp_path / 'other.pt', seed=1)
    before = (out / 'probe.json').read_text()
    with pytest.raises(SystemExit, match='another model') as e:
        probe.run(other, glue, str(out))
    assert '\n' not in str(e.value) and (out / 'probe.json').read_text() == before
    (out / 'probe.json').write_text('{"runs": {}}')
    with pytest.raises(SystemExit, match='not a probe.py result'):
        probe.run(ckpt, glue, str(out))
    (tmp_path / 'junk.pt').write_bytes(b'junk')
    for bad, msg in (('missing.pt', 'no checkpoint'), ('junk.pt', 'not a readable checkpoint')):
        with pytest.raises(SystemExit, match=msg):
            probe.run(str(tmp_path / bad), glue, str(tmp_path / 'out2'))
    assert not (tmp_path / 'out2').exists()


def test_command_line(glue, tmp_path):
    ckpt = save_ckpt(tmp_path / 'ckpt.pt')
    p = run_script('probe.py', f'--init_from={ckpt}', f'--data_dir={glue}', f'--out_dir={tmp_path / "out"}',
                   '--sst2_train_rows=20', '--batch_size=8')
    assert p.returncode == 0 and 'SST-2 probe accuracy' in p.stdout, p.stderr
    assert {k: v for k, v in json.loads((tmp_path / 'out' / 'probe.json').read_text()).items()
            if k in ('C', 'sst2_train_rows', 'max_seq_len')} == {'C': 1.0, 'sst2_train_rows': 20, 'max_seq_len': 128}
    os.remove(os.path.join(glue, 'RTE', 'dev.tsv'))
    p = run_script('probe.py', f'--init_from={ckpt}', f'--data_dir={glue}', f'--out_dir={tmp_path / "o2"}')
    assert p.returncode == 1 and p.stderr.strip().startswith('probe: missing GLUE files:') and \
        len(p.stderr.strip().splitlines()) == 1

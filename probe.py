"""
What pre-training taught, without fine-tuning noise: frozen-feature probes of a train.py checkpoint's encoder, and
the trivial baselines they sit against. The features are the mean-pooled last hidden states
(over [CLS] s [SEP], padding left out) of each sentence encoded alone, float32, eval mode, one pass per split:

    python probe.py --init_from=out/ckpt.pt --data_dir=glue      # prints the numbers, writes out_dir/probe.json

Numbers (x100, on dev): stsb_cosine, the Spearman correlation of the gold score with the cosine of the two sentences'
features; sst2_logreg, the accuracy of an L2 logistic regression fit on the train split's standardised features
(sklearn's objective: 0.5 |w|^2 + C sum log-loss, C = 1, the intercept unpenalised; Newton's method in float64).
Baselines, which need no model: stsb_jaccard, the Spearman of the word-overlap Jaccard of the two lower-cased word
sets (words: \\w+ runs); mrpc_majority and rte_majority, the train split's majority class scored by
finetune_glue.task_metrics (MRPC's score is mean(F1, accuracy), as GLUE's). Readers and metrics are finetune_glue's.
"""
if __name__ == '__main__':  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import os
import re
import time

import numpy as np
import torch

import finetune_glue as fg
from configurator import check, configure
from lib.checkpoint import describe
from lib.files import locked, read_json, write_json
from model import BertClassifier

# -----------------------------------------------------------------------------
init_from = ''  # a train.py checkpoint: <out_dir>/ckpt.pt or <out_dir>/snapshots/ckpt_<step>.pt
data_dir = ''  # GLUE in the original layout (STS-B, SST-2, MRPC and RTE are read); '' = the HF Hub
out_dir = 'out-glue'  # probe.json goes here (beside finetune_glue.py's glue_results.json by default)
max_seq_len = 128  # tokens per sentence, [CLS] and [SEP] included (finetune_glue's cut)
batch_size = 256  # sentences per forward pass, sorted by length
C = 1.0  # the logistic regression's inverse L2 strength (sklearn's C)
sst2_train_rows = 0  # > 0: the SST-2 probe fits on the first N training rows (its 67,349 rows, ~0.9M tokens, are
                     # ~95% of the compute); 0 = all
device = 'cpu'  # cpu or cuda: the numbers are float32 either way
# -----------------------------------------------------------------------------
TASKS = ('stsb', 'sst2', 'mrpc', 'rte')


def encoder_of(ckpt_path, max_len=0):
    """(the frozen encoder of a train.py checkpoint, float32 in eval mode, its model_id), loaded as fine-tuning does."""
    cfg, weights, _, model = fg.load_pretrained(ckpt_path, max_len, 'probe')
    return BertClassifier.from_pretrained(cfg, weights, 2).encoder.float().eval(), model


def features(encoder, texts, max_len=128, batch_size=256, device='cpu'):
    """(n, C) float32: each text alone as [CLS] s [SEP], its last hidden states averaged over those tokens."""
    d = fg.encode([(t, None, 0) for t in texts], max_len, encoder.wte.num_embeddings)  # the model's vocabulary
    order = np.argsort(d['len'], kind='stable')  # similar lengths together: little padding
    out = np.empty((len(texts), encoder.wte.embedding_dim), np.float32)
    encoder = encoder.to(device)
    with torch.inference_mode():
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            ids, mask, types = fg.batch(d, idx, device)
            h = encoder(ids, mask, types).float()
            real = (torch.ones_like(ids, dtype=torch.bool) if mask is None else mask)[..., None].float()
            out[idx] = ((h * real).sum(1) / real.sum(1)).cpu().numpy()
    return out


def stsb_cosine(encoder, rows, **kw):
    """Spearman (x100) of the gold scores of rows (a, b, score) and the cosine of a's and b's features."""
    f = features(encoder, [r[0] for r in rows] + [r[1] for r in rows], **kw).astype(np.float64)
    a, b = f[:len(rows)], f[len(rows):]
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return fg.task_metrics('stsb', cos, np.array([r[2] for r in rows]))['spearman']


def fit_logreg(X, y, C=1.0, iters=100):
    """(w, b) minimising 0.5 |w|^2 + C sum_i log(1 + exp(-s_i (x_i w + b))), s_i = 2 y_i - 1 (sklearn's
    LogisticRegression(C=C), the intercept unpenalised): Newton's method with step halving, float64, deterministic."""
    X = np.hstack([np.asarray(X, np.float64), np.ones((len(X), 1))])
    s = 2.0 * np.asarray(y, np.float64) - 1
    if len(set(s)) < 2:  # one class: the intercept runs to infinity, there is no minimum
        raise SystemExit("probe: the logistic regression needs both classes in its training rows")
    pen = np.r_[np.ones(X.shape[1] - 1), 0.0]
    loss = lambda w: 0.5 * np.dot(pen * w, w) + C * np.logaddexp(0, -s * (X @ w)).sum()
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 0.5 * (1 - np.tanh(s * (X @ w) / 2))  # sigmoid(-s z), stable for any z
        grad = pen * w - C * X.T @ (s * p)
        step = np.linalg.solve(np.diag(pen) + C * (X.T * (p * (1 - p))) @ X, grad)
        f0, t = loss(w), 1.0
        while loss(w - t * step) > f0 + 1e-13 * abs(f0) and t > 1e-10:  # convex: halving finds a descent (a change
            t /= 2  # below the loss's rounding is taken: near the minimum the full step is right)
        w = w - t * step
        if grad @ step < 1e-10 * (1 + abs(f0)):  # the Newton decrement: that step was in the quadratic regime
            break
    return w[:-1], w[-1]


def sst2_logreg(encoder, train, dev, C=1.0, **kw):
    """Accuracy (x100) on dev of the logistic regression fit on train's standardised features (rows (s, None, y))."""
    Xtr, Xdev = (features(encoder, [r[0] for r in rows], **kw).astype(np.float64) for rows in (train, dev))
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0  # a constant feature stays 0
    w, b = fit_logreg((Xtr - mu) / sd, [r[2] for r in train], C)
    pred = (((Xdev - mu) / sd) @ w + b > 0).astype(np.int64)
    return fg.task_metrics('sst2', pred, np.array([r[2] for r in dev]))['accuracy']


def words(s):
    return set(re.findall(r'\w+', s.lower()))


def jaccard(a, b):
    a, b = words(a), words(b)
    return len(a & b) / len(a | b) if a | b else 1.0  # two sentences without words: alike


def majority(task, train, dev):
    """task_metrics (x100) on dev of always answering train's most frequent label (the smaller id on a tie)."""
    y = np.array([r[2] for r in train])
    gold = np.array([r[2] for r in dev])
    return fg.task_metrics(task, np.full(len(dev), np.bincount(y).argmax()), gold)


def baselines(data_dir):
    """The numbers that need no model: STS-B Jaccard Spearman, MRPC and RTE majority (task_metrics dicts, x100)."""
    stsb = fg.load_task('stsb', data_dir)['stsb']
    sets = {t: fg.load_task(t, data_dir) for t in ('mrpc', 'rte')}
    return {'stsb_jaccard': fg.task_metrics('stsb', [jaccard(a, b) for a, b, _ in stsb],
                                            np.array([r[2] for r in stsb]))['spearman'],
            **{f"{t}_majority": majority(t, s['train'], s[t]) for t, s in sets.items()}}


def probes(encoder, data_dir, C=1.0, sst2_train_rows=0, **kw):
    """The frozen encoder's numbers: STS-B cosine Spearman and SST-2 probe accuracy (x100, dev); the SST-2 probe fit
    on the first sst2_train_rows training rows (0: all)."""
    sst2 = fg.load_task('sst2', data_dir)
    return {'stsb_cosine': stsb_cosine(encoder, fg.load_task('stsb', data_dir)['stsb'], **kw),
            'sst2_logreg': sst2_logreg(encoder, sst2['train'][:sst2_train_rows or None], sst2['sst2'], C, **kw)}


def run(ckpt_path, data_dir, out, max_len=128, batch_size=256, C=1.0, sst2_train_rows=0, device='cpu'):
    """Probes and baselines of one checkpoint, printed and written to <out>/probe.json (the result, returned)."""
    t0, path = time.time(), os.path.join(out, 'probe.json')
    encoder, model = encoder_of(ckpt_path, max_len)
    with locked(out, 'probe.py'):
        if os.path.exists(path):  # a file of another script, or another model's probes: never overwritten
            old = read_json(path, 'probe results')
            if not (isinstance(old, dict) and old.get('script') == 'probe.py'):
                raise SystemExit(f"probe: {path} is not a probe.py result; it was left as it is: use another out_dir")
            if old.get('pretrained') != model:
                raise SystemExit(f"probe: {path} holds the probes of another model ({describe(old.get('pretrained'))})"
                                 f", not of {ckpt_path} ({describe(model)}); it was left as it is: use another out_dir")
        res = {'script': 'probe.py', 'pretrained': model, 'init_from': os.path.abspath(ckpt_path),
               'data_dir': data_dir and os.path.abspath(data_dir), 'max_seq_len': max_len, 'C': C,
               'sst2_train_rows': sst2_train_rows, **baselines(data_dir),
               **probes(encoder, data_dir, C, sst2_train_rows, max_len=max_len, batch_size=batch_size, device=device)}
        res['seconds'] = round(time.time() - t0, 1)
        write_json(path, res)
    m, r = res['mrpc_majority'], res['rte_majority']
    print(f"STS-B cosine Spearman {res['stsb_cosine']:.2f}, Jaccard {res['stsb_jaccard']:.2f}; SST-2 probe accuracy "
          f"{res['sst2_logreg']:.2f}; MRPC majority {m['score']:.2f} (acc {m['accuracy']:.2f}, F1 {m['f1']:.2f}); "
          f"RTE majority {r['accuracy']:.2f} ({res['seconds']:.0f}s)\nresults: {path}")
    return res


if __name__ == '__main__':
    configure(globals())
    check('probe', (init_from, "set --init_from=<checkpoint>"),
          (min(max_seq_len - 3, batch_size - 1, sst2_train_rows) >= 0 and C > 0,
           "max_seq_len must be >= 3, batch_size >= 1, sst2_train_rows >= 0 and C > 0"))
    if missing := [p for t in TASKS for p in fg.tsv_files(t, data_dir).values() if data_dir and not os.path.isfile(p)]:
        raise SystemExit(f"probe: missing GLUE files: {', '.join(missing)}")
    with interrupt.stops_cleanly('probe', "nothing was written"):
        run(init_from, data_dir, out_dir, max_seq_len, batch_size, C, sst2_train_rows, device)

"""
Fine-tune a train.py checkpoint on GLUE with the protocol of Courtois et al. 2024 and score it (Table 3),
or score every kept snapshot of a pre-training run (Figure 3). Two programs with one protocol:

    python finetune_glue.py --init_from=out/ckpt.pt --data_dir=glue             # table3(): one Table-3 row
    python finetune_glue.py --benchmark=out --tasks=rte,mrpc,stsb --seeds=1     # run_benchmark(): GLUE vs. step

Protocol (the defaults): each task is fine-tuned from the pre-trained encoder for 5 epochs, batch 16, AdamW
lr 1e-5 with 10% linear warm-up then linear decay, weight decay 0, inputs cut to 128 tokens, seeds 1..5,
and the final model is scored on the dev set(s). Per-task numbers (x100): cola Matthews corr.; sst2, qnli,
rte accuracy; mrpc, qqp mean(F1, accuracy); stsb mean(Pearson, Spearman); mnli accuracy matched and
mismatched. GLUE score = plain mean of those 9 numbers, per seed; mean and std over seeds are reported.
<out_dir>/glue_results.json is rewritten after every (task, seed), so a re-run skips the finished pairs. Results
name the model they came from (its run id, step and a hash of its weights): another model's, such as one retrained
at the same path, are refused in one line, never reused (docs/glue.md).
"""
if __name__ == '__main__':  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import dataclasses
import glob
import math
import os
import re
import socket
import sys
import time
from functools import lru_cache
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from configurator import check, comma_list, configure, oneline
from lib.checkpoint import Unreadable, describe, load_checkpoint, model_id, save_checkpoint
from lib.device import set_up
from lib.files import check_replaceable, locked, read_json, write_json
from lib.step import optimizer_step, schedule
from lib.tokenizer import VOCAB_SIZE, get_tokenizer
from model import BertClassifier, BertConfig

# -----------------------------------------------------------------------------
init_from = ''  # a train.py checkpoint: <out_dir>/ckpt.pt or <out_dir>/snapshots/ckpt_<step>.pt
benchmark = ''  # a train.py out_dir: run the protocol on its kept snapshots instead (Figure 3)
snapshot_every = 1  # benchmark every k-th snapshot, counted back from the last one (always included)
tasks = 'all'  # 'all' = the 8 scored tasks, or a comma list of them; wnli can be run but is never scored
data_dir = ''  # GLUE in the original layout (CoLA/train.tsv, MNLI/dev_matched.tsv, ...); '' = the HF Hub
seeds = '1,2,3,4,5'  # fine-tuning seeds (the paper's five)
epochs = 5  # over each task's training set
batch_size = 16  # training batch
learning_rate = 1e-5  # peak, after the linear warm-up; linear decay to 0
warmup_ratio = 0.1  # fraction of the steps spent warming up
weight_decay = 0.0  # AdamW
dropout = 0.1  # fine-tuning dropout of the hidden states, attention probabilities and classifier: the paper's (BERT's)
               # 0.1, whatever the checkpoint was pre-trained with (Cramming turns it off in pre-training only);
               # -1: the checkpoint's own pre-training dropout
grad_clip = 1.0  # the Hugging Face Trainer's default max_grad_norm, which the paper's run_glue.py used
max_seq_len = 128  # [CLS] a [SEP] b [SEP], cut longest first; at least 5 (3 for cola and sst2 alone)
eval_batch_size = 256  # dev-set batch (no gradients)
length_bucketing = False  # batches of similar lengths: less padding, but not the paper's random batches
max_train_samples = 0  # > 0: only the first N training rows of each task (smoke runs); 0 = all
out_dir = 'out-glue'  # glue_results.json (and with save_models, the fine-tuned classifiers) go here
save_models = False  # keep each fine-tuned classifier as <out_dir>/<task>_s<seed>.pt (export_hf.py exports them);
                     # a pair done earlier without its classifier is fine-tuned again
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # cpu, cuda or cuda:N
dtype = 'auto'  # float32, bfloat16 or float16; auto = bf16 (fp16 on older GPUs), float32 on a CPU without native bf16
compile = False  # torch.compile: off, as dynamic padding changes shapes every batch and each (task, seed)
          # is a fresh model, so it costs more than it saves on GLUE-sized runs
# -----------------------------------------------------------------------------


class Settings(NamedTuple):
    """This script's settings, made once by make_settings(): the config block's, by the names --help shows (a new
    setting there needs a field here, or the script stops at its start), checked, and what follows from them. The
    functions take it as `settings`, apart from the pre-trained model's config (a BertConfig) and its weights."""
    init_from: str
    benchmark: str
    snapshot_every: int
    tasks: str
    data_dir: str
    seeds: str
    epochs: int
    batch_size: int
    learning_rate: float
    warmup_ratio: float
    weight_decay: float
    dropout: float
    grad_clip: float
    max_seq_len: int
    eval_batch_size: int
    length_bucketing: bool
    max_train_samples: int
    out_dir: str
    save_models: bool
    device: str
    dtype: str  # the precision computed in, as set_up resolved it (never 'auto'): the protocol records this one
    compile: bool
    task_list: list  # tasks, 'all' spelled out
    seed_list: list  # seeds, as integers
    device_type: str  # cpu, cuda or mps
    ctx: object  # the autocast of dtype on the device (a no-op in float32)


class Task(NamedTuple):
    folder: str  # in the original GLUE layout
    cols: tuple  # TSV columns of (text a, text b or None, label)
    header: bool  # the TSV files start with a header line
    labels: tuple  # the label spellings, index = class id as in nyu-mll/glue; None: regression
    dev: dict  # per-task number -> its dev file
    hub: tuple  # the Hub's text columns (a, b or None)


TASKS = {  # in Table 3's order
    'mrpc': Task('MRPC', (3, 4, 0), True, ('0', '1'), {'mrpc': 'dev'}, ('sentence1', 'sentence2')),
    'cola': Task('CoLA', (3, None, 1), False, ('0', '1'), {'cola': 'dev'}, ('sentence', None)),
    'mnli': Task('MNLI', (8, 9, -1), True, ('entailment', 'neutral', 'contradiction'),
                 {'mnli-m': 'dev_matched', 'mnli-mm': 'dev_mismatched'}, ('premise', 'hypothesis')),
    'qqp': Task('QQP', (3, 4, 5), True, ('0', '1'), {'qqp': 'dev'}, ('question1', 'question2')),
    'rte': Task('RTE', (1, 2, 3), True, ('entailment', 'not_entailment'), {'rte': 'dev'}, ('sentence1', 'sentence2')),
    'stsb': Task('STS-B', (7, 8, 9), True, None, {'stsb': 'dev'}, ('sentence1', 'sentence2')),
    'qnli': Task('QNLI', (1, 2, 3), True, ('entailment', 'not_entailment'), {'qnli': 'dev'}, ('question', 'sentence')),
    'sst2': Task('SST-2', (0, None, 1), True, ('0', '1'), {'sst2': 'dev'}, ('sentence', None)),
    'wnli': Task('WNLI', (1, 2, 3), True, ('0', '1'), {'wnli': 'dev'}, ('sentence1', 'sentence2')),
}
NUMBERS = ['mrpc', 'cola', 'mnli-m', 'mnli-mm', 'qqp', 'rte', 'stsb', 'qnli', 'sst2']  # the GLUE score's 9
PROTOCOL = ['epochs', 'batch_size', 'learning_rate', 'warmup_ratio', 'weight_decay', 'grad_clip',
            'max_seq_len', 'length_bucketing', 'max_train_samples', 'data_dir', 'dtype']  # change results
SCHEDULE = 'linear from 0'  # recorded with the protocol: results of the earlier schedule (from lr/warmup) never mix
OPTIMIZER = 'AdamW (0.9, 0.999), eps 1e-8, no weight decay on biases and LayerNorms'  # recorded likewise: finetune()


# ----------------------------------------------------------------------------- metrics (x in [0, 1])

def confusion(pred, gold):  # tp, tn, fp, fn of a binary task, as floats (no integer overflow in MCC)
    return (float(np.sum((pred == p) & (gold == g))) for p, g in ((1, 1), (0, 0), (1, 0), (0, 1)))


def accuracy(pred, gold):
    return float(np.mean(pred == gold))


def f1(pred, gold):  # of the positive class 1
    tp, _, fp, fn = confusion(pred, gold)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def mcc(pred, gold):
    tp, tn, fp, fn = confusion(pred, gold)
    d = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / d if d else 0.0  # one class only (predicted or gold): 0, not NaN


def pearson(x, y):
    x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
    d = math.sqrt(np.dot(x, x) * np.dot(y, y))
    return float(np.dot(x, y) / d) if d else 0.0  # a constant has no correlation: 0, like MCC


def ranks(x):
    """1-based ranks; tied values all get the average of the ranks they span."""
    order = np.argsort(x, kind='stable')
    _, first, count = np.unique(np.asarray(x)[order], return_index=True, return_counts=True)
    r = np.empty(len(x))
    r[order] = np.repeat(first + (count + 1) / 2, count)
    return r


def spearman(x, y):
    """Spearman's rank correlation: the correlation of the ranks. nan where it is undefined (a constant side, fewer
    than 2 pairs), as scipy.stats.spearmanr gives."""
    if len(x) < 2:
        return float('nan')
    with np.errstate(invalid='ignore', divide='ignore'):  # a constant side: 0 / 0
        return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def task_metrics(task, pred, gold):
    """Every metric of the task (x100) and 'score', its number in the GLUE score: the mean of them."""
    if task == 'stsb':
        rho = spearman(pred, gold)  # nan for a constant prediction (a collapsed model): 0 here, like pearson and mcc
        m = {'pearson': pearson(pred, gold), 'spearman': 0.0 if math.isnan(rho) else rho}
    elif task == 'cola':
        m = {'mcc': mcc(pred, gold)}
    else:
        m = {'accuracy': accuracy(pred, gold), **({'f1': f1(pred, gold)} if task in ('mrpc', 'qqp') else {})}
    m = {k: 100 * v for k, v in m.items()}
    return {**m, 'score': float(np.mean(list(m.values())))}


def glue_score(numbers):
    """Plain mean of the 9 per-task numbers (MNLI-m and -mm count apart; wnli never). Given only some of
    them, the mean of those: summarize() flags that it is then not the GLUE score."""
    return float(np.mean([numbers[n] for n in NUMBERS if n in numbers]))


def mean_std(v):  # std over seeds: the sample standard deviation (ddof=1); 0 for a single seed
    return {'mean': float(np.mean(v)), 'std': float(np.std(v, ddof=1)) if len(v) > 1 else 0.0}

# ----------------------------------------------------------------------------- data


def read_tsv(path, task):
    """(text a, text b or None, label) rows of a GLUE TSV file. Fields are split on tabs with quoting off:
    GLUE sentences hold unbalanced quote characters (STS-B, MRPC, MNLI). MRPC starts with a BOM."""
    cols, header, labels = TASKS[task].cols, TASKS[task].header, TASKS[task].labels
    try:
        with open(path, encoding='utf-8-sig', newline='') as f:
            lines = [line.rstrip('\r') for line in f.read().split('\n')]  # not splitlines(): \x85 is text
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"glue: cannot read {path}: {oneline(e)}")
    lines = lines[:-1] if lines[-1] == '' else lines
    width = len(lines[0].split('\t')) if lines else 0  # every row must have as many fields as the first line
    if width <= max(c for c in cols if c is not None) or len(lines) <= header:
        raise SystemExit(f"glue: {path}: not a {task} file ({width} fields on line 1, {len(lines)} lines)")
    rows = []
    for n, line in enumerate(lines[header:], 1 + header):
        f = line.split('\t')
        if len(f) != width:
            raise SystemExit(f"glue: {path}, line {n}: {len(f)} tab-separated fields, expected {width}")
        text = f[cols[2]]
        try:
            y = labels.index(text) if labels else float(text)
            if not math.isfinite(y):
                raise ValueError
        except ValueError:
            raise SystemExit(f"glue: {path}, line {n}: bad label {text!r} (expected {labels or 'a finite number'})")
        rows.append((f[cols[0]], None if cols[1] is None else f[cols[1]], y))
    return rows


def tsv_files(task, data_dir):
    files = {'train': 'train', **TASKS[task].dev}
    return {k: os.path.join(data_dir, TASKS[task].folder, f + '.tsv') for k, f in files.items()}


def load_task(task, data_dir):
    """{'train': rows, <number name>: dev rows, ...} from data_dir, or from nyu-mll/glue when it is ''."""
    dev, (a, b) = TASKS[task].dev, TASKS[task].hub
    if data_dir:
        return {k: read_tsv(path, task) for k, path in tsv_files(task, data_dir).items()}
    host = os.environ.get('HF_ENDPOINT', 'https://huggingface.co').split('://')[-1].split('/')[0]
    try:  # offline: use the local cache only, at once, instead of ~30 s of retries
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        os.environ['HF_HUB_OFFLINE'] = os.environ['HF_DATASETS_OFFLINE'] = '1'
    try:
        import datasets
        ds = datasets.load_dataset('nyu-mll/glue', task)
    except Exception as e:  # no network, no datasets package, ...: one line, not a traceback
        offline = ' (offline, and not in the local cache)' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''
        raise SystemExit(f"glue: cannot load nyu-mll/glue '{task}' from the Hugging Face Hub{offline} ({oneline(e)}); "
                         "pass --data_dir=<a local GLUE folder> (docs/glue.md)")
    splits = {'train': 'train', **{k: f.replace('dev', 'validation') for k, f in dev.items()}}
    return {k: list(zip(ds[s][a], ds[s][b] if b else [None] * len(ds[s]['label']), ds[s]['label']))
            for k, s in splits.items()}


def shortest(pair):
    """The shortest input worth the name: [CLS] a [SEP] (b [SEP]) with one token of each sentence."""
    return 5 if pair else 3


def encode(rows, max_len, vocab_size=VOCAB_SIZE):
    """[CLS] a [SEP] (b [SEP]), longest-first truncation to max_len. Returns the token arrays, the length of
    the first segment [CLS] a [SEP] (token type 0, the rest is type 1), the lengths and the labels, tokenised with
    the model's vocabulary (vocab_size: the pre-trained model's) and with its [PAD] id for batch."""
    enc, sp = get_tokenizer(vocab_size)
    pair = rows[0][1] is not None
    A = enc.encode_ordinary_batch([r[0].strip() for r in rows])
    B = enc.encode_ordinary_batch([r[1].strip() for r in rows]) if pair else [[]] * len(rows)
    budget = max_len - (3 if pair else 2)
    if max_len < shortest(pair):  # the cut below would go negative, and slices from the end make inputs longer
        raise SystemExit(f"finetune_glue: max_seq_len {max_len} holds no {'pair' if pair else 'sentence'}: at least "
                         f"{shortest(pair)} ([CLS] a [SEP]{' b [SEP]' if pair else ''}, a token of each)")
    tok, first = [], []
    for a, b in zip(A, B):
        la, lb = len(a), len(b)
        while la + lb > budget:  # drop a token from the end of the longer segment (b on a tie)
            la, lb = (la - 1, lb) if la > lb else (la, lb - 1)
        tok.append(np.array([sp['cls'], *a[:la], sp['sep'], *b[:lb], *([sp['sep']] if pair else [])], np.int64))
        first.append(la + 2)
    y = np.array([r[2] for r in rows], np.float32 if isinstance(rows[0][2], float) else np.int64)
    return {'tok': tok, 'first': np.array(first), 'len': np.array([len(t) for t in tok]), 'y': y, 'pad': sp['pad']}


@lru_cache(maxsize=None)  # a benchmark scores many checkpoints on the same data
def task_data(task, data_dir, max_seq_len, max_train_samples=0, vocab_size=VOCAB_SIZE):
    t0, sets = time.time(), load_task(task, data_dir)
    sets['train'] = sets['train'][:max_train_samples or None]
    data = {k: encode(rows, max_seq_len, vocab_size) for k, rows in sets.items()}
    cut = sum(int(np.sum(d['len'] == max_seq_len)) for d in data.values())
    split = {'train': 'train', **TASKS[task].dev}  # the dev splits by their file's name (mnli: two)
    print(f"{task}: " + ", ".join(f"{split[k]} {len(r)} rows" for k, r in sets.items())
          + f"; {cut} at the {max_seq_len}-token limit ({time.time() - t0:.1f}s)")
    return data


def batch(d, idx, device='cpu'):
    """Tensors for rows idx, padded to the longest of them (dynamic padding)."""
    lens, pos = d['len'][idx], np.arange(d['len'][idx].max())
    ids = np.full((len(idx), len(pos)), d['pad'], np.int64)
    for r, i in enumerate(idx):
        ids[r, :lens[r]] = d['tok'][i]
    mask = pos < lens[:, None]
    types = (pos >= d['first'][idx][:, None]) & mask
    t = lambda x: torch.from_numpy(x).to(device, non_blocking=True)
    return t(ids), None if mask.all() else t(mask), t(types.astype(np.int64))  # no mask: fastest kernels

# ----------------------------------------------------------------------------- fine-tuning


def load_pretrained(path, max_seq_len=0, who='finetune_glue'):
    """(BertConfig, Bert state dict, iter_num, model_id: what its results name) of a train.py checkpoint (full or
    snapshot), checked (who: the script, in its messages)."""
    ck = load_checkpoint(path)
    if 'num_labels' in ck:  # what pre-training made is fine-tuned and probed, not a model fine-tuned already
        raise Unreadable(f"{path} is a classifier fine-tuned on {ck.get('task', 'a task')} (finetune_glue.py "
                         "--save_models), not a train.py checkpoint: give the pre-trained model it was made from")
    cfg = BertConfig(**ck['model_args'])
    if max_seq_len > cfg.block_size:
        raise SystemExit(f"{who}: max_seq_len {max_seq_len} > the model's block_size {cfg.block_size}: lower it")
    return cfg, ck['model'], int(ck['iter_num']), model_id(ck)


def tuned(cfg, dropout):
    """The pre-trained model's config as it fine-tunes: with the protocol's dropout on the hidden states, attention
    probabilities and classifier, or its pre-training's own where dropout is -1."""
    return cfg if dropout < 0 else dataclasses.replace(cfg, dropout=dropout, attention_dropout=None)


def finetune(task, data, seed, model_config, weights, settings, keep=None, iter_num=0, pretrained=None, protocol=None):
    """Fine-tune a fresh classifier, its encoder the pre-trained one (model_config, a BertConfig, and weights, its
    state dict), on data['train'] with the protocol of settings; returns the dev metrics. With keep, a path, the
    fine-tuned classifier is saved there with iter_num, the pre-training step, pretrained, the pre-trained model's
    model_id, and protocol, the settings that made it (export_hf.py turns it into a BertForSequenceClassification)."""
    torch.manual_seed(seed)  # the new pooler and classifier, dropout
    rng = np.random.default_rng(seed)  # batch order
    num_labels = 1 if task == 'stsb' else len(TASKS[task].labels)
    model = BertClassifier.from_pretrained(model_config, weights, num_labels).to(settings.device)
    fwd = torch.compile(model, dynamic=True) if settings.compile else model
    opt = model.configure_optimizers(settings.weight_decay, settings.learning_rate, (0.9, 0.999), 1e-8,
                                     settings.device_type)  # HF's AdamW
    scaler = torch.amp.GradScaler(settings.device_type, enabled=settings.dtype == 'float16')  # bf16 needs none
    train, n = data['train'], len(data['train']['tok'])
    steps = settings.epochs * math.ceil(n / settings.batch_size)
    warmup = math.ceil(settings.warmup_ratio * steps)
    t0, step = time.time(), 0
    model.train()
    # a live bar on a terminal only: a batch job's log gets the one result line per (task, seed)
    with tqdm(total=steps, desc=f"{task} seed {seed}", leave=False, disable=not sys.stderr.isatty()) as bar:
        for _ in range(settings.epochs):
            order = rng.permutation(n)
            if settings.length_bucketing:  # sorted by length within chunks of 100 batches
                c = 100 * settings.batch_size
                order = np.concatenate([o[np.argsort(train['len'][o])] for o in np.split(order, range(c, n, c))])
            batches = [order[i:i + settings.batch_size] for i in range(0, n, settings.batch_size)]
            loss_sum = torch.zeros((), device=settings.device)  # summed on the device: no host sync per step
            for b in rng.permutation(len(batches)):  # random batch order (matters only when bucketed)
                idx = batches[b]
                schedule(opt, step, settings.learning_rate, warmup, steps)
                ids, mask, types = batch(train, idx, settings.device)
                with settings.ctx:
                    _, loss = fwd(ids, torch.from_numpy(train['y'][idx]).to(settings.device), attention_mask=mask,
                                  token_type_ids=types)
                scaler.scale(loss).backward()
                optimizer_step(opt, scaler, model.parameters(), settings.grad_clip)
                loss_sum += loss.detach()
                step += 1
                bar.update()
                if step % 100 == 0:
                    bar.set_postfix(loss=f"{loss.item():.4f}")
            if not math.isfinite(loss_sum.item()):  # a diverged fine-tuning is no result: nothing is recorded
                raise SystemExit(f"finetune_glue: {task} seed {seed}: the training loss went non-finite; nothing was "
                                 "recorded for it (try a lower --learning_rate, or dtype=bfloat16/float32)")
    result = {'train_loss': loss_sum.item() / len(batches), 'dev': {}}  # mean over the last epoch
    model.eval()
    with torch.inference_mode():
        for name in TASKS[task].dev:
            d = data[name]
            order = np.argsort(d['len'], kind='stable')  # similar lengths together: little padding
            out = []
            for i in range(0, len(order), settings.eval_batch_size):
                ids, mask, types = batch(d, order[i:i + settings.eval_batch_size], settings.device)
                with settings.ctx:
                    out.append(fwd(ids, attention_mask=mask, token_type_ids=types)[0].float().cpu())
            logits = torch.cat(out).numpy()
            pred = logits[:, 0] if task == 'stsb' else logits.argmax(-1)
            result['dev'][name] = task_metrics(task, pred, d['y'][order])  # metrics ignore row order
    result['seconds'] = round(time.time() - t0, 1)
    if keep:
        save_checkpoint({'model': model.state_dict(), 'model_args': vars(model_config), 'iter_num': iter_num,
                         'task': task, 'seed': seed, 'num_labels': model.num_labels, 'labels': TASKS[task].labels,
                         'dev': result['dev'], 'pretrained': pretrained, 'protocol': protocol}, keep)
    return result

# ----------------------------------------------------------------------------- results


def summarize(runs):
    """Per-number mean/std over seeds, and the GLUE score per seed over the seeds that have every number."""
    per_seed = {n: {s: r['dev'][n]['score'] for s, r in runs[t].items()}
                for t in TASKS if runs.get(t) for n in TASKS[t].dev}  # Table 3's order
    numbers = {n: {'per_seed': v, **mean_std(list(v.values()))} for n, v in per_seed.items()}
    scored = [n for n in NUMBERS if n in per_seed]
    seeds_all = sorted({s for v in per_seed.values() for s in v}, key=int)
    done = [s for s in seeds_all if scored and all(s in per_seed[n] for n in scored)]
    glue = {s: glue_score({n: per_seed[n][s] for n in scored}) for s in done}
    return {'numbers': numbers, 'glue': {'per_seed': glue, **(mean_std(list(glue.values())) if glue else {}),
                                         'complete': len(scored) == len(NUMBERS), 'n_numbers': len(scored)}}


def table(name, summary):
    """A Markdown row laid out like the paper's Table 3 (mean over seeds; the GLUE cell also has the std)."""
    num, g = summary['numbers'], summary['glue']
    f = lambda n: f"{num[n]['mean']:.2f}" if n in num else '-'
    cols = {'mrpc': f('mrpc'), 'cola': f('cola'), 'mnli m/mm': f"{f('mnli-m')}/{f('mnli-mm')}"}
    cols.update({n: f(n) for n in NUMBERS[4:] + (['wnli'] if 'wnli' in num else [])})
    std = f" ({g['std']:.2f})" if len(g.get('per_seed', {})) > 1 else ''  # one seed has no spread to show
    score = f"{g['mean']:.2f}{std}" + ('' if g['complete'] else '*') if 'mean' in g else '-'
    lines = ['| model | GLUE | ' + ' | '.join(cols) + ' |', '|---' * (len(cols) + 2) + '|',
             f"| {name} | {score} | " + ' | '.join(cols.values()) + ' |']
    if not g['complete'] and 'mean' in g:
        lines.append(f"\n* not the GLUE score: mean of the {g['n_numbers']} numbers run (of 9)")
    return '\n'.join(lines)


RANGES = {'accuracy': (0, 100), 'f1': (0, 100), 'mcc': (-100, 100), 'pearson': (-100, 100),  # x100, as
          'spearman': (-100, 100)}  # task_metrics gives them


def damaged(runs):
    """The first '<task> seed <seed> (why)' of a glue_results.json's runs that is not a result this script writes, or
    None: a seed spelled otherwise than str(int) ('01' beside '1' would count a third seed), a number missing, not
    finite, or outside its metric's range (an accuracy of 101); a task's score lies in its metrics' range and is
    their mean."""
    def wrong(name, m):
        if not isinstance(m, dict) or type(m.get('score')) not in (int, float) or not math.isfinite(m['score']):
            return f"its {name} score is missing or not a finite number"
        ranges = [RANGES[k] for k in m if k in RANGES] or [(-100, 100)]  # the score: a mean of its metrics
        for k, v in [*((k, m[k]) for k in m if k in RANGES), ('score', m['score'])]:
            lo, hi = RANGES[k] if k in RANGES else (min(r[0] for r in ranges), max(r[1] for r in ranges))
            if type(v) not in (int, float) or not lo <= v <= hi:
                return f"its {name} {k} {v!r} is not in [{lo}, {hi}]"
        metrics = [m[k] for k in m if k in RANGES]  # task_metrics makes the score their mean: another is not its
        if metrics and abs(m['score'] - float(np.mean(metrics))) > 1e-9 * max(1.0, abs(m['score'])):
            return f"its {name} score {m['score']!r} is not the mean of its metrics ({float(np.mean(metrics))!r})"
        return None

    for task, seeds in runs.items():
        if not isinstance(seeds, dict):
            return f"{task} (its runs are no {{seed: result}} object)"
        for seed, r in seeds.items():
            if not re.fullmatch(r'0|[1-9][0-9]*', seed):
                return f"{task} seed {seed} (a seed is written as a plain whole number: {seed!r} would count apart)"
            if not (isinstance(r, dict) and isinstance(r.get('dev'), dict)):
                return f"{task} seed {seed}"
            for name in (TASKS[task].dev if task in TASKS else ()):
                if why := wrong(name, r['dev'].get(name)):
                    return f"{task} seed {seed} ({why})"
            if task in TASKS and (extra := sorted(set(r['dev']) - set(TASKS[task].dev))):  # averaged in: not its own
                return f"{task} seed {seed} (its dev holds {', '.join(map(str, extra))}, not a dev set of {task})"
    return None


def protocol_of(settings, ckpt_path, pretrained, model_config):
    """What the results of a checkpoint under these settings are: the protocol's settings (the dropout that
    fine-tuned as model_config, tuned(), has it), and the model they came from (model_id: its run id, step and
    weights), never the path it was read from (recorded, not compared)."""
    return {**{k: getattr(settings, k) for k in PROTOCOL}, 'dropout': model_config.dropout,
            'attention_dropout': model_config.attn_dropout(), 'schedule': SCHEDULE, 'optimizer': OPTIMIZER,
            'data_dir': settings.data_dir and os.path.abspath(settings.data_dir), 'pretrained': pretrained,
            'init_from': os.path.abspath(ckpt_path), 'iter_num': pretrained['step']}


def earlier_results(path, ckpt_path, protocol):
    """The results in path (a glue_results.json), to go on from: refused in one line, and left as they are, when
    they are damaged, of another model than ckpt_path's (a model retrained at the same path, say), or of other
    settings. None when there are none."""
    if not os.path.exists(path):
        return None
    res = read_json(path, 'GLUE results')
    if not isinstance(res, dict) or not all(isinstance(res.get(k), dict) for k in ('protocol', 'runs')):
        raise SystemExit(f"finetune_glue: {path} is not a glue_results.json of this script; it was left as it "
                         "is: choose another out_dir")
    if bad := damaged(res['runs']):  # a hand-edited entry: named now, never a TypeError later
        raise SystemExit(f"finetune_glue: {path}: the result of {bad} is damaged (edited by hand?); the file "
                         "was left as it is: delete that entry to run it again")
    if (old := res['protocol'].get('pretrained')) != protocol['pretrained']:
        raise SystemExit(f"finetune_glue: {path} holds the results of another model ({describe(old)}), not of "
                         f"{ckpt_path} ({describe(protocol['pretrained'])}); it was left as it is: use another "
                         "out_dir for this model, or move that file away")
    if diff := [k for k in protocol if k != 'init_from' and res['protocol'].get(k) != protocol[k]]:
        raise SystemExit(f"finetune_glue: {path} holds results of other settings ({', '.join(diff)} differ); "
                         "use another out_dir or delete that file")
    return res


def kept_classifier(path, task, seed, pretrained, protocol):
    """True if path holds the classifier --save_models keeps for (task, seed) of the model pretrained (its model_id)
    under protocol (the results' settings), whole; False if there is none. Anything else there (a cut file, a user's,
    another model's or settings') is never overwritten: one line, and it is left as it is."""
    if not os.path.lexists(path):
        return False
    try:
        ck = load_checkpoint(path)
        other = ck.get('protocol')
        changed = [k for k in protocol if isinstance(other, dict) and other.get(k) != protocol[k]]
        if (ck.get('task'), ck.get('seed'), ck.get('pretrained')) != (task, int(seed), pretrained):
            why = f"it is {ck.get('task')} seed {ck.get('seed')} of {describe(ck.get('pretrained'))}"
        elif not isinstance(other, dict):
            why = "it records no fine-tuning settings (kept before classifiers named them)"
        elif changed:  # as earlier_results compares: the keys of this protocol
            why = "it was fine-tuned with other settings (" + ', '.join(
                f"{k} {other.get(k)!r}, not {protocol[k]!r}" for k in changed if k != 'pretrained') + ")"
        else:
            why = None
    except Unreadable as e:
        why = str(e)
    if why:
        raise SystemExit(f"finetune_glue: {path} is where --save_models keeps the {task} seed {seed} classifier of this "
                         f"model, but {why}; it was left as it is: move it away, or use another out_dir")
    return True


def table3(ckpt_path, out, settings, step=None):
    """The protocol for one checkpoint: every (task, seed) not yet in <out>/glue_results.json, then its Table-3 row.
    step: the step its file name says (a benchmark's snapshot), refused if it holds another."""
    model_config, weights, iter_num, pretrained = load_pretrained(ckpt_path, settings.max_seq_len)
    if step is not None and iter_num != step:
        raise Unreadable(f"{ckpt_path}: its name says step {step}, it holds step {iter_num} (renamed?)")
    model_config = tuned(model_config, settings.dropout)
    path = os.path.join(out, 'glue_results.json')
    protocol = protocol_of(settings, ckpt_path, pretrained, model_config)
    res = {'model': f"{model_config.attention_type} {model_config.n_layer}L/{model_config.n_embd}H step {iter_num}",
           'protocol': protocol, 'runs': {}}
    with locked(out, 'finetune_glue.py'):  # one writer per results folder
        res = earlier_results(path, ckpt_path, protocol) or res  # never mixed with another model's or settings'
        res['protocol']['init_from'] = protocol['init_from']  # where it was read this time
        pairs = [(task, str(seed)) for task in settings.task_list for seed in settings.seed_list]
        what = {k: v for k, v in protocol.items() if k != 'init_from'}  # as earlier_results compares: not where the
        # model was read
        kept = {p: kept_classifier(os.path.join(out, f"{p[0]}_s{p[1]}.pt"), *p, pretrained, what)
                for p in pairs if settings.save_models}  # before any fine-tuning: a file not ours is one line now
        for task, seed in pairs:
            keep = os.path.join(out, f"{task}_s{seed}.pt") if settings.save_models else None
            if seed in res['runs'].get(task, {}) and not (keep and not kept[task, seed]):
                print(f"{task} seed {seed}: done already, skipped")
                continue
            if seed in res['runs'].get(task, {}):
                print(f"{task} seed {seed}: done already, but its classifier was not kept: fine-tuned again to "
                      f"keep it (--save_models=True), its result replaced")
            data = task_data(task, settings.data_dir, settings.max_seq_len, settings.max_train_samples,
                             model_config.vocab_size)  # the GLUE text in the model's own vocabulary
            r = finetune(task, data, int(seed), model_config, weights, settings, keep=keep, iter_num=iter_num,
                         pretrained=pretrained, protocol=what)
            res['runs'].setdefault(task, {})[seed] = r
            print(f"{task} seed {seed}: " + ', '.join(f"{n} {m['score']:.2f}" for n, m in r['dev'].items())
                  + f" (train loss {r['train_loss']:.4f}, {r['seconds']:.0f}s)")
            write_json(path, {**res, **summarize(res['runs'])})
        res.update(summarize(res['runs']))
        write_json(path, res)
    print(table(res['model'], res))
    print(f"results: {path}" + (f"; classifiers: {out}/<task>_s<seed>.pt" if settings.save_models else ""))
    return res


def run_benchmark(run_dir, settings):
    """Figure 3: the protocol on the kept snapshots of a train.py run (every snapshot_every-th, counted back from the
    last, and ckpt.pt when it is newer); records score vs. step and the first step at 95% of the final score."""
    with locked(settings.out_dir, 'finetune_glue.py --benchmark'):  # one benchmark per folder, from the start
        check_replaceable(os.path.join(settings.out_dir, 'benchmark.json'),  # replaced at the end: one of ours only
                          lambda o: {'records', 'final_score', 'step_95'} <= o.keys(), 'finetune_glue',
                          "benchmark of finetune_glue.py's")
        snaps = sorted((int(m.group(1)), p) for p in glob.glob(os.path.join(run_dir, 'snapshots', 'ckpt_*.pt'))
                       if (m := re.fullmatch(r'ckpt_(\d+)\.pt', os.path.basename(p))))
        snaps = snaps[::-settings.snapshot_every][::-1]
        final, skipped = os.path.join(run_dir, 'ckpt.pt'), []
        try:
            final_step = load_pretrained(final, settings.max_seq_len)[2] if os.path.isfile(final) else -1
        except Unreadable as e:
            final_step, _ = -1, skipped.append(str(e))
        if final_step > (snaps[-1][0] if snaps else -1):
            snaps.append((final_step, final))
        for step, path in snaps:  # before any compute: a step's results of another model are refused, not reused
            earlier = os.path.join(settings.out_dir, f"step_{step:07d}", 'glue_results.json')
            try:
                if os.path.exists(earlier):
                    cfg, _, _, pretrained = load_pretrained(path)
                    earlier_results(earlier, path, protocol_of(settings, path, pretrained, tuned(cfg, settings.dropout)))
            except Unreadable:
                pass  # named and skipped below
        records = []
        for step, path in snaps:
            try:  # an unreadable snapshot, or one whose name is not its step, is named and skipped: the others
                g = table3(path, os.path.join(settings.out_dir, f"step_{step:07d}"), settings, step)  # are scored
            except Unreadable as e:
                print(f"skipped: {e}", flush=True)
                skipped.append(str(e))
                continue
            records.append({'step': step, 'checkpoint': path, 'pretrained': g['protocol']['pretrained'],
                            'score': g['glue'].get('mean'),
                            'std': g['glue'].get('std'), 'complete': g['glue']['complete'],
                            'numbers': {n: v['mean'] for n, v in g['numbers'].items()}})
        if not records:
            raise SystemExit(f"finetune_glue: no readable snapshots/ckpt_*.pt or ckpt.pt in {run_dir!r}"
                             + (f" ({skipped[0]})" if skipped else ""))
        target = 0.95 * records[-1]['score']
        step_95 = next((r['step'] for r in records if r['score'] >= target), None)
        write_json(os.path.join(settings.out_dir, 'benchmark.json'),
                   {'records': records, 'final_score': records[-1]['score'], 'target_95': target, 'step_95': step_95,
                    'tasks': settings.task_list})
    print('| step | score |\n|---|---|\n' + '\n'.join(f"| {r['step']} | {r['score']:.2f} ({r['std']:.2f}) |"
                                                   for r in records))
    print(f"first step at 95% of the final score ({target:.2f}): {step_95}")
    if skipped:
        raise SystemExit(f"finetune_glue: {len(skipped)} checkpoint(s) refused and skipped, the benchmark is without "
                         f"them: {'; '.join(skipped)}"[:600])


def make_settings(config):
    """This run's Settings from the configurator's globals (config): checked before anything is loaded, with the
    task and seed lists, the device and the precision set up."""
    c = SimpleNamespace(**config)  # the settings as given, for the checks; what leaves is a Settings
    task_list = list(TASKS)[:8] if c.tasks == 'all' else comma_list('finetune_glue', 'tasks', c.tasks, list(TASKS))
    seed_list = [int(x) for x in comma_list('finetune_glue', 'seeds', c.seeds, numbers=True)]
    check('finetune_glue',
          (max(seed_list) < 10 ** 9, f"seeds must be a comma list of integers below 10**9, got {c.seeds!r}"),
          (min(c.epochs, c.batch_size, c.max_seq_len, c.eval_batch_size, c.snapshot_every) >= 1 and c.learning_rate > 0
           and 0 <= c.warmup_ratio <= 1 and min(c.weight_decay, c.grad_clip, c.max_train_samples) >= 0,
           "epochs, batch_size, max_seq_len, eval_batch_size and snapshot_every must be >= 1, learning_rate > 0, "
           "warmup_ratio in [0, 1], weight_decay, grad_clip and max_train_samples >= 0"),
          (0 <= c.dropout < 1 or c.dropout == -1, f"dropout must be in [0, 1), or -1 for the checkpoint's own, got "
                                                  f"{c.dropout}"),
          (c.max_seq_len >= max(shortest(t in TASKS and TASKS[t].cols[1] is not None) for t in task_list),
           f"max_seq_len must hold [CLS] a [SEP] b [SEP] with a token of each sentence: at least 5 (3 for cola and "
           f"sst2 alone); got {c.max_seq_len}"),
          (c.benchmark or c.init_from, "set --init_from=<checkpoint> or --benchmark=<train.py out_dir>"))
    missing = [p for t in task_list for p in tsv_files(t, c.data_dir).values() if c.data_dir and not os.path.isfile(p)]
    if missing:  # now, not hours into the run
        raise SystemExit(f"finetune_glue: missing GLUE files: {', '.join(missing)} (pick tasks with --tasks=...)")
    device_type, dtype, why, ctx, _ = set_up(c.device, c.dtype)
    print(f"finetune_glue: {c.device}, {dtype} ({why})", flush=True)
    return Settings(**{**config, 'dtype': dtype}, task_list=task_list, seed_list=seed_list, device_type=device_type,
                    ctx=ctx)


if __name__ == '__main__':  # a script; the tests import its functions
    settings = make_settings(configure(globals()))
    with interrupt.stops_cleanly('finetune_glue', f"the results finished so far are kept in {settings.out_dir}: the "
                                                  "same command goes on from them"):
        if settings.benchmark:
            run_benchmark(settings.benchmark, settings)
        else:
            table3(settings.init_from, settings.out_dir, settings)

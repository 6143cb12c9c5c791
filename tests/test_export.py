"""export_hf.py: every paper operator becomes a stock Hugging Face BERT that predicts what ours predicts."""
import json
import os

import pytest
import torch

from conftest import run_script
import export_hf
from lib.files import atomic_write
from lib.tokenizer import encode_with_specials, get_tokenizer
from model import Bert, BertClassifier, BertConfig

transformers = pytest.importorskip("transformers")
TINY = dict(n_layer=2, n_head=2, n_embd=32, n_inner=64, block_size=64)


def perturbed(model):
    """Random biases and LayerNorm parameters, so that the comparison exercises every tensor; S stays N(0, 1)
    and so is far from symmetric: an orientation mistake cannot pass."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def write_export(ck, out):
    os.makedirs(out)
    for name, data in export_hf.export(ck, out).items():
        atomic_write(os.path.join(out, name), lambda f, d=data: f.write(d))
    return str(out)


def inputs():
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50257, (3, 24), generator=g)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 17:], mask[2, 5:] = 0, 0  # padding
    return idx, mask, torch.randint(0, 2, (3, 24), generator=g)


@pytest.mark.parametrize("attention_type,score_scale", [("original", 1.0), ("symmetric", 1.0), ("pairwise", 1.0),
                                                       ("original", 4.0), ("pairwise", 0.5)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_exported_masked_lm_gives_our_logits(tmp_path, attention_type, score_scale, dtype, tol):
    torch.manual_seed(1)
    ours = perturbed(Bert(BertConfig(**TINY, attention_type=attention_type, score_scale=score_scale))).to(dtype)
    if attention_type == "pairwise":
        S = ours.encoder.layers[0].attn.S
        assert (S - S.transpose(-1, -2)).abs().max() > 1.0  # not symmetric
    out = write_export({"model": ours.state_dict(), "model_args": vars(ours.config), "iter_num": 0}, tmp_path / "hf")
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, dtype=dtype, output_loading_info=True)
    assert type(hf).__name__ == "BertForMaskedLM" and not info["missing_keys"] and not info["unexpected_keys"]
    hf.eval()
    idx, mask, types = inputs()
    with torch.no_grad():
        a = ours(idx, attention_mask=mask, token_type_ids=types)[0]
        b = hf(input_ids=idx, attention_mask=mask, token_type_ids=types).logits
    assert b.dtype == dtype
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=tol, rtol=tol)  # padded rows mean nothing


@pytest.mark.parametrize("attention_type", ["original", "pairwise"])
def test_fused_qkv_and_attention_dropout_export_exactly(tmp_path, attention_type):
    """A model run with fused_qkv (set_kernels) has the same state dict, so the same export: the stock model gives its
    logits in float64; attention_dropout reaches config.json, apart from the hidden states' dropout."""
    from model import set_kernels

    torch.manual_seed(2)
    ours = perturbed(Bert(BertConfig(**TINY, attention_type=attention_type, attention_dropout=0.0))).double()
    set_kernels(ours, fused_qkv=True)
    out = write_export({"model": ours.state_dict(), "model_args": vars(ours.config), "iter_num": 0}, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["attention_probs_dropout_prob"] == 0.0 and cfg["hidden_dropout_prob"] == 0.1
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, dtype=torch.float64).eval()
    idx, mask, types = inputs()
    with torch.no_grad():
        a = ours(idx, attention_mask=mask, token_type_ids=types)[0]
        b = hf(input_ids=idx, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=1e-10, rtol=1e-10)
    assert hf.config.attention_probs_dropout_prob == 0.0


@pytest.mark.parametrize("attention_type,step", [("original", 3), ("original", 8), ("symmetric", 3), ("pairwise", 20)])
def test_a_heat_treated_checkpoint_exports_the_multiplier_it_is_at(tmp_path, attention_type, step):
    """Heat treatment: a checkpoint during the anneal exports its current multiplier; after it (step >= 8), the
    plain operator, a stock layer as any other."""
    torch.manual_seed(1)
    ours = perturbed(Bert(BertConfig(**TINY, attention_type=attention_type, score_scale=8.0, score_scale_warmup=8)))
    ours = ours.double()
    ours.anneal_scores(step)
    ck = {"model": ours.state_dict(), "model_args": vars(ours.config), "iter_num": step}
    hf = transformers.AutoModelForMaskedLM.from_pretrained(write_export(ck, tmp_path / "hf"), dtype=torch.float64)
    idx, mask, types = inputs()
    with torch.no_grad():
        a = ours(idx, attention_mask=mask, token_type_ids=types)[0]
        b = hf.eval()(input_ids=idx, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("vocab_size", [50304, 16384])  # 16384: prepare_oscar.py --vocab_size, GPT-2's first merges
def test_exported_tokenizer_gives_our_ids(tmp_path, vocab_size):
    import finetune_glue as fg
    model = Bert(BertConfig(**TINY, vocab_size=vocab_size))
    out = write_export({"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 0}, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc, sp = get_tokenizer(vocab_size)
    assert (tok.mask_token_id, tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (
        sp["mask"], sp["pad"], sp["cls"], sp["sep"])
    assert len(tok) == enc.n_vocab and json.loads((tmp_path / "hf" / "config.json").read_text())["pad_token_id"] == \
        sp["pad"]
    assert {50304: "tiktoken's GPT-2 BPE (50,257 tokens) with [PAD] [CLS] [SEP] [MASK] = 50257-50260, padded to 50,304: ",
            16384: "tiktoken's GPT-2 BPE cut to its first 16,380 tokens (prepare_oscar.py --vocab_size=16384) with [PAD] "
                   "[CLS] [SEP] [MASK] = 16380-16383: "}[vocab_size] in (tmp_path / "hf" / "README.md").read_text()
    texts = ["The cat [MASK] on the mat.", "  leading,  trailing  \n\n", "Ünïcödé — 日本語 \u2028 🤖 \u200b x",
             "a [CLS] b [SEP] c [PAD] d<|endoftext|>e[MASK]", "tabs\tand\r\nCRLF  [MASK]\n[MASK]", "I'll've 1234567 x",
             "def f(x):\n    return x ** 2  # squared, naïvely\n"]
    for text in texts:
        assert tok(text)["input_ids"] == [sp["cls"], *encode_with_specials(text, vocab_size), sp["sep"]], text
    rows = [("A man is playing a guitar.", "Someone plays music — ünïcode.", 0)]  # a GLUE pair, as we encode it
    ours = fg.encode(rows, 128, vocab_size)
    assert ours["pad"] == sp["pad"] and max(ours["tok"][0]) < vocab_size
    theirs = tok(rows[0][0], rows[0][1])
    assert theirs["input_ids"] == ours["tok"][0].tolist()
    assert theirs["token_type_ids"] == [0] * ours["first"][0] + [1] * (ours["len"][0] - ours["first"][0])


@pytest.mark.parametrize("num_labels,labels", [(3, ["entailment", "neutral", "contradiction"]), (1, None)])
def test_exported_classifier_gives_our_logits(tmp_path, num_labels, labels):
    torch.manual_seed(2)
    cfg = BertConfig(**TINY, attention_type="pairwise")
    ours = perturbed(BertClassifier(cfg, num_labels))
    ck = {"model": ours.state_dict(), "model_args": vars(cfg), "task": "mnli" if labels else "stsb",
          "num_labels": num_labels, "labels": labels, "seed": 1}
    out = write_export(ck, tmp_path / "hf")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForSequenceClassification" and hf.config.num_labels == num_labels
    assert hf.config.problem_type == ("regression" if num_labels == 1 else "single_label_classification")
    if labels:
        assert [hf.config.id2label[i] for i in range(3)] == labels
    idx, mask, types = inputs()
    with torch.no_grad():
        a = ours(idx, attention_mask=mask, token_type_ids=types)[0]
        b = hf(input_ids=idx, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_command_line_refuses_and_fill_mask_works(tmp_path):
    def export(*args):
        return run_script("export_hf.py", *args)

    for kw in (dict(attention_type="additive"), dict(attention_type="hybrid"), dict(sub_ln=True)):
        cfg = BertConfig(**TINY, **kw)
        torch.save({"model": Bert(cfg).state_dict(), "model_args": vars(cfg), "iter_num": 0}, tmp_path / "x.pt")
        p = export(f"--init_from={tmp_path / 'x.pt'}", f"--out_dir={tmp_path / 'x'}")
        assert p.returncode == 1 and "has no stock Hugging Face equivalent" in p.stderr and "Traceback" not in p.stderr
        assert not (tmp_path / "x" / "config.json").exists() and not (tmp_path / "x" / "README.md").exists()
    torch.manual_seed(3)
    model = perturbed(Bert(BertConfig(**TINY, attention_type="symmetric")))
    torch.save({"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 9}, tmp_path / "ok.pt")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    p = export(f"--init_from={tmp_path / 'ok.pt'}", f"--out_dir={tmp_path / 'full'}")
    assert p.returncode == 1 and "is not empty" in p.stderr and (tmp_path / "full" / "notes.txt").read_text() == "mine"
    p = export(f"--init_from={tmp_path / 'ok.pt'}", f"--out_dir={tmp_path / 'hf'}")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path / "hf")) == ["README.md", "config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json"]
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"an older export's weights")
    p = export(f"--init_from={tmp_path / 'ok.pt'}", f"--out_dir={tmp_path / 'hf'}", "--overwrite=True")
    assert p.returncode == 0 and not (tmp_path / "hf" / "pytorch_model.bin").exists()  # nothing old left to load
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), top_k=3)
    got = fill("The river [MASK] into the sea.")
    import sample
    found, _ = sample.fill(model, "The river [MASK] into the sea.", 3)
    assert [g["token"] for g in got] == [get_tokenizer()[0].encode_single_token(t.encode()) for t, _ in found[0][1]]
    assert [g["score"] for g in got] == pytest.approx([p for _, p in found[0][1]], rel=1e-4)


def test_a_fine_tuned_classifier_exports_end_to_end(tmp_path):
    """finetune_glue.py --save_models=True, then export_hf.py on what it kept: a stock classifier that scores the
    dev rows as the fine-tuned model does."""
    from test_glue import save_ckpt, synthetic
    synthetic(tmp_path / "glue", 64, 16)
    ckpt = save_ckpt(tmp_path / "ckpt.pt", iter_num=7)
    p = run_script("finetune_glue.py", f"--init_from={ckpt}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte",
                   "--seeds=1", "--epochs=1", "--max_seq_len=32", f"--out_dir={tmp_path / 'ft'}", "--save_models=True")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run_script("export_hf.py", f"--init_from={tmp_path / 'ft' / 'rte_s1.pt'}", f"--out_dir={tmp_path / 'hf'}")
    assert p.returncode == 0 and "BertForSequenceClassification" in p.stdout, p.stderr[-2000:]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "| task | rte (GLUE), fine-tuned with finetune_glue.py, " \
        "seed 1, dropout 0.1 (attention 0.1);" in card and "| pre-training | 7 steps |" in card
    kept = torch.load(tmp_path / "ft" / "rte_s1.pt", weights_only=True)
    assert kept["iter_num"] == 7
    ours = BertClassifier(BertConfig(**kept["model_args"]), 2)
    ours.load_state_dict(kept["model"])
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    batch = tok(["the red dog", "a blue car on the road"], ["red fire", "the night"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours.eval()(batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"])[0]
        b = hf(**batch).logits
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert hf.config.id2label == {0: "entailment", 1: "not_entailment"}


def test_the_model_card_describes_the_export(tmp_path):
    """README.md, as the Hub reads it: metadata, then the operator, size, data, steps, eval loss and MLM accuracy from
    the checkpoint, how it was exported and what it cannot do; an older checkpoint's accuracy comes from its run's
    log.jsonl."""
    torch.manual_seed(0)
    cfg = BertConfig(**TINY, attention_type="pairwise")
    model = Bert(cfg)
    config = {"dataset": "gcide", "batch_size": 8, "gradient_accumulation_steps": 4, "mask_prob": 0.15,
              "learning_rate": 1e-3, "warmup_iters": 60, "decay_lr": False, "max_iters": 3000, "dtype": "float32",
              "seed": 5, "eval_iters": 5}
    ck = {"model": model.state_dict(), "model_args": vars(cfg), "config": config, "iter_num": 1200, "last_eval": 1200,
          "eval_loss": 4.87654, "eval_acc": 0.23456}
    (tmp_path / "run" / "snapshots").mkdir(parents=True)
    torch.save(ck, tmp_path / "run" / "ckpt.pt")
    p = run_script("export_hf.py", f"--init_from={tmp_path / 'run' / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf'}")
    assert p.returncode == 0, p.stderr
    card = (tmp_path / "hf" / "README.md").read_text()
    n = sum(v.numel() for v in model.parameters())
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"))
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    for text in ("| attention operator | `pairwise`: pairwise attention, (x Wq + bq) S_h (y Wq + bq)ᵀ / √d",
                 f"| size | {n:,} parameters", f"the stock layout holds {hf.num_parameters():,}",
                 "2 layers, 2 heads of 16, hidden 32, inner 64, 64 positions",
                 "| data | `gcide`: GCIDE, GNU's dictionary", "blocks of 64 tokens, 15% of each block's tokens masked",
                 "| training | 1,200 steps of 32 sequences (2,457,600 tokens), AdamW at lr 0.001 after 60 warm-up steps, "
                 "then constant; float32, seed 5 |",
                 "| eval loss | 4.8765 at step 1,200 (cross-entropy at the masked positions, nats, on the run's 40 "
                 "held-out blocks) |", "| MLM accuracy | 0.2346 at step 1,200",
                 f"--init_from={tmp_path / 'run' / 'ckpt.pt'} --out_dir={tmp_path / 'hf'}",
                 "an `additive` or `hybrid` model (HybridBERT), or one with sub-layer LayerNorms, has no stock Hugging "
                 "Face equivalent and export_hf.py refuses it", "tiktoken's GPT-2 BPE (50,257 tokens)",
                 "not bert-base-uncased's WordPiece", "It reads at most 64 tokens"):
        assert text in card, text
    # a checkpoint from before the card: its accuracy is read from the run's log, at the checkpoint's last eval
    del ck["eval_acc"]
    ck["last_eval"] = 1100
    torch.save(ck, tmp_path / "run" / "snapshots" / "ckpt_0001200.pt")
    with open(tmp_path / "run" / "log.jsonl", "w") as f:
        for step, acc in ((1100, 0.2222), (1200, 0.2345)):
            f.write(json.dumps({"type": "eval", "step": step, "loss": 4.9, "accuracy": acc}) + "\n")
    files = export_hf.export(torch.load(tmp_path / "run" / "snapshots" / "ckpt_0001200.pt", weights_only=True),
                             str(tmp_path / "hf2"), str(tmp_path / "run" / "snapshots" / "ckpt_0001200.pt"))
    card = write_export_files(files, tmp_path / "hf2")
    assert "| eval loss | 4.8765 at step 1,100" in card and "| MLM accuracy | 0.2222 at step 1,100" in card
    files = export_hf.export({k: v for k, v in ck.items() if k not in ("config",)}, str(tmp_path / "hf3"))
    card = write_export_files(files, tmp_path / "hf3")  # the bare minimum: nothing invented
    assert "| training | 1,200 steps (the checkpoint holds no training settings) |" in card
    assert "| MLM accuracy | not recorded |" in card


def write_export_files(files, out):
    os.makedirs(out)
    for name, data in files.items():
        atomic_write(os.path.join(out, name), lambda f, d=data: f.write(d))
    return (out / "README.md").read_text()


def test_a_damaged_checkpoint_or_folder_and_a_full_disk_leave_every_file_as_it_was(tmp_path, monkeypatch):
    """#72's battery: a checkpoint whose settings the card cannot describe (mask_prob "0.15") or a classifier whose
    labels are no list of its labels was a traceback after the weights were written; a user's folder named README.md
    was a traceback once the old export was half removed; --overwrite on a full disk removed the old export first and
    left neither."""
    import resource
    model = Bert(BertConfig(**TINY))
    good = {"model": model.state_dict(), "model_args": vars(model.config), "iter_num": 3}
    cls = BertClassifier(BertConfig(**TINY), 2)
    cases = {"mask_prob.pt": ({**good, "config": {"dataset": "builtin", "mask_prob": "0.15"}}, "holds settings it "
                                                                                              "cannot describe"),
             "labels.pt": ({"model": cls.state_dict(), "model_args": vars(cls.config), "iter_num": 3, "num_labels": 2,
                            "labels": ["yes", "no", "maybe"], "task": "rte"}, "are not a list of its 2 labels")}
    for name, (ck, says) in cases.items():
        torch.save(ck, tmp_path / name)
        monkeypatch.setattr(export_hf, "init_from", str(tmp_path / name))
        monkeypatch.setattr(export_hf, "out_dir", str(tmp_path / name[:-3]))
        with pytest.raises(SystemExit, match=says):
            export_hf.main()
        assert not (tmp_path / name[:-3]).exists()  # refused before anything was written
    torch.save(good, tmp_path / "good.pt")
    monkeypatch.setattr(export_hf, "init_from", str(tmp_path / "good.pt"))
    monkeypatch.setattr(export_hf, "out_dir", str(tmp_path / "hf"))
    export_hf.main()
    old = {n: (tmp_path / "hf" / n).read_bytes() for n in os.listdir(tmp_path / "hf")}
    monkeypatch.setattr(export_hf, "overwrite", True)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, hard))  # the new weights do not fit: a full disk
    try:
        with pytest.raises(SystemExit, match="cannot write .*: the old export is as it was"):
            export_hf.main()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert {n: (tmp_path / "hf" / n).read_bytes() for n in os.listdir(tmp_path / "hf") if n != ".lock"} == old
    os.remove(tmp_path / "hf" / "README.md")
    (tmp_path / "hf" / "README.md").mkdir()  # a user's folder where the card goes
    with pytest.raises(SystemExit, match="README.md is not a file"):
        export_hf.main()
    assert (tmp_path / "hf" / "README.md").is_dir() and (tmp_path / "hf" / "config.json").read_bytes() == \
        old["config.json"]

"""
Export a checkpoint to a stock Hugging Face model folder: no custom code, no trust_remote_code.

    python export_hf.py --init_from=out/base_pair/ckpt.pt --out_dir=hf/base_pair          # BertForMaskedLM
    python export_hf.py --init_from=out-glue/base_pair/sst2_s1.pt --out_dir=hf/sst2_pair  # a fine-tuned classifier
                                                                          # (finetune_glue.py --save_models=True)
then, with transformers installed, offline:
    AutoModelForMaskedLM.from_pretrained('hf/base_pair'), AutoTokenizer.from_pretrained('hf/base_pair')

All three paper operators are ordinary BERT attention in disguise, so the exported model predicts exactly what
it predicts here. Per head h, with q = x Wq + bq:
    symmetric  q q^T                       -> a stock layer whose key projection is a copy of the query's
    pairwise   q S_h q^T = (x Wq S_h + bq S_h)(x Wq + bq)^T
                                           -> key = the query projection; query' = (Wq S_h, bq S_h) per head
additive / hybrid / sub-LN models have no stock equivalent and are refused. Writes config.json, the weights
(model.safetensors when safetensors is installed, else pytorch_model.bin), and tokenizer.json +
tokenizer_config.json reproducing this project's ids: GPT-2's BPE, [PAD] [CLS] [SEP] [MASK] = 50257..50260 (a model of
a smaller vocabulary, prepare_oscar.py --vocab_size: its first merges alone, the specials right after them),
and [CLS] a [SEP] (b [SEP]) around the text, with token types, as prepare_oscar.py and finetune_glue.py build
their inputs, and README.md, the model card: what the model is, how it was trained and exported, its eval loss and
MLM accuracy, and what it cannot do. Needs only torch (transformers is needed to load the result).
"""
if __name__ == "__main__":  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import io
import json
import os
from functools import lru_cache

import torch

from lib.checkpoint import load_checkpoint
from configurator import oneline
from lib.files import locked, stage, staged
from lib.step import linear_schedule
from lib.tokenizer import GPT2_PAT_STR, N_GPT2, VOCAB_SIZE, get_tokenizer
from model import BertConfig

# -----------------------------------------------------------------------------
init_from = ''  # a train.py checkpoint (ckpt.pt or a snapshot) or a finetune_glue.py --save_models classifier
out_dir = ''  # the folder to write
overwrite = False  # replace a non-empty out_dir
# -----------------------------------------------------------------------------


def hf_config(cfg, **extra):
    return {"architectures": extra.pop("architectures"), "model_type": "bert", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.n_inner, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": cfg.attn_dropout(), "max_position_embeddings": cfg.block_size,
            "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": 1e-12, "initializer_range": 0.02,
            "pad_token_id": get_tokenizer(cfg.vocab_size)[1]["pad"], "position_embedding_type": "absolute",
            "tie_word_embeddings": True, **extra}


def hf_weights(cfg, sd):
    """This project's encoder state dict -> Hugging Face BertModel names ('bert.' prefix), every operator
    written as stock attention."""
    if cfg.attention_type not in ("original", "symmetric", "pairwise") or cfg.sub_ln:
        raise SystemExit(f"export_hf: a {cfg.attention_type}{' + sub-LN' if cfg.sub_ln else ''} model has no stock "
                         "Hugging Face equivalent; only original, symmetric and pairwise models can be exported")
    d = cfg.n_embd // cfg.n_head
    out = {"bert.embeddings.word_embeddings.weight": sd["encoder.wte.weight"],
           "bert.embeddings.position_embeddings.weight": sd["encoder.wpe.weight"],
           "bert.embeddings.token_type_embeddings.weight": sd["encoder.wtt.weight"],
           "bert.embeddings.LayerNorm.weight": sd["encoder.ln.weight"],
           "bert.embeddings.LayerNorm.bias": sd["encoder.ln.bias"]}
    for l in range(cfg.n_layer):
        p, h = f"encoder.layers.{l}.", f"bert.encoder.layer.{l}."
        wq, bq = sd[p + "attn.query.weight"], sd[p + "attn.query.bias"]  # (C, C) as nn.Linear: q = x wq^T + bq
        wk, bk = (sd[p + "attn.key.weight"], sd[p + "attn.key.bias"]) if cfg.attention_type == "original" else (wq, bq)
        if cfg.attention_type == "pairwise":  # per head: q S = x (wq_h^T S_h) + bq_h S_h, i.e. weight S_h^T wq_h
            S = sd[p + "attn.S"].to(torch.float64)  # (n_head, d, d), in float64: the product is the only rounding
            wq = torch.einsum("hde,hdc->hec", S, wq.double().view(cfg.n_head, d, -1)).reshape_as(wq).to(wq.dtype)
            bq = torch.einsum("hde,hd->he", S, bq.double().view(cfg.n_head, d)).reshape_as(bq).to(bq.dtype)
        gain = sd[p + "attn.score_gain"].item() if p + "attn.score_gain" in sd else cfg.score_scale  # heat treatment:
        if gain != 1.0:  # the multiplier at the checkpoint's step; folded into the query: HF scores are q k^T / sqrt(d)
            wq, bq = wq * gain, bq * gain
        names = {"attention.self.query": (wq, bq), "attention.self.key": (wk, bk),
                 "attention.self.value": p + "attn.value", "attention.output.dense": p + "attn.out",
                 "attention.output.LayerNorm": p + "ln_attn", "intermediate.dense": p + "fc",
                 "output.dense": p + "proj", "output.LayerNorm": p + "ln_mlp"}
        for name, src in names.items():
            w, b = src if isinstance(src, tuple) else (sd[src + ".weight"], sd[src + ".bias"])
            out[f"{h}{name}.weight"], out[f"{h}{name}.bias"] = w, b
    return out


def bytes_to_unicode():
    """GPT-2's reversible map of the 256 bytes to printable characters (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(extra)}


@lru_cache(maxsize=2)
def tokenizer_json(vocab_size=VOCAB_SIZE):
    """tokenizer.json for Hugging Face `tokenizers`: this project's BPE of vocab_size ids (tiktoken's ranks: each
    token's merge is recovered by merging its bytes with the lower ranks only), its split pattern, its special
    tokens."""
    enc, special = get_tokenizer(vocab_size)
    ranks = enc._mergeable_ranks
    u = bytes_to_unicode()
    show = lambda b: "".join(u[x] for x in b)
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:  # merge the lowest-ranked pair until two parts remain
            i = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], float("inf")))
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges.append(f"{show(parts[0])} {show(parts[1])}")
    added = [{"id": i, "content": t} for t, i in enc._special_tokens.items()]  # <|endoftext|>, then [PAD].. [MASK]
    added = [{**a, "single_word": False, "lstrip": a["content"] == "[MASK]", "rstrip": False, "normalized": False,
              "special": True} for a in added]  # lstrip: as tokenizer.encode_with_specials, " [MASK]" = "[MASK]"
    tok = lambda name, type_id: {"SpecialToken": {"id": name, "type_id": type_id}}
    seq = lambda name, type_id: {"Sequence": {"id": name, "type_id": type_id}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [  # tiktoken's own pattern, then bytes -> alphabet
            {"type": "Split", "pattern": {"Regex": GPT2_PAT_STR}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0)],
                           "pair": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0), seq("B", 1), tok("[SEP]", 1)],
                           "special_tokens": {t: {"id": t, "ids": [special[t.strip("[]").lower()]], "tokens": [t]}
                                              for t in ("[CLS]", "[SEP]")}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {show(t): r for t, r in ranks.items()}, "merges": merges}}


OPERATORS = {
    "original": "the original BERT operator, softmax((x Wq + bq)(y Wk + bk)ᵀ / √d)",
    "symmetric": "symmetric attention, (x Wq + bq)(y Wq + bq)ᵀ / √d: the key projection is the query's (exported as a "
                 "stock layer whose key projection is a copy of the query's)",
    "pairwise": "pairwise attention, (x Wq + bq) S_h (y Wq + bq)ᵀ / √d with a d x d matrix S_h per head (exported as a "
                "stock layer: key = the query projection, query = the query projection times S_h)"}
CORPORA = {"builtin": "the built-in corpus: ~645k tokens of Python's own docstrings (a smoke test, not a pre-training "
                      "corpus)",
           "gcide": "GCIDE, GNU's dictionary (16.3M tokens)",
           "prose": "running prose: State of the Union addresses and 18 Project Gutenberg books (5.3M tokens)",
           "oscar": "OSCAR-2301 English with the paper's Appendix A filters"}
REPO = "symmetric-bert"


def eval_accuracy(ck, source):
    """The MLM accuracy of the checkpoint's last eval: in the checkpoint (runs since the model card), else in the
    log.jsonl of the run it came from (out_dir/ckpt.pt or out_dir/snapshots/ckpt_N.pt); None if neither has it."""
    if ck.get("eval_acc") is not None or not source:
        return ck.get("eval_acc")
    folder = os.path.dirname(os.path.abspath(source))
    for log in (os.path.join(folder, "log.jsonl"), os.path.join(os.path.dirname(folder), "log.jsonl")):
        try:
            with open(log) as f:
                found = [r["accuracy"] for r in map(json.loads, f)
                         if r.get("type") == "eval" and r.get("step") == ck.get("last_eval")]
            if found:
                return found[-1]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return None


def share(x):
    """A fraction as a percentage, a small one not rounded to 0.0%."""
    return f"{x:.1%}" if x >= 0.001 or not x else f"{100 * x:.1g}%"


def schedule(c, step, spent):
    """The learning rate as the run had it (lib/step.py): by steps, or under a budget (max_minutes) by the fraction of
    it spent, which ends the decay where the budget ran out, not at max_iters."""
    lr, warmup, total, minutes = c.get("learning_rate", "?"), c.get("warmup_iters", 0), c.get("max_iters", 0), \
        c.get("max_minutes", 0)
    decay = c.get("decay_lr", True)
    if not minutes:
        if not step:
            return "none: no optimizer step was taken, so these are the seed's initial weights"
        planned = f"AdamW at lr {lr} after {warmup} warm-up steps, " + (
            f"then linear decay to 0 at step {total:,}" if decay else "then constant")
        if (step >= total or not decay) and step >= warmup or not isinstance(lr, (int, float)):  # as planned
            return planned
        now = linear_schedule(step - 1, lr, warmup, total, decay)  # its last step's (lib/step.py counts from 0)
        return planned + (f", but it ended at step {step:,}, its last at lr {now:.3g}, "
                          + ("within the warm-up" if step < warmup else "before the schedule's end"))
    ran_out = spent >= 60 * minutes
    end = (f"then linear decay to 0, reached as the budget ran out at step {step:,}" if ran_out else
           f"then linear decay to 0 as the budget runs out (or at step {total:,}, if sooner)") if decay else \
        "then constant" + (f" until the budget ran out at step {step:,}" if ran_out else "")
    return (f"AdamW at lr {lr} on a budget of {minutes:g} minutes of training steps, its schedule following the "
            f"fraction of the budget spent (or of {total:,} steps, if further): warm-up over the first "
            f"{share(warmup / max(total, 1))}, {end}")


def schedules(ck, c, step):
    """The schedules the weights followed, in words: the run's config's alone, or (a run resumed on another schedule,
    e.g. a higher max_iters, where the lr went back up) each over the steps it ran, as the checkpoint records them."""
    whole = lambda p: isinstance(p, (list, tuple)) and len(p) == 2 and type(p[0]) is int and isinstance(p[1], dict)
    past = [p for p in ck.get("schedules") or [] if whole(p) and p[0] < step]
    if len(past) < 2:
        return schedule(c, step, ck.get("spent", 0.0))
    parts = []
    for i, (start, settings) in enumerate(past):
        last = i + 1 == len(past)
        end, s = step if last else past[i + 1][0], {**c, **{k: v for k, v in settings.items() if v is not None}}
        by_steps = not s.get("max_minutes") and all(type(s.get(k)) in (int, float) for k in
                                                     ("learning_rate", "warmup_iters", "max_iters"))
        lr = by_steps and linear_schedule(start, s["learning_rate"], s["warmup_iters"], s["max_iters"],
                                          s.get("decay_lr", True))
        again = "" if not start else f" (resumed on another schedule, at lr {lr:.3g})" if by_steps else \
            " (resumed on another schedule)"
        parts.append(f"steps {start:,} to {end:,}{again}: {schedule(s, end, ck.get('spent', 0.0) if last else 0.0)}")
    return "; ".join(parts)


def model_card(ck, weights, source=None, out=None):
    """README.md of the exported folder, as the Hugging Face Hub reads it: YAML metadata, then what the model is, how
    it was trained (from the checkpoint's own settings), its last eval, how it was exported and what it cannot do."""
    cfg, c = BertConfig(**ck["model_args"]), ck.get("config") or {}
    classifier = "num_labels" in ck
    ours, stock = sum(v.numel() for v in ck["model"].values()), sum(v.numel() for v in weights.values())
    embed = sum(ck["model"][k].numel() for k in ("encoder.wte.weight", "encoder.wpe.weight", "encoder.wtt.weight"))
    name = os.path.basename(os.path.normpath(out or "model"))
    step = ck.get("iter_num", 0)
    rows = [("attention operator", f"`{cfg.attention_type}`: {OPERATORS[cfg.attention_type]}"),
            ("size", f"{ours:,} parameters ({embed:,} of them the embeddings; the stock layout holds {stock:,}); "
                     f"{cfg.n_layer} layers, {cfg.n_head} heads of {cfg.n_embd // cfg.n_head}, hidden {cfg.n_embd}, "
                     f"inner {cfg.n_inner}, {cfg.block_size} positions, post-LayerNorm")]
    if cfg.score_scale != 1.0:
        anneal = f", annealed to 1 by step {cfg.score_scale_warmup} (heat treatment)" if cfg.score_scale_warmup else ""
        rows.append(("score multiplier", f"{cfg.score_scale:g}{anneal}; the multiplier at this step is folded into the "
                                         "query projection"))
    if classifier:
        dev = ck.get("dev")
        rows += [("task", f"{ck.get('task', 'a classification task')} (GLUE), fine-tuned with finetune_glue.py, seed "
                          f"{ck.get('seed', '?')}, dropout {cfg.dropout:g} (attention {cfg.attn_dropout():g}); labels "
                          f"{', '.join(map(str, ck.get('labels') or [])) or 'a score'}" + (
                              f"; peak lr {pr.get('learning_rate')}, {pr.get('epochs')} epochs, batch "
                              f"{pr.get('batch_size')}" if isinstance(pr := ck.get("protocol"), dict) else "")),
                 ("pre-training", f"{step:,} steps"),
                 ("dev score", json.dumps(dev) if dev is not None else "not recorded in the checkpoint")]
    else:
        if c:
            seqs, data = c.get("batch_size", 0) * c.get("gradient_accumulation_steps", 0), c.get("dataset", "?")
            rows += [("data", f"`{data}`: {CORPORA.get(data, 'a prepare_oscar.py dataset')}; blocks of "
                              f"{cfg.block_size} tokens, {c.get('mask_prob', 0.15):.0%} of each block's tokens masked"),
                     ("training", f"{step:,} steps of {seqs} sequences ({step * seqs * cfg.block_size:,} tokens), "
                                  f"{schedules(ck, c, step)}; {c.get('dtype', '?')}, seed "
                                  f"{ck.get('init_seed', c.get('seed', '?'))}"
                                  + (f" (resumed with seed {c['seed']})" if ck.get("init_seed", c.get("seed")) !=
                                     c.get("seed") else ""))]
        else:
            rows.append(("training", f"{step:,} steps (the checkpoint holds no training settings)"))
        loss, acc = ck.get("eval_loss"), eval_accuracy(ck, source)
        at = f" at step {ck.get('last_eval', step):,}"
        held = f"{c['eval_iters'] * c['batch_size']:,} " if c.get("eval_iters") and c.get("batch_size") else ""
        rows += [("eval loss", f"{loss:.4f}{at} (cross-entropy at the masked positions, nats, on the run's {held}"
                               "held-out blocks)" if loss is not None else "not recorded in the checkpoint"),
                 ("MLM accuracy", f"{acc:.4f}{at} (the fraction of masked positions whose top guess is right)"
                                  if acc is not None else "not recorded")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    head = "BertForSequenceClassification" if classifier else "BertForMaskedLM"
    where = out or name
    use = (f'from transformers import pipeline\nclassify = pipeline("text-classification", model="{where}")'
           if classifier else f'from transformers import pipeline\nfill = pipeline("fill-mask", model="{where}")\n'
                              'print(fill("Return the [MASK] of the list."))')
    dtype = str(weights["bert.embeddings.word_embeddings.weight"].dtype).removeprefix("torch.")
    pad = get_tokenizer(cfg.vocab_size)[1]["pad"]  # the ordinary tokens (the BPE's and <|endoftext|>) come before it
    bpe = "tiktoken's GPT-2 BPE (50,257 tokens)" if pad == N_GPT2 else \
        f"tiktoken's GPT-2 BPE cut to its first {pad:,} tokens (prepare_oscar.py --vocab_size={cfg.vocab_size})"
    padded = f", padded to {cfg.vocab_size:,}" if pad + 4 < cfg.vocab_size else ""
    return f"""---
library_name: transformers
pipeline_tag: {"text-classification" if classifier else "fill-mask"}
tags:
- bert
- {cfg.attention_type}-attention
- {REPO}
---

# {name}

A {"fine-tuned " if classifier else ""}BERT ({head}) with the `{cfg.attention_type}` attention operator of *Symmetric \
Dot-Product Attention for Efficient Training of BERT Language Models* (Courtois, Ostendorff, Hennig, Rehm, Findings \
of ACL 2024), {"fine-tuned" if classifier else "pre-trained (masked language modelling)"} with {REPO}'s \
{"finetune_glue.py" if classifier else "train.py"} and exported as a stock Hugging Face model: no custom code, no \
`trust_remote_code`.

| | |
|---|---|
{table}

## How it was exported

`python export_hf.py --init_from={source or "<checkpoint>"} --out_dir={out or "..."}` wrote the checkpoint's \
weights at step {step:,} ({dtype}) in the stock layout: every operator above is ordinary scaled dot-product \
attention with another query and key, so this model computes what the checkpoint computes (the project's tests \
check that its logits equal the checkpoint's to 1e-5 in float32). `tokenizer.json` reproduces the project's token \
ids.

```python
{use}
```

## What it cannot do

- Its vocabulary is {bpe} with [PAD] [CLS] [SEP] [MASK] = {pad}-{pad + 3}{padded}: not bert-base-uncased's \
WordPiece, so it does not share ids with other BERTs, and a [MASK] stands \
for one BPE token (which carries its own leading space). Tokenise with this folder's tokenizer.
- It reads at most {cfg.block_size} tokens, [CLS] and [SEP] included.
- Only the original, symmetric and pairwise operators export: an `additive` or `hybrid` model (HybridBERT), or one \
with sub-layer LayerNorms, has no stock Hugging Face equivalent and export_hf.py refuses it.
- {"It was fine-tuned on one GLUE task and scored on its dev set only." if classifier else
   ("It is untrained (0 steps): its weights are the initialisation, not a pre-trained model." if not step else
    "It has been pre-trained only: not fine-tuned, and not evaluated on any downstream task; the eval loss above is "
    "its one measure.")}
"""


def export(ck, out, source=None):
    """{file name: its bytes} of the Hugging Face folder for a checkpoint dict (read from the file source), made
    whole before anything is written: a checkpoint whose settings do not fit (edited, damaged) is one line."""
    try:
        return {name: make() for name, make in files_of(ck, out, source).items()}
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise SystemExit(f"export_hf: {source or 'the checkpoint'} holds settings it cannot describe ({oneline(e)}): "
                         "edited, or another program's; export another checkpoint")


def files_of(ck, out, source):
    cfg = BertConfig(**ck["model_args"])
    sd = {k: v.detach().to("cpu").contiguous() for k, v in ck["model"].items()}
    weights = hf_weights(cfg, sd)
    if "num_labels" in ck:  # a finetune_glue.py classifier
        n, labels = ck["num_labels"], ck.get("labels")
        if labels is not None and (not isinstance(labels, (list, tuple)) or len(labels) != n):
            raise ValueError(f"its labels {str(labels)[:60]} are not a list of its {n} labels")
        weights.update({"bert.pooler.dense.weight": sd["pooler.weight"], "bert.pooler.dense.bias": sd["pooler.bias"],
                        "classifier.weight": sd["classifier.weight"], "classifier.bias": sd["classifier.bias"]})
        id2label = {str(i): str(l) for i, l in enumerate(labels)} if labels else {"0": ck.get("task", "score")}
        config = hf_config(cfg, architectures=["BertForSequenceClassification"], num_labels=n, id2label=id2label,
                           label2id={v: int(k) for k, v in id2label.items()},
                           problem_type="regression" if n == 1 else "single_label_classification",
                           finetuning_task=ck.get("task"))
    else:
        weights.update({"cls.predictions.transform.dense.weight": sd["head_dense.weight"],
                        "cls.predictions.transform.dense.bias": sd["head_dense.bias"],
                        "cls.predictions.transform.LayerNorm.weight": sd["head_ln.weight"],
                        "cls.predictions.transform.LayerNorm.bias": sd["head_ln.bias"],
                        "cls.predictions.bias": sd["head_bias"]})  # the decoder is tied to the word embeddings
        config = hf_config(cfg, architectures=["BertForMaskedLM"])
    dtype = str(sd["encoder.wte.weight"].dtype).removeprefix("torch.")
    config.update(torch_dtype=dtype, dtype=dtype)  # the name before and since transformers 5
    weights = {k: v.clone() for k, v in weights.items()}  # no shared storage (symmetric's key = query)
    try:
        from safetensors.torch import save as safetensors_bytes
        files = {"model.safetensors": lambda: safetensors_bytes(weights, metadata={"format": "pt"})}
    except ImportError:
        files = {"pytorch_model.bin": lambda: torch_bytes(weights)}
    text = lambda obj: (lambda: json.dumps(obj, indent=1, ensure_ascii=False).encode())
    files["tokenizer.json"] = text(tokenizer_json(cfg.vocab_size))
    files["tokenizer_config.json"] = text({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]})
    files["README.md"] = lambda: model_card(ck, weights, source, out).encode()
    files["config.json"] = text(config)  # last: a folder without it is visibly unfinished
    return files


def torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",  # what loads
            "README.md")  # and the model card


def main():
    if not init_from or not out_dir:
        raise SystemExit("export_hf: set --init_from=<checkpoint> and --out_dir=<folder to write>")
    ck = load_checkpoint(init_from)
    files = export(ck, out_dir, init_from)  # an additive/hybrid/sub-LN model is refused here, before any writing
    with locked(out_dir, "export_hf.py"):
        others = [n for n in os.listdir(out_dir) if n != ".lock"]
        if others and not overwrite:
            raise SystemExit(f"export_hf: {out_dir} is not empty ({', '.join(sorted(others)[:3])}...): pass "
                             "--overwrite=True to replace it, or choose another out_dir")
        if odd := [n for n in HF_FILES if n in others and not os.path.isfile(os.path.join(out_dir, n))]:
            raise SystemExit(f"export_hf: {os.path.join(out_dir, odd[0])} is not a file (a user's folder?): it is "
                             "left as it is, with the rest of the folder; move it away, or choose another out_dir")
        new = {n: staged(os.path.join(out_dir, n)) for n in files}
        try:
            try:  # every new file whole beside the old export, which stays whole until all of them are written
                for name, data in files.items():
                    stage(os.path.join(out_dir, name), lambda f: f.write(data))
            except OSError as e:
                raise SystemExit(f"export_hf: cannot write {out_dir} ({e.strerror or e}): " + (
                    "the old export is as it was" if others else "nothing was exported")) from None
            for name in HF_FILES:  # config.json first: the old export stops counting as finished; then every file
                if name in others:  # transformers would load, so that nothing of the old one is left
                    os.remove(os.path.join(out_dir, name))
            for name in files:  # then the new ones, config.json last
                os.replace(new[name], os.path.join(out_dir, name))
        finally:
            for path in [*new.values(), os.path.join(out_dir, ".lock")]:  # .lock: no part of a model folder
                if os.path.exists(path):
                    os.remove(path)
    kind = "ForSequenceClassification" if "num_labels" in ck else "ForMaskedLM"
    print(f"wrote {out_dir} ({BertConfig(**ck['model_args']).attention_type} attention as a stock Bert{kind}): "
          f"{', '.join(files)}\nload it: transformers.AutoModel{kind}.from_pretrained({out_dir!r}), "
          f"AutoTokenizer.from_pretrained({out_dir!r})")


if __name__ == "__main__":
    from configurator import configure

    configure(globals())
    with interrupt.stops_cleanly("export_hf", "no file was left half-written; a folder without config.json (written "
                                              "last) is unfinished: run the same command with --overwrite=True"):
        main()

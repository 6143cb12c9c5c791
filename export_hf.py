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
tokenizer_config.json reproducing this project's ids: GPT-2's BPE, [PAD] [CLS] [SEP] [MASK] = 50257..50260,
and [CLS] a [SEP] (b [SEP]) around the text, with token types, as prepare_oscar.py and finetune_glue.py build
their inputs. Needs only torch (transformers is needed to load the result).
"""
import json
import os
from functools import lru_cache

import torch

from checkpoint import load_checkpoint
from files import atomic_write, locked
from model import BertConfig
from tokenizer import GPT2_PAT_STR, N_GPT2, SPECIAL_TOKENS, get_tokenizer

# -----------------------------------------------------------------------------
init_from = ''  # a train.py checkpoint (ckpt.pt or a snapshot) or a finetune_glue.py --save_models classifier
out_dir = ''  # the folder to write
overwrite = False  # replace a non-empty out_dir
# -----------------------------------------------------------------------------


def hf_config(cfg, **extra):
    return {"architectures": extra.pop("architectures"), "model_type": "bert", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.n_inner, "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout,
            "attention_probs_dropout_prob": cfg.dropout, "max_position_embeddings": cfg.block_size,
            "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": 1e-12, "initializer_range": 0.02,
            "pad_token_id": N_GPT2, "position_embedding_type": "absolute", "tie_word_embeddings": True, **extra}


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


@lru_cache(maxsize=1)
def tokenizer_json():
    """tokenizer.json for Hugging Face `tokenizers`: this project's BPE (tiktoken's ranks: each token's merge is
    recovered by merging its bytes with the lower ranks only), its split pattern, its special tokens."""
    enc, special = get_tokenizer()
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
    added = [{"id": N_GPT2 - 1, "content": "<|endoftext|>"}] + [
        {"id": N_GPT2 + i, "content": t} for i, t in enumerate(SPECIAL_TOKENS)]
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


def export(ck, out):
    """{file name: bytes writer} of the Hugging Face folder for a checkpoint dict."""
    cfg = BertConfig(**ck["model_args"])
    sd = {k: v.detach().to("cpu").contiguous() for k, v in ck["model"].items()}
    weights = hf_weights(cfg, sd)
    if "num_labels" in ck:  # a finetune_glue.py classifier
        n, labels = ck["num_labels"], ck.get("labels")
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
        files = {"model.safetensors": lambda f: f.write(safetensors_bytes(weights, metadata={"format": "pt"}))}
    except ImportError:
        files = {"pytorch_model.bin": lambda f: torch.save(weights, f)}
    text = lambda obj: (lambda f: f.write(json.dumps(obj, indent=1, ensure_ascii=False).encode()))
    files["tokenizer.json"] = text(tokenizer_json())
    files["tokenizer_config.json"] = text({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]})
    files["config.json"] = text(config)  # last: a folder without it is visibly unfinished
    return files


HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt")  # what loads


def main():
    if not init_from or not out_dir:
        raise SystemExit("export_hf: set --init_from=<checkpoint> and --out_dir=<folder to write>")
    ck = load_checkpoint(init_from)
    files = export(ck, out_dir)  # an additive/hybrid/sub-LN model is refused here, before anything is written
    with locked(out_dir, "export_hf.py"):
        others = [n for n in os.listdir(out_dir) if n != ".lock"]
        if others and not overwrite:
            raise SystemExit(f"export_hf: {out_dir} is not empty ({', '.join(sorted(others)[:3])}...): pass "
                             "--overwrite=True to replace it, or choose another out_dir")
        for name in HF_FILES:  # config.json first: the old export stops counting as finished; then every file
            if name in others:  # transformers would load, so that nothing of the old one is left
                os.remove(os.path.join(out_dir, name))
        for name, write in files.items():  # each file whole or not at all; config.json last
            atomic_write(os.path.join(out_dir, name), write)
        os.remove(os.path.join(out_dir, ".lock"))  # not part of a model folder; removed while still held
    kind = "ForSequenceClassification" if "num_labels" in ck else "ForMaskedLM"
    print(f"wrote {out_dir} ({BertConfig(**ck['model_args']).attention_type} attention as a stock Bert{kind}): "
          f"{', '.join(files)}\nload it: transformers.AutoModel{kind}.from_pretrained({out_dir!r}), "
          f"AutoTokenizer.from_pretrained({out_dir!r})")


if __name__ == "__main__":
    from configurator import configure

    configure(globals())
    main()

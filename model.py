"""
A compact BERT (post-LayerNorm, as in Devlin et al. 2018) with the three compatibility operators of
"Symmetric Dot-Product Attention for Efficient Training of BERT Language Models" (Courtois et al. 2024):

    original   softmax( (x Wq + bq)     (y Wk + bk)^T / sqrt(d) )
    symmetric  softmax( (x Wq + bq)     (y Wq + bq)^T / sqrt(d) )     Q = K: no key projection
    pairwise   softmax( (x Wq + bq) S_h (y Wq + bq)^T / sqrt(d) )     plus one d x d matrix S_h per head

All three are ordinary scaled-dot-product attention with (q, k) = (q, k), (q, q) or (q S_h, q), so they
share one fused kernel. `Bert` is the masked-LM model, `BertClassifier` the GLUE model; both are built
on the same `Encoder`, so a pre-training checkpoint loads into either.

Also, for comparison with HybridBERT (Srinivasagan & Ostermann 2024, code unreleased: a reconstruction):
'additive' (Fastformer additive attention, linear in sequence length), 'hybrid' (layers cycle through
`hybrid_pattern`, by default original / additive alternately) and `sub_ln` (Magneto's sub-layer norms).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

OPERATORS = ("original", "symmetric", "pairwise", "additive")  # what one layer can use
ATTENTION_TYPES = OPERATORS + ("hybrid",)


@dataclass
class BertConfig:
    vocab_size: int = 50304  # tiktoken GPT-2 (50257) + [PAD] [CLS] [SEP] [MASK], padded to a multiple of 64
    block_size: int = 512  # max positions
    type_vocab_size: int = 2
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_inner: int = 3072  # MLP width
    dropout: float = 0.1
    attention_type: str = "original"
    hybrid_pattern: str = "original,additive"  # attention_type='hybrid': layer l uses entry l % len
    sub_ln: bool = False  # extra LayerNorm before the attention output projection and the MLP's 2nd linear

    def __post_init__(self):
        if self.attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention_type must be one of {ATTENTION_TYPES}, got {self.attention_type!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.attention_type == "hybrid" and not set(self.hybrid_pattern.split(",")) <= set(OPERATORS):
            raise ValueError(f"hybrid_pattern must be a comma list of {OPERATORS}, got {self.hybrid_pattern!r}")

    def layer_operators(self):
        if self.attention_type != "hybrid":
            return [self.attention_type] * self.n_layer
        cycle = self.hybrid_pattern.split(",")
        return [cycle[l % len(cycle)] for l in range(self.n_layer)]


def LayerNorm(n):
    return nn.LayerNorm(n, eps=1e-12)  # BERT's eps


def select(x, rows):
    """(B, T, C) -> the (n, C) rows at flat positions `rows`; all of x when rows is None."""
    return x if rows is None else x.reshape(-1, x.size(-1))[rows]


class SelfAttention(nn.Module):
    def __init__(self, cfg, operator):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        d = cfg.n_embd // cfg.n_head
        self.query = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.key = nn.Linear(cfg.n_embd, cfg.n_embd) if operator == "original" else None
        self.value = nn.Linear(cfg.n_embd, cfg.n_embd)
        # pairwise factors, one unconstrained d x d matrix per head, initialised N(0, 1) (see _init_weights)
        self.S = nn.Parameter(torch.empty(cfg.n_head, d, d)) if operator == "pairwise" else None
        self.sub_ln = LayerNorm(cfg.n_embd) if cfg.sub_ln else nn.Identity()
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask=None, rows=None):
        """rows: flat indices into the B*T positions; when given, only those rows are output."""
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, d)
        q = heads(self.query(x))
        k = heads(self.key(x)) if self.key is not None else q  # symmetric and pairwise: K = Q
        if self.S is not None:
            q = torch.einsum("bhtd,hde->bhte", q, self.S)  # pairwise: (q S_h) q^T. Not q @ S: its broadcast
            # backward is ~100x slower on CPU
        y = F.scaled_dot_product_attention(q, k, heads(self.value(x)), attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(self.sub_ln(select(y.transpose(1, 2).reshape(B, T, C), rows)))


class AdditiveAttention(nn.Module):
    """Fastformer (Wu et al. 2021), per head: a global query q_g = sum_i softmax_i(w_q.q_i/sqrt(d)) q_i,
    p_i = q_g * k_i, a global key k_g = sum_i softmax_i(w_k.p_i/sqrt(d)) p_i, u_i = k_g * v_i,
    out_i = W_o u_i + q_i. Padding is left out of both softmaxes. Cost is linear in T."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        d = cfg.n_embd // cfg.n_head
        self.query = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.key = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.value = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.w_q = nn.Parameter(torch.empty(cfg.n_head, d, 1))  # pooling vectors, one per head
        self.w_k = nn.Parameter(torch.empty(cfg.n_head, d, 1))
        self.sub_ln = LayerNorm(cfg.n_embd) if cfg.sub_ln else nn.Identity()
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask=None, rows=None):
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, d)

        def pool(t, w):  # softmax over the real tokens of (w . t_i / sqrt(d)), then sum_i a_i t_i
            scores = (t @ w) / math.sqrt(t.size(-1))  # (B, nh, T, 1)
            if mask is not None:
                scores = scores.masked_fill(~mask.transpose(-1, -2), float("-inf"))
            return (scores.softmax(dim=2) * t).sum(dim=2, keepdim=True)  # (B, nh, 1, d)

        q = self.query(x)
        p = pool(heads(q), self.w_q) * heads(self.key(x))
        u = pool(p, self.w_k) * heads(self.value(x))
        return self.out(self.sub_ln(select(u.transpose(1, 2).reshape(B, T, C), rows))) + select(q, rows)


class Layer(nn.Module):
    """Post-LN encoder layer: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, cfg, operator):
        super().__init__()
        self.attn = AdditiveAttention(cfg) if operator == "additive" else SelfAttention(cfg, operator)
        self.ln_attn = LayerNorm(cfg.n_embd)
        self.fc = nn.Linear(cfg.n_embd, cfg.n_inner)
        self.sub_ln = LayerNorm(cfg.n_inner) if cfg.sub_ln else nn.Identity()
        self.proj = nn.Linear(cfg.n_inner, cfg.n_embd)
        self.ln_mlp = LayerNorm(cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask=None, rows=None):
        x = self.ln_attn(select(x, rows) + self.drop(self.attn(x, mask, rows)))
        return self.ln_mlp(x + self.drop(self.proj(self.sub_ln(F.gelu(self.fc(x))))))


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.n_embd)
        self.ln = LayerNorm(cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Layer(cfg, op) for op in cfg.layer_operators())

    def forward(self, idx, attention_mask=None, token_type_ids=None, rows=None):
        """(B, T, C) hidden states; with rows (flat positions), the (n, C) states of those rows only: the
        last layer then reads keys and values everywhere but computes the rest only there (as MosaicBERT)."""
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        x = self.drop(self.ln(x))
        # padding: a boolean (B, 1, 1, T) mask, True = may attend. None keeps SDPA's fastest kernels.
        mask = attention_mask.bool()[:, None, None, :] if attention_mask is not None else None
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, rows if i == len(self.layers) - 1 else None)
        return x


def _init_weights(module):
    """BERT's init: N(0, 0.02) for linear and embedding weights, zero biases, LayerNorm 1/0; S ~ N(0, 1)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        if isinstance(m, SelfAttention) and m.S is not None:
            nn.init.normal_(m.S, std=1.0)
        if isinstance(m, AdditiveAttention):
            nn.init.normal_(m.w_q, std=0.02)
            nn.init.normal_(m.w_k, std=0.02)


class Bert(nn.Module):
    """BERT for masked-LM pre-training (no pooler); the decoder is tied to the word embedding."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head_dense = nn.Linear(config.n_embd, config.n_embd)
        self.head_ln = LayerNorm(config.n_embd)
        self.head_bias = nn.Parameter(torch.zeros(config.vocab_size))
        _init_weights(self)

    def forward(self, idx, targets=None, attention_mask=None, token_type_ids=None, n_pred=None):
        """targets: (B, T) token ids, -100 where nothing is predicted. With targets the head runs only at
        the predicted positions and logits has one row per computed position. n_pred, when given, is a
        fixed number of positions to compute (>= the number predicted), so that shapes stay static
        under torch.compile; the padding rows it adds carry target -100 and do not count in the loss."""
        if targets is None:
            return self.head(self.encoder(idx, attention_mask, token_type_ids)), None
        targets = targets.reshape(-1)
        if n_pred is None:
            pos = (targets != -100).nonzero().squeeze(1)
        else:  # predicted positions first (stable sort), then padding positions up to n_pred
            pos = torch.argsort((targets == -100).to(torch.int8), stable=True)[:n_pred]
        logits = self.head(self.encoder(idx, attention_mask, token_type_ids, rows=pos))
        return logits, F.cross_entropy(logits.float(), targets[pos], ignore_index=-100)

    def head(self, x):
        x = self.head_ln(F.gelu(self.head_dense(x)))
        return F.linear(x, self.encoder.wte.weight, self.head_bias)

    def configure_optimizers(self, weight_decay, learning_rate, betas, eps, device_type):
        """AdamW; weight decay on tensors with 2+ dims (matmul weights, embeddings, S), none on biases/LN."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = device_type in ("cuda", "cpu")  # one kernel for all parameters (~6x faster step on 2 CPU cores)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)

    def flops_per_token(self, T, pred_frac):
        """Training FLOPs per input token (forward + backward = 3x forward, 2 FLOPs per multiply-add).
        pred_frac = fraction of positions where the MLM head is computed (it runs only there)."""
        cfg = self.config
        enc_matmul = sum(p.numel() for p in self.encoder.layers.parameters()
                         if p.dim() >= 2)  # q, k, v, out, fc, proj weights, S, w_q, w_k
        n_softmax = sum(op != "additive" for op in cfg.layer_operators())  # additive layers have no T x T
        attn = 2 * 2 * n_softmax * T * cfg.n_embd  # q.k scores and probs.v, per token
        last = self.encoder.layers[-1]  # its output projection and MLP run only at the predicted positions
        sparse = sum(m.weight.numel() for m in (last.attn.out, last.fc, last.proj))
        head = self.head_dense.weight.numel() + self.encoder.wte.weight.numel()
        return 3 * (2 * (enc_matmul - (1 - pred_frac) * sparse) + attn + pred_frac * 2 * head)

    def estimate_mfu(self, tokens_per_s, T, pred_frac, peak_flops):
        return self.flops_per_token(T, pred_frac) * tokens_per_s / peak_flops


class BertClassifier(nn.Module):
    """Sequence classification (num_labels > 1, cross-entropy) or regression (num_labels = 1, MSE):
    pooler (dense + tanh on the first token), dropout, linear."""

    def __init__(self, config, num_labels):
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.n_embd, num_labels)
        _init_weights(self)

    @classmethod
    def from_pretrained(cls, config, mlm_state_dict, num_labels):
        """A classifier whose encoder comes from a Bert (MLM) state dict; pooler and classifier are new."""
        model = cls(config, num_labels)
        enc = {k[len("encoder."):]: v for k, v in mlm_state_dict.items() if k.startswith("encoder.")}
        model.encoder.load_state_dict(enc)  # strict: a mismatch is an error, not a silent partial load
        return model

    def forward(self, idx, labels=None, attention_mask=None, token_type_ids=None):
        cls_rows = torch.arange(idx.size(0), device=idx.device) * idx.size(1)  # the first token of each row
        x = self.encoder(idx, attention_mask, token_type_ids, rows=cls_rows)
        logits = self.classifier(self.drop(torch.tanh(self.pooler(x))))
        if labels is None:
            return logits, None
        if self.num_labels == 1:
            return logits, F.mse_loss(logits.squeeze(-1).float(), labels.float())
        return logits, F.cross_entropy(logits.float(), labels)

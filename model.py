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
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

OPERATORS = ("original", "symmetric", "pairwise", "additive")  # what one layer can use
ATTENTION_TYPES = OPERATORS + ("hybrid",)
SDPA_BACKENDS = {"auto": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # set_kernels' sdpa_backend


@dataclass
class BertConfig:
    vocab_size: int = 50304  # tiktoken GPT-2 (50257) + [PAD] [CLS] [SEP] [MASK], padded to a multiple of 64
    block_size: int = 512  # max positions
    type_vocab_size: int = 2
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_inner: int = 3072  # MLP width
    dropout: float = 0.1  # hidden states' dropout, and the attention probabilities' unless attention_dropout is set
    attention_dropout: float = None  # the attention probabilities' dropout; None: the same as dropout (0.1)
    attention_type: str = "original"
    hybrid_pattern: str = "original,additive"  # attention_type='hybrid': layer l uses entry l % len
    sub_ln: bool = False  # extra LayerNorm before the attention output projection and the MLP's 2nd linear
    # initialisation ablations (docs/study.md): neither changes the operator, only where training starts
    s_init_std: float = 1.0  # pairwise: S ~ N(0, s_init_std^2); the paper's is 1.0, 0.02 is the other weights'
    symmetric_init: bool = False  # original: the key weight and bias start as copies of the query's
    # the study's mechanism arms: a fixed multiplier on the scores (original with sqrt(d) starts with pairwise's
    # score spread and keeps its larger gain) and pairwise with S frozen at its initialisation
    score_scale: float = 1.0  # scores = score_scale * q k^T / sqrt(d); 1.0 everywhere in the paper
    freeze_s: bool = False  # pairwise: S is not trained
    # start or step (docs/study.md): wider initial scores without a multiplier, and heat treatment
    qk_init_scale: float = 1.0  # query and key weights start at N(0, (0.02 qk_init_scale)^2): scores x its square
    score_scale_warmup: int = 0  # heat treatment: score_scale anneals to 1 over this many steps (anneal_scores)

    def __post_init__(self):
        if min(self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd, self.n_inner) < 1:
            raise ValueError("vocab_size, block_size, n_layer, n_head, n_embd and n_inner must be >= 1")
        if self.attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention_type must be one of {ATTENTION_TYPES}, got {self.attention_type!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.attention_type == "hybrid" and not set(self.hybrid_pattern.split(",")) <= set(OPERATORS):
            raise ValueError(f"hybrid_pattern must be a comma list of {OPERATORS}, got {self.hybrid_pattern!r}")
        if self.symmetric_init and "original" not in self.layer_operators():
            raise ValueError("symmetric_init copies the query into the key: it needs original attention layers")
        if not self.s_init_std > 0 or not self.score_scale > 0 or not self.qk_init_scale > 0:
            raise ValueError(f"s_init_std, score_scale and qk_init_scale must be > 0, got {self.s_init_std}, "
                             f"{self.score_scale}, {self.qk_init_scale}")
        if self.attention_dropout is not None and not 0 <= self.attention_dropout < 1:
            raise ValueError(f"attention_dropout must be in [0, 1) or None, got {self.attention_dropout}")
        if self.score_scale_warmup < 0:
            raise ValueError(f"score_scale_warmup must be >= 0, got {self.score_scale_warmup}")
        if self.freeze_s and "pairwise" not in self.layer_operators():
            raise ValueError("freeze_s freezes the pairwise S: it needs pairwise attention layers")

    def layer_operators(self):
        if self.attention_type != "hybrid":
            return [self.attention_type] * self.n_layer
        cycle = self.hybrid_pattern.split(",")
        return [cycle[l % len(cycle)] for l in range(self.n_layer)]

    def attn_dropout(self):
        return self.dropout if self.attention_dropout is None else self.attention_dropout


def LayerNorm(n):
    return nn.LayerNorm(n, eps=1e-12)  # BERT's eps


def select(x, rows):
    """(B, T, C) -> the (n, C) rows at flat positions `rows`; all of x when rows is None."""
    return x if rows is None else x.reshape(-1, x.size(-1))[rows]


class SelfAttention(nn.Module):
    def __init__(self, cfg, operator):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.attn_dropout()
        self.fused_qkv, self.sdpa_backends = False, None  # how it computes, not what (set_kernels)
        d = cfg.n_embd // cfg.n_head
        self.query = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.key = nn.Linear(cfg.n_embd, cfg.n_embd) if operator == "original" else None
        self.value = nn.Linear(cfg.n_embd, cfg.n_embd)
        # pairwise factors, one unconstrained d x d matrix per head, initialised N(0, 1) (see _init_weights)
        self.S = nn.Parameter(torch.empty(cfg.n_head, d, d), requires_grad=not cfg.freeze_s) \
            if operator == "pairwise" else None
        annealed = cfg.score_scale_warmup > 0  # heat treatment: a multiplier that changes as training goes
        self.scale = (1.0 if annealed else cfg.score_scale) / math.sqrt(d)  # a constant one is SDPA's scale
        # a tensor (not a float) so that torch.compile keeps one graph while Bert.anneal_scores changes it
        self.register_buffer("score_gain", torch.tensor(float(cfg.score_scale)) if annealed else None)
        self.sub_ln = LayerNorm(cfg.n_embd) if cfg.sub_ln else nn.Identity()
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.s_init_std, self.symmetric_init = cfg.s_init_std, cfg.symmetric_init and operator == "original"
        self.qk_init_scale = cfg.qk_init_scale

    def heads(self, t):  # (B, T, C) -> (B, nh, T, d)
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def projections(self, x):
        """(x Wq + bq, x Wk + bk or None without a key projection, x Wv + bv), each (B, T, C). With fused_qkv, one
        matmul against the projections' weights concatenated in the forward (the parameters, checkpoints and the
        export stay as they are; under torch.compile the concatenation fuses into the weights' cast)."""
        if not self.fused_qkv:
            return self.query(x), self.key(x) if self.key is not None else None, self.value(x)
        projs = [p for p in (self.query, self.key, self.value) if p is not None]
        out = F.linear(x, torch.cat([p.weight for p in projs]), torch.cat([p.bias for p in projs]))
        parts = out.split(x.size(-1), dim=-1)
        return parts if self.key is not None else (parts[0], None, parts[1])

    def qk(self, x, projected=None):
        """The operator as ordinary attention: (q, k) per head with scores = q k^T * self.scale. projected: x's
        (query, key) projections, if already computed."""
        q, k = projected or self.projections(x)[:2]
        q = self.heads(q)
        k = self.heads(k) if k is not None else q  # symmetric and pairwise: K = Q
        if self.S is not None:
            q = torch.einsum("bhtd,hde->bhte", q, self.S)  # pairwise: (q S_h) q^T. Not q @ S: its broadcast
            # backward is ~100x slower on CPU
        if self.score_gain is not None:
            q = q * self.score_gain
        return q, k

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.projections(x)
        pinned = self.sdpa_backends and (x.is_cuda or self.sdpa_backends == [SDPBackend.MATH])  # else no-op (CPU)
        with sdpa_kernel(self.sdpa_backends) if pinned else nullcontext():
            y = F.scaled_dot_product_attention(*self.qk(x, (q, k)), self.heads(v), attn_mask=mask,
                                               dropout_p=self.dropout if self.training else 0.0, scale=self.scale)
        return self.out(self.sub_ln(y.transpose(1, 2).reshape(B, T, C)))

    def scores(self, x, mask=None):
        """[(B, nh, T, T) scores before the softmax], for diagnostics (the fused kernel never forms them)."""
        q, k = self.qk(x)
        return [q @ k.transpose(-1, -2) * self.scale]


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

    def attend(self, x, mask=None):
        """(u, q, [s_alpha, s_beta]): u_i = k_g * v_i and q_i per head, and the scores of the two pooling
        softmaxes (B, nh, T, 1), before masking."""
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, d)

        def weights(scores):  # softmax over the real tokens
            if mask is not None:
                scores = scores.masked_fill(~mask.transpose(-1, -2), float("-inf"))
            return scores.softmax(dim=2)

        score = lambda t, w: (t @ w) / math.sqrt(t.size(-1))  # w . t_i / sqrt(d), (B, nh, T, 1)
        q = self.query(x)
        s_alpha = score(heads(q), self.w_q)
        p = (weights(s_alpha) * heads(q)).sum(dim=2, keepdim=True) * heads(self.key(x))  # q_g * k_i
        s_beta = score(p, self.w_k)
        u = (weights(s_beta) * p).sum(dim=2, keepdim=True) * heads(self.value(x))  # k_g * v_i
        return u, q, [s_alpha, s_beta]

    def forward(self, x, mask=None):
        B, T, C = x.shape
        u, q, _ = self.attend(x, mask)
        return self.out(self.sub_ln(u.transpose(1, 2).reshape(B, T, C))) + q

    def scores(self, x, mask=None):
        """The two pooling softmaxes' scores as (B, nh, 1, T): one distribution over the tokens per head."""
        return [s.transpose(-1, -2) for s in self.attend(x, mask)[2]]


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
        """rows (flat indices into the B*T positions): the output only there. Attention still reads every
        position; the residual, LayerNorms and MLP then run on those rows alone (the last layer under the MLM
        and GLUE heads, as MosaicBERT does)."""
        x = self.ln_attn(select(x, rows) + self.drop(select(self.attn(x, mask), rows)))  # (B, T, C) -> (n, C) rows
        return self.ln_mlp(x + self.drop(self.proj(self.sub_ln(F.gelu(self.fc(x))))))  # (B, T, C), or (n, C)


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
        x, mask = self.embed(idx, token_type_ids), padding_mask(attention_mask)
        for i, layer in enumerate(self.layers):  # x: (B, T, C) through every layer; the last one, given rows: (n, C)
            x = layer(x, mask, rows if i == len(self.layers) - 1 else None)
        return x

    def embed(self, idx, token_type_ids=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        return self.drop(self.ln(x))


def padding_mask(attention_mask):
    """A boolean (B, 1, 1, T) mask, True = may attend; None (no padding) keeps SDPA's fastest kernels."""
    return attention_mask.bool()[:, None, None, :] if attention_mask is not None else None


def attention_entropy(p, real):
    """Mean entropy of attention distributions p (B, nh, n_queries, T), each divided by log(number of real
    keys) of its sequence (real: (B, T) bool): 1.0 = uniform over the real tokens, 0.0 = one-hot."""
    n = real.sum(1).clamp(min=2).to(p.dtype)  # one real key has no uncertainty to speak of: log(2) is the floor
    return (-torch.xlogy(p, p).sum(-1) / n.log()[:, None, None]).mean()


def row_std(scores, real):
    """Mean over the rows of scores (B, nh, n_queries, T) of their standard deviation over the real keys."""
    w = real[:, None, None, :].to(scores.dtype).expand_as(scores)
    mean = (scores * w).sum(-1) / w.sum(-1)
    return (((scores - mean[..., None]) ** 2 * w).sum(-1) / w.sum(-1)).sqrt().mean()


@torch.no_grad()
def diagnostics(encoder, idx, attention_mask=None):
    """What a loss plateau looks like (Gopalani & Hu 2025): per layer, the mean normalised attention entropy of
    its input (1.0 = uniform; an additive layer: the mean over its two pooling softmaxes) and the spread of its
    scores before the softmax (`score_std`: the standard deviation over the keys, averaged over the queries);
    and representation collapse: the mean cosine similarity between the final hidden states of different
    positions of a sequence (1.0 = all parallel). `probe` (not for the log): each layer's scores on the first
    sequence's first 128 positions, to measure how fast the scores move between two calls. Eager and explicit:
    call it on one batch, in eval mode."""
    real = attention_mask.bool() if attention_mask is not None else torch.ones_like(idx, dtype=torch.bool)
    x, mask = encoder.embed(idx), padding_mask(attention_mask)
    entropy, spread, probe = [], [], []
    for layer in encoder.layers:
        scores = [s.float() for s in layer.attn.scores(x, mask)]
        probs = [(s.masked_fill(~mask, float("-inf")) if mask is not None else s).softmax(-1) for s in scores]
        entropy.append(sum(attention_entropy(p, real).item() for p in probs) / len(probs))
        spread.append(sum(row_std(s, real).item() for s in scores) / len(scores))
        probe.append(torch.cat([s[0, :, :128, :128].reshape(-1) for s in scores]).cpu())
        x = layer(x, mask)
    h = F.normalize(x.float(), dim=-1)
    pairs = real[:, :, None] & real[:, None, :] & ~torch.eye(idx.size(1), dtype=torch.bool, device=idx.device)
    return {"attn_entropy": entropy, "score_std": spread, "collapse": (h @ h.transpose(1, 2))[pairs].mean().item(),
            "probe": probe}


def score_change(probe, before, steps):
    """Per layer, the root-mean-square change of the probe's scores (diagnostics) per step, over `steps` steps."""
    return [((a - b).pow(2).mean().sqrt() / steps).item() for a, b in zip(probe, before)]


def mlm_loss(logits, targets):
    """F.cross_entropy(logits.float(), targets, ignore_index=-100), written as logsumexp(logits) - the target's logit,
    each computed in float32 (whatever the logits' dtype) from the logits as they are (bf16 under autocast), so that no
    float32 copy of the (n, vocab) logits need be written. Compiled, inductor already fuses cross_entropy's upcast into
    its kernels: in the CPU code it generates for a bf16 step, neither form writes a float32 (n, vocab) buffer, and
    both write the same two bf16 ones (the logits and their gradient). Eager, both copy. A lever to measure on a GPU
    (docs/performance.md), not a known gain."""
    valid = targets != -100
    x = logits.float()
    onehot = torch.arange(x.size(-1), device=x.device) == targets[:, None]  # a -100 matches no column
    picked = torch.where(onehot, x, 0.0).sum(-1)  # not gather: its backward scatters into a zeroed (n, vocab) buffer
    return ((torch.logsumexp(x, dim=-1) - picked) * valid).sum() / valid.sum()


def set_kernels(model, fused_qkv=False, sdpa_backend="auto", fused_loss=False):
    """How a Bert or BertClassifier computes, never what (a training run may change them on a resume; checkpoints
    and the Hugging Face export do not see them): fused_qkv, one matmul for the query, key and value projections
    (SelfAttention.projections); sdpa_backend, the attention kernel on a GPU ('auto' lets PyTorch choose; 'cudnn',
    'flash', 'efficient' or 'math' insists on one, and an input it cannot take is an error; on other devices only
    'math' is applied, the rest are 'auto'); fused_loss, the MLM loss without a float32 copy of the logits
    (mlm_loss). Returns the model."""
    if sdpa_backend not in SDPA_BACKENDS:
        raise ValueError(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {sdpa_backend!r}")
    for m in model.modules():
        if isinstance(m, SelfAttention):
            m.fused_qkv = bool(fused_qkv)
            m.sdpa_backends = [SDPA_BACKENDS[sdpa_backend]] if SDPA_BACKENDS[sdpa_backend] is not None else None
        if isinstance(m, Bert):
            m.fused_loss = bool(fused_loss)
    return model


def _init_weights(module):
    """BERT's init: N(0, 0.02) for linear and embedding weights, zero biases, LayerNorm 1/0; S ~ N(0, 1) (or
    N(0, s_init_std^2)); query and key weights x qk_init_scale (the same draws, scaled); with symmetric_init, each
    original layer's key starts equal to its query."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        if isinstance(m, AdditiveAttention):
            nn.init.normal_(m.w_q, std=0.02)
            nn.init.normal_(m.w_k, std=0.02)
    for m in module.modules():  # after the linears above: the key copies an initialised query
        if isinstance(m, SelfAttention) and m.S is not None:
            nn.init.normal_(m.S, std=m.s_init_std)
        if isinstance(m, SelfAttention) and m.qk_init_scale != 1.0:
            with torch.no_grad():
                for proj in (m.query, m.key):
                    if proj is not None:
                        proj.weight.mul_(m.qk_init_scale)
        if isinstance(m, SelfAttention) and m.symmetric_init:
            m.key.load_state_dict(m.query.state_dict())  # copied values, not shared tensors: both train freely


class Bert(nn.Module):
    """BERT for masked-LM pre-training (no pooler); the decoder is tied to the word embedding."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head_dense = nn.Linear(config.n_embd, config.n_embd)
        self.head_ln = LayerNorm(config.n_embd)
        self.head_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.fused_loss = False  # how the loss is computed, not what (set_kernels)
        _init_weights(self)

    def forward(self, idx, targets=None, pos=None, attention_mask=None, token_type_ids=None):
        """targets: (B, T) token ids, -100 where nothing is predicted. With targets the head runs only at the
        predicted positions and logits has one row per computed position: at pos (flat indices into B*T, as
        dataloader.mask_tokens returns them: a fixed number, so that shapes stay static under torch.compile; a
        position there whose target is -100 does not count), else at every position with a target."""
        if targets is None:  # (B, T, vocab)
            return self.head(self.encoder(idx, attention_mask, token_type_ids)), None
        targets = targets.reshape(-1)
        pos = (targets != -100).nonzero().squeeze(1) if pos is None else pos
        logits = self.head(self.encoder(idx, attention_mask, token_type_ids, rows=pos))  # (n, vocab), n = len(pos)
        # detached: every output of a compiled graph gets a gradient, and the logits' would be a zero tensor the size
        # of the head (608 x 50304 floats at the study's shape: a tenth of its step), written and read for nothing
        loss = mlm_loss(logits, targets[pos]) if self.fused_loss else \
            F.cross_entropy(logits.float(), targets[pos], ignore_index=-100)
        return logits.detach(), loss

    def head(self, x):
        x = self.head_ln(F.gelu(self.head_dense(x)))
        return F.linear(x, self.encoder.wte.weight, self.head_bias)

    def configure_optimizers(self, weight_decay, learning_rate, betas, eps, device_type, qk_lr_scale=1.0):
        """AdamW; weight decay on tensors with 2+ dims (matmul weights, embeddings, S), none on biases/LN. With
        qk_lr_scale, the query and key projections have their own groups: learning rate x qk_lr_scale (each
        group's lr_scale, which the schedule applies) and weight decay / qk_lr_scale, so that the decay per step
        (lr x weight_decay under AdamW) is the same as everywhere else."""
        qk = {id(p) for m in self.modules() if isinstance(m, SelfAttention) and qk_lr_scale != 1.0
              for proj in (m.query, m.key) if proj is not None for p in proj.parameters()}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = []
        for scale, ps in ((1.0, [p for p in params if id(p) not in qk]),
                          (qk_lr_scale, [p for p in params if id(p) in qk])):
            groups += [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": weight_decay / scale,
                        "lr": learning_rate * scale, "lr_scale": scale},
                       {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0, "lr": learning_rate * scale,
                        "lr_scale": scale}] if ps else []
        fused = device_type in ("cuda", "cpu")  # one kernel for all parameters instead of a loop over them
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)

    def anneal_scores(self, step):
        """Heat treatment (Hoffmann et al. 2024): the scores' multiplier at `step` goes from score_scale at step 0 to
        1 at step score_scale_warmup by a half-cosine, and stays 1 (the plain operator). Nothing without a warmup."""
        n, c = self.config.score_scale_warmup, self.config.score_scale
        if n:
            gain = 1.0 + (c - 1.0) * 0.5 * (1.0 + math.cos(math.pi * step / n)) if step < n else 1.0
            for m in self.modules():
                if isinstance(m, SelfAttention):
                    m.score_gain.fill_(gain)

    def diagnostics(self, idx, since=None):
        """diagnostics() of the encoder on one batch (eval mode, eager); with since = (steps, probe) of an earlier
        call, also how fast the scores moved since (score_change, per step)."""
        diag = diagnostics(self.encoder, idx)
        if since is not None:
            diag["score_change"] = score_change(diag["probe"], since[1], since[0])
        return diag

    def flops_per_token(self, T, pred_frac):
        """Training FLOPs per input token (forward + backward = 3x forward, 2 FLOPs per multiply-add).
        pred_frac = fraction of positions where the MLM head is computed (it runs only there)."""
        cfg = self.config
        enc_matmul = sum(p.numel() for p in self.encoder.layers.parameters()
                         if p.dim() >= 2)  # q, k, v, out, fc, proj weights, S, w_q, w_k
        n_softmax = sum(op != "additive" for op in cfg.layer_operators())  # additive layers have no T x T
        attn = 2 * 2 * n_softmax * T * cfg.n_embd  # q.k scores and probs.v, per token
        last = self.encoder.layers[-1]  # its MLP runs only at the predicted positions
        sparse = sum(m.weight.numel() for m in (last.fc, last.proj))
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

    configure_optimizers = Bert.configure_optimizers  # the same AdamW, no weight decay on biases and LayerNorms

    def forward(self, idx, labels=None, attention_mask=None, token_type_ids=None):
        cls_rows = torch.arange(idx.size(0), device=idx.device) * idx.size(1)  # the first token of each row
        x = self.encoder(idx, attention_mask, token_type_ids, rows=cls_rows)  # (B, C): the [CLS] states alone
        logits = self.classifier(self.drop(torch.tanh(self.pooler(x))))
        if labels is None:
            return logits, None
        if self.num_labels == 1:
            return logits, F.mse_loss(logits.squeeze(-1).float(), labels.float())
        return logits, F.cross_entropy(logits.float(), labels)

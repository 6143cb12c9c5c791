import math

import pytest
import torch
import torch.nn.functional as F

from model import ATTENTION_TYPES, Bert, BertClassifier, BertConfig

TINY = dict(vocab_size=97, block_size=32, type_vocab_size=2, n_layer=2, n_head=4, n_embd=32, n_inner=64)


def tiny(attention_type, **kw):
    torch.manual_seed(0)
    return Bert(BertConfig(**{**TINY, "attention_type": attention_type, **kw}))


# ---- Table 2 of the paper: exact parameter counts -----------------------------------------------------
TABLE2 = {("small", "original"): 28_795_194, ("small", "symmetric"): 27_744_570, ("small", "pairwise"): 27_875_642,
          ("base", "original"): 109_514_298, ("base", "symmetric"): 102_427_194, ("base", "pairwise"): 103_017_018}
SHAPES = {"small": dict(n_layer=4, n_head=8, n_embd=512, n_inner=2048),
          "base": dict(n_layer=12, n_head=12, n_embd=768, n_inner=3072)}


@pytest.mark.parametrize("size,attention_type", list(TABLE2))
def test_parameter_count_matches_table2(size, attention_type):
    cfg = BertConfig(vocab_size=30522, block_size=512, type_vocab_size=2, attention_type=attention_type,
                     **SHAPES[size])
    with torch.device("meta"):  # no memory, no init: counting only
        model = Bert(cfg)
    assert sum(p.numel() for p in model.parameters()) == TABLE2[(size, attention_type)]


# ---- Plain float64 re-implementation of the paper's equations ---------------------------------------
def ref_layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-12) * w + b


def ref_additive(x, sd, p, d, n_head, real):
    """Fastformer additive attention (Wu et al. 2021, as model.py's docstring gives it) for one sequence, token by
    token."""
    Q, K, V = (x @ sd[f"{p}attn.{n}.weight"].T + sd[f"{p}attn.{n}.bias"] for n in ("query", "key", "value"))
    U = torch.zeros_like(Q)
    for h in range(n_head):
        sl = slice(h * d, (h + 1) * d)
        w_q, w_k = sd[p + "attn.w_q"][h, :, 0], sd[p + "attn.w_k"][h, :, 0]
        alpha = torch.softmax(torch.tensor([(w_q @ Q[i, sl]) / math.sqrt(d) if real[i] else -math.inf
                                            for i in range(len(x))], dtype=x.dtype), 0)
        q_g = sum(alpha[i] * Q[i, sl] for i in range(len(x)))
        P = [q_g * K[i, sl] for i in range(len(x))]
        beta = torch.softmax(torch.tensor([(w_k @ P[i]) / math.sqrt(d) if real[i] else -math.inf
                                           for i in range(len(x))], dtype=x.dtype), 0)
        k_g = sum(beta[i] * P[i] for i in range(len(x)))
        for i in range(len(x)):
            U[i, sl] = k_g * V[i, sl]
    return U, Q


def ref_encoder(sd, cfg, idx, attention_mask=None):
    """Post-LN BERT written from the equations, one head and one sequence at a time, with the
    compatibility operators (1) Q K^T, (3) Q Q^T and (6) Q S Q^T, or additive attention, in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    lin = lambda x, name: x @ sd[name + ".weight"].T + sd[name + ".bias"]
    gelu = lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    B, T = idx.shape
    d = cfg.n_embd // cfg.n_head
    x = sd["encoder.wte.weight"][idx] + sd["encoder.wpe.weight"][:T] + sd["encoder.wtt.weight"][0]
    x = ref_layer_norm(x, sd["encoder.ln.weight"], sd["encoder.ln.bias"])
    sub_ln = lambda x, name: ref_layer_norm(x, sd[name + ".weight"], sd[name + ".bias"]) if cfg.sub_ln else x
    pattern = cfg.hybrid_pattern.split(",") if cfg.attention_type == "hybrid" else [cfg.attention_type]
    for l in range(cfg.n_layer):
        p, op = f"encoder.layers.{l}.", pattern[l % len(pattern)]
        out = torch.zeros_like(x)
        for b in range(B):
            real = attention_mask[b] != 0 if attention_mask is not None else torch.ones(T, dtype=torch.bool)
            if op == "additive":
                U, Q = ref_additive(x[b], sd, p, d, cfg.n_head, real)
                out[b] = lin(sub_ln(U, p + "attn.sub_ln"), p + "attn.out") + Q
                continue
            Q, V = lin(x[b], p + "attn.query"), lin(x[b], p + "attn.value")
            K = lin(x[b], p + "attn.key") if op == "original" else None
            heads = []
            for h in range(cfg.n_head):
                q, v = Q[:, h * d:(h + 1) * d], V[:, h * d:(h + 1) * d]
                if op == "original":
                    A = q @ K[:, h * d:(h + 1) * d].T  # (1)
                elif op == "symmetric":
                    A = q @ q.T  # (3)
                else:
                    A = q @ sd[p + "attn.S"][h] @ q.T  # (6)
                A = (A * cfg.score_scale / math.sqrt(d)).masked_fill(~real[None, :], float("-inf"))
                heads.append(torch.softmax(A, dim=-1) @ v)
            out[b] = lin(sub_ln(torch.cat(heads, dim=-1), p + "attn.sub_ln"), p + "attn.out")
        x = ref_layer_norm(x + out, sd[p + "ln_attn.weight"], sd[p + "ln_attn.bias"])
        m = lin(sub_ln(gelu(lin(x, p + "fc")), p + "sub_ln"), p + "proj")
        x = ref_layer_norm(x + m, sd[p + "ln_mlp.weight"], sd[p + "ln_mlp.bias"])
    return x


def perturb_(model):
    """Random non-trivial biases and LayerNorm params so that the comparison exercises them too."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
@pytest.mark.parametrize("sub_ln", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_encoder_matches_float64_equations(attention_type, sub_ln, dtype, tol):
    model = tiny(attention_type, sub_ln=sub_ln, hybrid_pattern="pairwise,additive").eval()
    perturb_(model)
    idx = torch.randint(0, 97, (2, 11))
    ref = ref_encoder(model.state_dict(), model.config, idx)
    with torch.no_grad():
        got = model.to(dtype).encoder(idx)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("attention_type", ["original", "symmetric", "pairwise"])
def test_score_scale_multiplies_the_scores(attention_type):
    model = tiny(attention_type, score_scale=3.0).eval()
    perturb_(model)
    idx = torch.randint(0, 97, (2, 11))
    ref = ref_encoder(model.state_dict(), model.config, idx)
    with torch.no_grad():
        got = model.double().encoder(idx)
    torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)
    plain = ref_encoder(model.state_dict(), BertConfig(**{**vars(model.config), "score_scale": 1.0}), idx)
    assert (plain - got).abs().max() > 1e-5  # the multiplier changes the output (far beyond the 1e-9 match)


def test_pairwise_orientation_matters():
    # S is unconstrained (not symmetric), so q S q^T and q S^T q^T differ: the float64 comparison above
    # therefore pins the orientation of equation (6), not just its symmetric part
    attn = tiny("pairwise").eval().encoder.layers[0].attn
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        attn.value.weight.mul_(50)  # make the outputs large enough to compare
        attn.query.weight.mul_(10)  # and the scores far from uniform, where S and S^T cannot look alike
        before = attn(x)
        attn.S.copy_(attn.S.transpose(-1, -2).clone())
        after = attn(x)
    assert (before - after).abs().max() > 0.1 * before.abs().max()


def test_init_S_standard_normal_linears_002():
    model = Bert(BertConfig(n_layer=2, n_head=12, n_embd=768, n_inner=3072, attention_type="pairwise"))
    S = model.encoder.layers[0].attn.S
    assert S.shape == (12, 64, 64)
    assert abs(S.std().item() - 1.0) < 0.02 and abs(S.mean().item()) < 0.02
    W = model.encoder.layers[0].attn.query.weight
    assert abs(W.std().item() - 0.02) < 0.001
    assert model.encoder.layers[0].attn.query.bias.abs().max() == 0
    assert model.encoder.layers[0].attn.key is None  # Q = K: no key projection


# ---- Relations between the operators ----------------------------------------------------------------
def test_pairwise_with_identity_S_equals_symmetric():
    sym, pair = tiny("symmetric").eval(), tiny("pairwise").eval()
    perturb_(sym)
    missing, unexpected = pair.load_state_dict(sym.state_dict(), strict=False)
    assert all(k.endswith("attn.S") for k in missing) and not unexpected
    with torch.no_grad():
        for layer in pair.encoder.layers:
            layer.attn.S.copy_(torch.eye(layer.attn.S.shape[-1]).expand_as(layer.attn.S))
    idx = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        assert torch.equal(pair(idx)[0], sym(idx)[0])


def test_original_with_key_copied_from_query_equals_symmetric():
    sym, orig = tiny("symmetric").eval(), tiny("original").eval()
    perturb_(sym)
    sd = dict(sym.state_dict())
    for l in range(sym.config.n_layer):
        for t in ("weight", "bias"):
            sd[f"encoder.layers.{l}.attn.key.{t}"] = sd[f"encoder.layers.{l}.attn.query.{t}"]
    orig.load_state_dict(sd)  # strict: every key of original is covered
    idx = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        assert torch.equal(orig(idx)[0], sym(idx)[0])


# ---- Padding and gradients --------------------------------------------------------------------------
@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_padding_is_invisible(attention_type):
    model = tiny(attention_type).eval()
    idx = torch.randint(0, 97, (2, 10))
    types = torch.randint(0, 2, (2, 10))
    with torch.no_grad():
        plain = model(idx, token_type_ids=types)[0]
        padded = torch.cat([idx, torch.zeros(2, 6, dtype=torch.long)], 1)
        mask = torch.cat([torch.ones(2, 10), torch.zeros(2, 6)], 1).long()
        out = model(padded, attention_mask=mask, token_type_ids=torch.cat([types, types[:, :6]], 1))[0]
        # the masked path against the float64 reference too (a padded position in the middle of row 1)
        mask2 = torch.ones(2, 10, dtype=torch.long)
        mask2[1, 4] = 0
        ref = ref_encoder(model.state_dict(), model.config, idx, mask2)
        got = model.encoder(idx, attention_mask=mask2)
    torch.testing.assert_close(out[:, :10], plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_gradients_reach_every_parameter(attention_type):
    model = tiny(attention_type)
    idx = torch.randint(0, 97, (2, 12))
    targets = torch.where(torch.rand(2, 12) < 0.5, idx, -100)
    targets[0, 0] = idx[0, 0]
    _, loss = model(idx, targets, token_type_ids=torch.randint(0, 2, (2, 12)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ---- MLM head only at predicted positions ------------------------------------------------------------
@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_sparse_head_loss_equals_full_logits_loss(attention_type):
    model = tiny(attention_type).eval()
    idx = torch.randint(0, 97, (3, 16))
    targets = torch.where(torch.rand(3, 16) < 0.2, torch.randint(0, 97, (3, 16)), -100)
    targets[0, 5] = 3
    n = int((targets != -100).sum())
    with torch.no_grad():
        full, none = model(idx)
        assert none is None and full.shape == (3, 16, 97)
        expected = F.cross_entropy(full.view(-1, 97), targets.view(-1), ignore_index=-100)
        logits, loss = model(idx, targets)
        assert logits.shape == (n, 97)
        torch.testing.assert_close(loss, expected)
        predicted = (targets.view(-1) != -100).nonzero().squeeze(1)
        extra = torch.tensor([i for i in range(48) if i not in predicted][:7])  # 7 rows that predict nothing
        pos = torch.cat([predicted, extra])[torch.randperm(n + 7)]  # a fixed count, in any order
        logits, loss_static = model(idx, targets, pos)
        assert logits.shape == (n + 7, 97)
        torch.testing.assert_close(loss_static, expected)
        torch.testing.assert_close(logits, full.view(-1, 97)[pos], atol=1e-5, rtol=1e-5)  # row i is pos[i]


# ---- Bad configuration ---------------------------------------------------------------------------------
def test_bad_config_fails_at_construction():
    with pytest.raises(ValueError, match="attention_type must be one of"):
        BertConfig(attention_type="asymmetric")
    with pytest.raises(ValueError, match="divisible by n_head"):
        BertConfig(n_embd=100, n_head=12)


# ---- GLUE head, optimizer, FLOPs -------------------------------------------------------------------------
@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("attention_type", ["pairwise", "hybrid"])
def test_classifier_loads_pretrained_encoder(num_labels, attention_type):
    mlm = tiny(attention_type, sub_ln=attention_type == "hybrid").eval()
    clf = BertClassifier.from_pretrained(mlm.config, mlm.state_dict(), num_labels).eval()
    idx = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(clf.encoder(idx), mlm.encoder(idx))
        labels = torch.tensor([0.5, 2.0]) if num_labels == 1 else torch.tensor([0, 2])
        logits, loss = clf(idx, labels)
    assert logits.shape == (2, num_labels)
    expected = (F.mse_loss(logits.squeeze(-1), labels) if num_labels == 1 else F.cross_entropy(logits, labels))
    torch.testing.assert_close(loss, expected)
    with pytest.raises(RuntimeError):  # another operator's weights do not load silently
        BertClassifier.from_pretrained(tiny("original").config, mlm.state_dict(), num_labels)


def test_optimizer_decays_matrices_only():
    model = tiny("pairwise")
    opt = model.configure_optimizers(0.01, 1e-4, (0.9, 0.999), 1e-12, "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert any(p is model.encoder.layers[0].attn.S for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_flops_per_token_counts_operator_and_head_differences():
    C, L, H, T, V = 32, 2, 4, 16, 97
    f = {a: tiny(a).flops_per_token(T, 0.15) for a in ATTENTION_TYPES}
    assert f["original"] - f["symmetric"] == pytest.approx(6 * L * C * C)  # the key projection
    assert f["pairwise"] - f["symmetric"] == pytest.approx(6 * L * H * (C // H) ** 2)  # q S_h
    m = tiny("original")  # the head, and the last layer's MLP, scale with pred_frac
    I = m.config.n_inner
    assert m.flops_per_token(T, 1.0) - m.flops_per_token(T, 0.0) == pytest.approx(
        6 * (C * C + V * C) + 6 * (2 * C * I))


# ---- HybridBERT reconstruction: additive attention, hybrid layouts, sub-LN ------------------------------
@pytest.mark.parametrize("attention_type,pattern", [("additive", ""), ("hybrid", "original,additive"),
                                                    ("hybrid", "pairwise,additive,additive")])
@pytest.mark.parametrize("sub_ln", [False, True])
def test_parameter_count_formula_new_types(attention_type, pattern, sub_ln):
    V, P, Ty, L, H, C, I = 1000, 64, 2, 6, 4, 32, 96
    d = C // H
    attn = {"original": 4 * (C * C + C), "pairwise": 3 * (C * C + C) + H * d * d,
            "additive": 4 * (C * C + C) + 2 * C}  # q, k, v, out projections + the pooling vectors w_q, w_k
    ops = pattern.split(",") if pattern else [attention_type]
    layers = sum(attn[ops[l % len(ops)]] + 2 * C + (C * I + I) + (I * C + C) + 2 * C
                 + (2 * C + 2 * I if sub_ln else 0) for l in range(L))
    expected = (V * C + P * C + Ty * C + 2 * C) + layers + (C * C + C + 2 * C + V)
    cfg = BertConfig(vocab_size=V, block_size=P, type_vocab_size=Ty, n_layer=L, n_head=H, n_embd=C, n_inner=I,
                     attention_type=attention_type, hybrid_pattern=pattern or "original,additive", sub_ln=sub_ln)
    assert sum(p.numel() for p in Bert(cfg).parameters()) == expected


def test_hybrid_layout_and_bad_pattern():
    model = tiny("hybrid", n_layer=4)
    kinds = [type(layer.attn).__name__ for layer in model.encoder.layers]
    assert kinds == ["SelfAttention", "AdditiveAttention"] * 2  # layer 0 standard, then alternating
    assert model.encoder.layers[0].attn.key is not None  # the standard layers use the original operator
    with pytest.raises(ValueError, match="hybrid_pattern must be"):
        BertConfig(attention_type="hybrid", hybrid_pattern="original,linear")


def test_additive_attention_flops_have_no_quadratic_term():
    m = tiny("additive")
    assert m.flops_per_token(4096, 0.15) == m.flops_per_token(16, 0.15)
    h = tiny("hybrid")  # one softmax layer of two
    o = tiny("original")
    assert (h.flops_per_token(1024, 0) - h.flops_per_token(16, 0)) * 2 == pytest.approx(
        o.flops_per_token(1024, 0) - o.flops_per_token(16, 0))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_last_layer_on_selected_rows_equals_full_encoder(attention_type):
    model = tiny(attention_type).eval()
    idx = torch.randint(0, 97, (3, 14))
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[2, 9:] = 0
    rows = torch.tensor([0, 5, 14, 20, 27, 30])
    with torch.no_grad():
        full = model.encoder(idx, mask).reshape(-1, 32)[rows]
        part = model.encoder(idx, mask, rows=rows)
    assert part.shape == (6, 32)
    torch.testing.assert_close(part, full, atol=1e-5, rtol=1e-5)


# ---- Plateau diagnostics and the initialisation ablations ---------------------------------------------
def test_attention_entropy_uniform_one_hot_and_padding():
    from model import attention_entropy

    real = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])  # row 0: 2 padding positions
    uniform = real[:, None, None, :].float().expand(2, 3, 8, 8) / real.sum(1)[:, None, None, None]
    assert attention_entropy(uniform, real).item() == pytest.approx(1.0, abs=1e-6)
    one_hot = torch.zeros(2, 3, 8, 8)
    one_hot[..., 2] = 1.0
    assert attention_entropy(one_hot, real).item() == pytest.approx(0.0, abs=1e-7)
    half = torch.zeros(2, 1, 1, 8)  # two of n keys at 1/2: log 2 / log n
    half[..., :2] = 0.5
    assert attention_entropy(half, real).item() == pytest.approx((math.log(2) / math.log(6) + math.log(2) / math.log(8)) / 2)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_diagnostics_uniform_attention_and_collapse(attention_type):
    from model import diagnostics

    model = tiny(attention_type, hybrid_pattern="pairwise,additive").eval()
    idx = torch.randint(0, 97, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    d = diagnostics(model.encoder, idx, mask)
    assert len(d["attn_entropy"]) == 2 and all(0.0 < e <= 1.0 + 1e-6 for e in d["attn_entropy"])
    assert -1.0 <= d["collapse"] < 0.999
    with torch.no_grad():  # constant scores: every softmax uniform over the real tokens
        for layer in model.encoder.layers:
            for proj in (layer.attn.query, layer.attn.key):
                if proj is not None:  # symmetric and pairwise have no key
                    proj.weight.zero_()
                    proj.bias.zero_()
        model.encoder.layers[-1].ln_mlp.weight.zero_()  # every final hidden state = the LayerNorm bias
        model.encoder.layers[-1].ln_mlp.bias.copy_(torch.randn(32))
    d = diagnostics(model.encoder, idx, mask)
    assert d["attn_entropy"] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert d["score_std"] == pytest.approx([0.0, 0.0], abs=1e-6)  # constant scores have no spread
    assert d["collapse"] == pytest.approx(1.0, abs=1e-5)


def test_score_spread_and_how_fast_the_scores_move():
    from model import diagnostics, row_std, score_change

    real = torch.tensor([[True, True, True, False]])
    scores = torch.tensor([[[[1.0, 3.0, 5.0, 100.0]]]])  # the padding key does not count: the std of 1, 3, 5
    assert row_std(scores, real).item() == pytest.approx(math.sqrt(8 / 3))
    model = tiny("original").eval()
    idx = torch.randint(0, 97, (2, 12))
    d = diagnostics(model.encoder, idx)
    probe = d["probe"]
    assert [p.shape for p in probe] == [torch.Size([4 * 12 * 12])] * 2  # the first sequence, every head
    assert score_change(probe, probe, 25) == [0.0, 0.0]
    assert score_change([p + 2.5 for p in probe], probe, 25) == pytest.approx([0.1, 0.1])  # 2.5 over 25 steps
    attn = model.encoder.layers[0].attn
    q, k = attn.qk(model.encoder.embed(idx))
    ref = (q @ k.transpose(-1, -2) * attn.scale).std(-1, unbiased=False).mean().item()
    assert d["score_std"][0] == pytest.approx(ref, rel=1e-5)  # the first layer sees the embeddings


def test_s_init_std_sets_the_scale_of_S():
    for std in (1.0, 0.02):
        S = Bert(BertConfig(n_layer=1, n_head=12, n_embd=768, n_inner=8, attention_type="pairwise",
                            s_init_std=std)).encoder.layers[0].attn.S
        assert S.std().item() == pytest.approx(std, rel=0.02)
    with pytest.raises(ValueError, match="s_init_std"):
        BertConfig(attention_type="pairwise", s_init_std=0.0)


def test_symmetric_init_copies_query_into_key_then_trains_freely():
    model = tiny("original", symmetric_init=True)
    perturb_(model)  # query bias != 0 from here; re-run the init to check the bias is copied too
    from model import _init_weights
    with torch.no_grad():
        model.encoder.layers[0].attn.query.bias.normal_()
    _init_weights(model)  # zeroes biases, re-draws weights, then copies
    for layer in model.encoder.layers:
        assert torch.equal(layer.attn.key.weight, layer.attn.query.weight)
        assert torch.equal(layer.attn.key.bias, layer.attn.query.bias)
        assert layer.attn.key.weight.data_ptr() != layer.attn.query.weight.data_ptr()  # copies, not shared
    assert not torch.equal(tiny("original").encoder.layers[0].attn.key.weight,
                           tiny("original").encoder.layers[0].attn.query.weight)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 97, (4, 12))
    model(idx, torch.where(torch.rand(4, 12) < 0.3, idx, -100))[1].backward()
    opt.step()
    attn = model.encoder.layers[0].attn
    assert not torch.equal(attn.key.weight, attn.query.weight)  # the key follows its own gradient
    with pytest.raises(ValueError, match="symmetric_init"):
        BertConfig(attention_type="pairwise", symmetric_init=True)
    BertConfig(attention_type="hybrid", symmetric_init=True)  # has original layers: fine


def initial_score_std(**kw):
    """The spread of the attention scores (before softmax) of the first layer at initialisation, at the study's
    shape (2 heads of d = 64), on LayerNormed random embeddings as the first layer sees them."""
    torch.manual_seed(0)
    model = Bert(BertConfig(n_layer=1, n_head=2, n_embd=128, n_inner=16, **kw)).eval()
    x = model.encoder.embed(torch.randint(0, 50000, (8, 64)))
    attn = model.encoder.layers[0].attn
    q, k = attn.qk(x)
    return (q @ k.transpose(-1, -2) * attn.scale).std().item()


def test_score_scale_sqrt_d_gives_original_pairwise_initial_score_spread():
    pairwise, original = initial_score_std(attention_type="pairwise"), initial_score_std(attention_type="original")
    matched = initial_score_std(attention_type="original", score_scale=8.0)  # sqrt(d), d = 64
    assert 6 < pairwise / original < 11  # S ~ N(0, 1) starts the scores ~sqrt(d) wider
    assert 0.8 < matched / pairwise < 1.25
    assert 0.8 < initial_score_std(attention_type="pairwise", s_init_std=0.02) / original / 8 / 0.02 < 1.25
    with pytest.raises(ValueError, match="score_scale"):
        BertConfig(score_scale=0.0)


def test_freeze_s_keeps_S_at_its_initialisation_and_trains_the_rest():
    model = tiny("pairwise", freeze_s=True)
    S0 = [layer.attn.S.detach().clone() for layer in model.encoder.layers]
    assert S0[0].std().item() == pytest.approx(1.0, rel=0.2)  # frozen at the paper's N(0, 1)
    q0 = model.encoder.layers[0].attn.query.weight.detach().clone()
    opt = model.configure_optimizers(0.01, 1e-2, (0.9, 0.999), 1e-8, "cpu")
    assert all(p.requires_grad for g in opt.param_groups for p in g["params"])
    idx = torch.randint(0, 97, (4, 12))
    for _ in range(2):
        model(idx, torch.where(torch.rand(4, 12) < 0.3, idx, -100))[1].backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(layer.attn.S, s) for layer, s in zip(model.encoder.layers, S0))
    assert not torch.equal(model.encoder.layers[0].attn.query.weight, q0)
    assert "encoder.layers.0.attn.S" in model.state_dict()  # a checkpoint still holds it
    trained = tiny("pairwise")
    trained.configure_optimizers(0.01, 1e-2, (0.9, 0.999), 1e-8, "cpu")
    assert trained.encoder.layers[0].attn.S.requires_grad
    with pytest.raises(ValueError, match="freeze_s"):
        BertConfig(attention_type="original", freeze_s=True)


# ---- start or step: wide init without a multiplier, the Q/K learning rate, heat treatment --------------------
def test_qk_init_scale_widens_the_initial_scores_by_its_square():
    original = initial_score_std(attention_type="original")
    assert 0.9 < initial_score_std(attention_type="original", qk_init_scale=8 ** 0.5) / original / 8 < 1.1
    torch.manual_seed(0)
    plain = Bert(BertConfig(**TINY))
    torch.manual_seed(0)
    wide = Bert(BertConfig(**TINY, qk_init_scale=3.0))  # the same draws, scaled: nothing else moves
    for (name, a), b in zip(plain.state_dict().items(), wide.state_dict().values()):
        scaled = name.endswith(("attn.query.weight", "attn.key.weight"))
        assert torch.equal(a * 3.0 if scaled else a, b), name
    with pytest.raises(ValueError, match="qk_init_scale"):
        BertConfig(qk_init_scale=0.0)


def test_qk_lr_scale_gives_query_and_key_their_own_step_and_the_same_decay():
    from lib.step import schedule
    model = tiny("original")
    opt = model.configure_optimizers(0.01, 1e-3, (0.9, 0.999), 1e-12, "cpu", qk_lr_scale=8.0)
    qk = {id(p) for l in model.encoder.layers for m in (l.attn.query, l.attn.key) for p in m.parameters()}
    for g in opt.param_groups:
        is_qk = {id(p) in qk for p in g["params"]}
        assert len(is_qk) == 1  # a group is all query/key or none
        assert g["lr_scale"] == (8.0 if is_qk.pop() else 1.0)
        assert g["lr"] * g["weight_decay"] in (pytest.approx(1e-3 * 0.01), 0.0)  # AdamW's decay per step: the same
    assert schedule(opt, 5, 2e-3, 0, 10, decay=False) == 2e-3  # after the warm-up, held
    assert sorted({g["lr"] for g in opt.param_groups}) == pytest.approx([2e-3, 1.6e-2])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 97, (4, 12))
    model(idx, torch.where(torch.rand(4, 12) < 0.3, idx, -100))[1].backward()
    opt.step()
    step = lambda n: (model.get_parameter(n) - before[n]).abs().max().item()  # Adam's first step: ~lr per entry
    assert step("encoder.layers.0.attn.query.weight") == pytest.approx(1.6e-2, rel=0.01)
    assert step("encoder.layers.0.attn.value.weight") == pytest.approx(2e-3, rel=0.01)
    groups = tiny("original").configure_optimizers(0.01, 1e-3, (0.9, 0.999), 1e-12, "cpu")
    assert len(groups.param_groups) == 2  # no scale: the two usual groups


def test_heat_treatment_anneals_the_multiplier_to_exactly_one():
    model = tiny("original", score_scale=8.0, score_scale_warmup=10).eval()
    gains = []
    for step in (0, 5, 9, 10, 11, 1000):
        model.anneal_scores(step)
        gains.append(model.encoder.layers[0].attn.score_gain.item())
    assert gains[0] == 8.0 and gains[1] == pytest.approx(4.5) and 1.0 < gains[2] < 1.2  # half-cosine: 8, 4.5 midway
    assert gains[3:] == [1.0, 1.0, 1.0]  # exactly 1 from step 10 on
    perturb_(model)
    idx = torch.randint(0, 97, (2, 11))
    plain = Bert(BertConfig(**{**vars(model.config), "score_scale": 1.0, "score_scale_warmup": 0})).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "score_gain" not in k})
    with torch.no_grad():
        assert torch.equal(model.encoder(idx), plain.encoder(idx))  # after the anneal: the plain original
        model.anneal_scores(5)
        ref = ref_encoder(model.state_dict(), BertConfig(**{**vars(model.config), "score_scale": 4.5}), idx)
        torch.testing.assert_close(model.double().encoder(idx), ref, atol=1e-9, rtol=1e-9)
    assert "encoder.layers.0.attn.score_gain" in model.state_dict()  # a checkpoint holds the multiplier it is at
    tiny("original").anneal_scores(3)  # no warmup: nothing to do
    with pytest.raises(ValueError, match="score_scale_warmup"):
        BertConfig(score_scale_warmup=-1)


def test_heat_treatment_compiles_once():
    """The multiplier is a tensor: torch.compile keeps one graph while it changes, and follows its value."""
    torch._dynamo.reset()
    model = tiny("original", score_scale=8.0, score_scale_warmup=4).eval()
    compiled = torch.compile(model.encoder, backend="eager")
    idx = torch.randint(0, 97, (2, 11))
    frames = torch._dynamo.utils.counters["frames"]
    before = frames["ok"]
    with torch.no_grad():
        for step in range(6):
            model.anneal_scores(step)
            torch.testing.assert_close(compiled(idx), model.encoder(idx))
    assert frames["ok"] - before == 1, dict(frames)  # one compiled frame: no recompilation per value


# ---- How it computes, never what: the speed settings (set_kernels) and attention_dropout (issue #54) --------------
from model import mlm_loss, set_kernels  # noqa: E402


def one_step_grads(model, idx, targets, pos):
    model.zero_grad(set_to_none=True)
    loss = model(idx, targets, pos)[1]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention_type", ["original", "symmetric", "pairwise", "hybrid"])
def test_fused_qkv_is_the_unfused_model_in_float64(attention_type):
    """One matmul against the concatenated projections: the same loss and the same gradient for every parameter
    (float64: rounding apart), with the parameters, their names and shapes (checkpoints, the export) unchanged."""
    model = tiny(attention_type, hybrid_pattern="original,pairwise").double().eval()  # eval: no dropout draws
    perturb_(model)
    idx = torch.randint(0, 93, (3, 17))
    targets = torch.where(torch.rand(3, 17) < 0.3, idx, -100)
    pos = (targets.view(-1) != -100).nonzero().squeeze(1)
    keys = list(model.state_dict())
    ref = one_step_grads(model, idx, targets, pos)
    got = one_step_grads(set_kernels(model, fused_qkv=True), idx, targets, pos)
    assert all(a.fused_qkv for a in model.modules() if hasattr(a, "fused_qkv")) and list(model.state_dict()) == keys
    torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=0)
    assert got[1].keys() == ref[1].keys() and len(ref[1]) == sum(1 for _ in model.parameters())
    for name in ref[1]:
        torch.testing.assert_close(got[1][name], ref[1][name], rtol=1e-10, atol=1e-14, msg=name)
    with torch.no_grad():  # the encoder alone, with padding, and the diagnostics' scores
        mask = torch.ones(3, 17, dtype=torch.long)
        mask[1, 9:] = 0
        a = model.encoder(idx, mask)
        b = set_kernels(model).encoder(idx, mask)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_fused_loss_is_cross_entropy():
    """mlm_loss: logsumexp minus the target's logit, with ignore_index=-100: F.cross_entropy's value and gradient, to
    float32 rounding (both compute in float32, whatever the logits' dtype), and in the model with
    set_kernels(fused_loss=True)."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        logits = (4 * torch.randn(50, 301, generator=g)).to(dtype).requires_grad_()
        targets = torch.randint(0, 301, (50,), generator=g)
        targets[::7] = -100
        ref = F.cross_entropy(logits.float(), targets, ignore_index=-100)
        got = mlm_loss(logits, targets)
        assert got.dtype == ref.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
        g_ref, = torch.autograd.grad(ref, logits)
        g_got, = torch.autograd.grad(got, logits)
        assert g_got.dtype == dtype  # bf16 gradients round alike: within one bf16 step of the largest
        torch.testing.assert_close(g_got, g_ref, rtol=1e-5, atol=1e-8 if dtype != torch.bfloat16 else 2e-5)
    model = tiny("pairwise").eval()
    idx = torch.randint(0, 93, (2, 16))
    targets = torch.where(torch.rand(2, 16) < 0.3, idx, -100)
    targets[0, 0] = -100
    pos = torch.tensor([0, 3, 5, 17, 20])  # a fixed count, as the dataloader gives; position 0 predicts nothing
    with torch.no_grad():
        ref = model(idx, targets, pos)[1]
        got = set_kernels(model, fused_loss=True)(idx, targets, pos)[1]
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)


def test_attention_dropout_follows_dropout_unless_set():
    """attention_dropout: None (the default, and every checkpoint made before it) is dropout's 0.1, as in the paper;
    set, it drops the attention probabilities alone, the hidden states' dropout staying."""
    assert BertConfig().attn_dropout() == 0.1 and BertConfig(dropout=0.0).attn_dropout() == 0.0
    for att, want in ((None, 0.1), (0.0, 0.0), (0.3, 0.3)):
        model = tiny("original", attention_dropout=att)
        assert model.encoder.layers[0].attn.dropout == want and model.encoder.layers[0].drop.p == 0.1
        assert model.encoder.drop.p == 0.1
    with pytest.raises(ValueError, match="attention_dropout"):
        BertConfig(attention_dropout=1.0)
    model = tiny("original", attention_dropout=0.0, dropout=0.0).train()  # no dropout anywhere: train == eval
    idx = torch.randint(0, 93, (2, 16))
    a = model.encoder(idx)
    torch.testing.assert_close(a, model.eval().encoder(idx))
    model = tiny("original", attention_dropout=0.5, dropout=0.0).train()  # attention's alone: train != eval
    assert (model.encoder(idx) - model.eval().encoder(idx)).abs().max() > 1e-3


def test_sdpa_backend_math_is_applied_on_a_cpu_and_the_others_are_no_ops():
    """sdpa_backend pins SDPA's kernel on a GPU; on a CPU only 'math' is applied (checked by the ATen ops a step runs,
    compiled too: torch.compile honours the pinning inside the forward), and every choice gives the same output."""
    from torch.profiler import profile

    def ops(model, compiled=False):
        fn = torch.compile(model, backend="aot_eager") if compiled else model
        idx = torch.randint(0, 93, (2, 16), generator=torch.Generator().manual_seed(0))
        with profile() as prof:
            out = fn.encoder(idx) if not compiled else fn(idx)[0]
            out.sum().backward()
        return {e.name for e in prof.events()}, out.detach()

    model = tiny("symmetric").eval()
    auto, ref = ops(model)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in auto
    for name in ("cudnn", "flash", "efficient"):
        names, out = ops(set_kernels(model, sdpa_backend=name))
        assert "aten::_scaled_dot_product_attention_math" not in names
        torch.testing.assert_close(out, ref)
    names, out = ops(set_kernels(model, sdpa_backend="math"))
    assert "aten::_scaled_dot_product_attention_math" in names and not any("flash" in n for n in names)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    names, _ = ops(model, compiled=True)
    assert "aten::_scaled_dot_product_attention_math" in names and not any("flash" in n for n in names)
    with pytest.raises(ValueError, match="sdpa_backend must be one of auto, cudnn"):
        set_kernels(model, sdpa_backend="fa3")


@pytest.mark.parametrize("fused_loss", [False, True])
def test_no_float32_copy_of_the_logits_in_a_compiled_bf16_step(fused_loss):
    """What inductor writes for a compiled bf16 step (its CPU code): the (n, vocab) logits and their gradient in bf16,
    no float32 buffer of that size, with F.cross_entropy(logits.float()) as with mlm_loss (the issue's premise of a
    float32 copy holds eagerly, not compiled)."""
    import re

    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    V = 1031  # a width nothing else in the graph has
    torch.manual_seed(0)
    model = set_kernels(Bert(BertConfig(**{**TINY, "vocab_size": V, "n_layer": 1})), fused_loss=fused_loss)
    idx = torch.randint(0, V, (2, 32))
    targets = torch.where(torch.rand(2, 32) < 0.3, idx, -100)
    pos = (targets.view(-1) != -100).nonzero().squeeze(1)
    compiled = torch.compile(model)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(idx, targets, pos)[1]
        loss.backward()

    with inductor_config.patch(fallback_random=True):
        _, codes = run_and_get_code(step)
    shapes = re.findall(rf"empty_strided\w*\(\((\d+), {V}\), \({V}, 1\), torch\.(\w+)\)", "\n".join(codes))
    assert all(dtype == "bfloat16" for _, dtype in shapes), shapes  # no float32 buffer of the vocabulary's width
    assert [rows for rows, _ in shapes].count(str(len(pos))) == 2, shapes  # the logits and their gradient

"""
Fill in [MASK] tokens with a trained model: a quick look at what it has learnt.

    python sample.py --init_from=out/tiny_pair/ckpt.pt --text="The [MASK] of a river is its mouth."
    python sample.py --init_from=out/base_pair/ckpt.pt --text="Paris is the [MASK] of France." --top_k=10

Prints, for each [MASK], the top_k tokens with their probabilities, then the text with the most likely ones
filled in. --untrained=True also prints what the same model guessed before training (train.py's step 0: the
architecture initialised from the seed the run started with), to see what training changed. A [MASK] stands for one GPT-2 token, which carries its own leading space: " [MASK]" reads as
"[MASK]" (tokenizer.encode_with_specials).
"""
if __name__ == '__main__':  # first: a Ctrl-C during start-up is one line (lib/interrupt.py)
    from lib import interrupt
import torch

from lib.checkpoint import load_checkpoint
from lib.device import check_device
from lib.tokenizer import encode_with_specials, get_tokenizer
from model import Bert, BertConfig

# -----------------------------------------------------------------------------
init_from = ''  # a train.py checkpoint: out_dir/ckpt.pt or a snapshot
text = ''  # text with one or more [MASK] in it
top_k = 5  # candidates shown per [MASK]
untrained = False  # also show the guesses of the untrained model (step 0: initialised from the run's seed)
device = 'cpu'  # cpu, cuda or mps
# -----------------------------------------------------------------------------


@torch.no_grad()
def fill(model, text, top_k):
    """[(position, [(token text, probability)] * top_k)] for each [MASK] of the text, and the text filled in."""
    enc, sp = get_tokenizer(model.config.vocab_size)  # the model's own vocabulary (prepare_oscar.py --vocab_size)
    ids = [sp['cls'], *encode_with_specials(text, model.config.vocab_size), sp['sep']]
    if sp['mask'] not in ids:
        raise SystemExit("sample: the text has no [MASK] to fill in, e.g. --text=\"The [MASK] sat on the mat.\"")
    if len(ids) > model.config.block_size:
        raise SystemExit(f"sample: the text is {len(ids)} tokens with [CLS] and [SEP]; the model reads at most "
                         f"{model.config.block_size}")
    x = torch.tensor([ids], device=next(model.parameters()).device)
    probs = model(x)[0][0].float().softmax(-1)
    probs[:, len(enc._mergeable_ranks):] = 0  # never propose [PAD] [CLS] ... or the unused padded ids
    show = lambda i: enc.decode_single_token_bytes(i).decode('utf-8', 'replace')
    found, filled = [], list(ids)
    for pos in [i for i, t in enumerate(ids) if t == sp['mask']]:
        p, top = probs[pos].topk(top_k)
        found.append((pos, [(show(i), v) for i, v in zip(top.tolist(), p.tolist())]))
        filled[pos] = top[0].item()
    return found, enc.decode(filled[1:-1])


def untrained_model(ck):
    """The run's model at step 0, before any update: train.py seeds torch with the run's seed, then builds the model
    (one process, or rank 0 of several). The seed it started with: a resume may have set another (init_seed)."""
    if 'seed' not in ck.get('config', {}):
        raise SystemExit("sample: --untrained=True needs a train.py checkpoint (its settings hold the run's seed)")
    torch.manual_seed(ck.get('init_seed', ck['config']['seed']))
    return Bert(BertConfig(**ck['model_args']))


def main():
    if not init_from:
        raise SystemExit("sample: set --init_from=<a train.py checkpoint> and --text=\"... [MASK] ...\"")
    ck = load_checkpoint(init_from)
    if 'num_labels' in ck:
        raise SystemExit(f"sample: {init_from} is a fine-tuned classifier; sample.py needs a pre-trained (MLM) one")
    enc = get_tokenizer(BertConfig(**ck['model_args']).vocab_size)[0]  # the vocabulary the model trained with
    n_tokens = len(enc._mergeable_ranks)  # the tokens sample.py proposes: no special or padded id
    if not 1 <= top_k <= n_tokens:
        raise SystemExit(f"sample: top_k must be in [1, {n_tokens}], got {top_k}")
    show = lambda cands: " | ".join(f"{tok!r} {p:.1%}" if p >= 0.001 else f"{tok!r} {p:.3%}" for tok, p in cands)
    print(f"{ck['model_args']['attention_type']} BERT, step {ck['iter_num']}: {text}")
    if untrained:
        for n, (_, cands) in enumerate(fill(untrained_model(ck).to(device).eval(), text, top_k)[0], 1):
            print(f"[MASK] {n}, untrained (step 0): " + show(cands))
    model = Bert(BertConfig(**ck['model_args']))
    model.load_state_dict(ck['model'])
    model.to(device).eval()
    found, filled = fill(model, text, top_k)
    for n, (_, cands) in enumerate(found, 1):
        print(f"[MASK] {n}" + (f", step {ck['iter_num']}" if untrained else "") + ": " + show(cands))
    print("filled in: " + filled.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t"))  # one line


if __name__ == '__main__':
    from configurator import configure

    configure(globals())
    check_device(device)
    with interrupt.stops_cleanly('sample', 'nothing was written'):
        main()

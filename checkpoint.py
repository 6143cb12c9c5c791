"""
Checkpoints, written whole (files.atomic_write) and read back checked: readable, a model that fits its model_args,
finite weights, and for a resume the optimizer state. Every problem a user can cause is one line (SystemExit).
"""
import warnings

import torch

from configurator import oneline
from files import atomic_write
from model import Bert, BertClassifier, BertConfig


def all_finite(tensors):
    """True if every float tensor is free of NaN and inf: one host sync however many tensors."""
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


def save_checkpoint(obj, path):
    def write(f):
        try:
            torch.save(obj, f)
        except RuntimeError as e:  # torch's writer reports a full disk as a RuntimeError: one line, as for OSError
            if "writ" in str(e) and "fail" in str(e):
                raise OSError(f"the write failed (a full disk?): {oneline(e)[:120]}") from None
            raise
    atomic_write(path, write)


def load_checkpoint(path, resume=False):
    """A train.py checkpoint (or a finetune_glue.py classifier, which has num_labels), checked: readable, with a
    model that fits its model_args and finite weights (and, to resume, the optimizer state). Pickled code is
    never run (weights_only). Any problem: one line."""
    try:
        with warnings.catch_warnings():  # a refused file: our one line, not torch's warnings first
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"no checkpoint at {path}")
    except Exception as e:
        raise SystemExit(f"{path} is not a readable checkpoint ({oneline(e)})")
    if not isinstance(ck, dict) or not {"model", "model_args", "iter_num"} <= ck.keys():
        raise SystemExit(f"{path} is not a train.py checkpoint (it needs model, model_args and iter_num)")
    try:
        with torch.device("meta"):  # shapes only: no memory, no init
            cfg = BertConfig(**ck["model_args"])
            model = BertClassifier(cfg, ck["num_labels"]) if "num_labels" in ck else Bert(cfg)
            want = {k: v.shape for k, v in model.state_dict().items()}
        if want != {k: v.shape for k, v in ck["model"].items()}:
            raise ValueError("the weights do not fit its model_args")
    except (TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"{path}: {oneline(e)}")
    if not all_finite(ck["model"].values()):
        raise SystemExit(f"{path} holds non-finite (NaN/inf) weights: use an earlier snapshot")
    if resume and not {"optimizer", "rng", "config"} <= ck.keys():
        raise SystemExit(f"{path} is a model-only snapshot: it cannot be resumed (no optimizer state), but it can be "
                         "fine-tuned (finetune_glue.py --init_from=) or exported (export_hf.py --init_from=)")
    return ck

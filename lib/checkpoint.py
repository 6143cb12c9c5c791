"""
Checkpoints, written whole (files.atomic_write) and read back checked: readable, a model that fits its model_args,
finite weights, and for a resume the optimizer state. Every problem a user can cause is one line (SystemExit).
"""
import hashlib
import math
import pickle
import warnings

import torch

from configurator import oneline
from lib.files import atomic_write
from model import Bert, BertClassifier, BertConfig


def all_finite(tensors):
    """True if every float tensor is free of NaN and inf: one host sync however many tensors."""
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


class Unreadable(SystemExit):
    """A checkpoint refused by load_checkpoint (one line): a caller that can go on without it (a benchmark over
    many snapshots) catches this, not every SystemExit."""


def save_checkpoint(obj, path):
    atomic_write(path, lambda f: torch_save(obj, f))


def torch_save(obj, f):
    """torch.save to the open file f. A failed write (a full disk, a file size limit) reaches torch's zip writer as
    an OSError that it reports in words of its own (`unexpected pos 704 vs 598`): the OSError itself is raised
    instead, which atomic_write turns into one line."""
    failed = []

    class Writer:  # f, noting the error of a failed write
        def write(self, b):
            try:
                return f.write(b)
            except OSError as e:
                failed.append(e)
                raise

        def flush(self):
            return f.flush()
    try:
        torch.save(obj, Writer())
    except RuntimeError:
        if failed:
            raise failed[0] from None
        raise


STEP = lambda v: type(v) is int and v >= 0
OPTIMIZER = lambda v: isinstance(v, dict) and isinstance(v.get("state"), dict) and isinstance(  # AdamW's state_dict
    v.get("param_groups"), list) and all(isinstance(g, dict) for g in v["param_groups"])
STATE = {  # what train.py writes of a run's state beside the weights (lib/run.py save), and a resume reads
    "iter_num": STEP, "last_eval": STEP, "init_seed": STEP,
    "eval_loss": lambda v: v is None or type(v) in (int, float) and math.isfinite(v),
    "spent": lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
    "run_id": lambda v: v is None or isinstance(v, str), "data": lambda v: v is None or isinstance(v, str),
    "config": lambda v: isinstance(v, dict), "model_args": lambda v: isinstance(v, dict),
    "schedules": lambda v: v is None or isinstance(v, list) and all(
        isinstance(x, (list, tuple)) and len(x) == 2 and STEP(x[0]) and isinstance(x[1], dict) for x in v),
    "rng": lambda v: isinstance(v, list) and all(  # [] re-seeds, as another process count does (lib/run.py)
        isinstance(r, dict) and isinstance(r.get("cpu"), torch.Tensor) and r["cpu"].dtype == torch.uint8 and
        r["cpu"].shape == torch.get_rng_state().shape and isinstance(r.get("cuda"), (torch.Tensor, type(None)))
        for r in v),
    "probe": lambda v: v is None or isinstance(v, (list, tuple)) and len(v) == 2 and STEP(v[0]) and isinstance(
        v[1], (list, tuple)) and all(isinstance(t, torch.Tensor) for t in v[1])}  # (step, scores) of the last eval


def load_checkpoint(path, resume=False):
    """A train.py checkpoint (or a finetune_glue.py classifier, which has num_labels), checked: readable, with a
    model that fits its model_args and finite weights (and, to resume, the optimizer state). Pickled code is
    never run (weights_only). Any problem: one line."""
    try:
        with warnings.catch_warnings():  # a refused file: our one line, not torch's warnings first
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise Unreadable(f"no checkpoint at {path}")
    except Exception as e:  # torch's own advice (weights_only=False) is wrong for a damaged file, unsafe for a foreign one
        why = "damaged, or not a torch.save file of tensors and plain data" if isinstance(e, pickle.UnpicklingError) \
            else "empty or cut short" if isinstance(e, EOFError) else oneline(e).split(". ")[0]
        raise Unreadable(f"{path} is not a readable checkpoint ({why})")
    if not isinstance(ck, dict) or not {"model", "model_args", "iter_num"} <= ck.keys():
        raise Unreadable(f"{path} is not a train.py checkpoint (it needs model, model_args and iter_num)")
    if bad := next((k for k, ok in STATE.items() if k in ck and not ok(ck[k])), None):
        raise Unreadable(f"{path}: its {bad} ({str(ck[bad])[:40]!r}) is not what train.py writes (edited, or another "
                         "program's file): use another checkpoint")
    if ahead := [k for k in ("last_eval", "probe") if STEP(ck["iter_num"]) and ck.get(k) is not None and (
            ck[k] if k == "last_eval" else ck[k][0]) > ck["iter_num"]]:  # an eval after the step it was saved at
        raise Unreadable(f"{path}: its {ahead[0]} (of a step after its iter_num {ck['iter_num']}) is not what "
                         "train.py writes (edited, or another program's file): use another checkpoint")
    try:
        with torch.device("meta"):  # shapes only: no memory, no init
            cfg = BertConfig(**ck["model_args"])
            model = BertClassifier(cfg, ck["num_labels"]) if "num_labels" in ck else Bert(cfg)
            want = {k: v.shape for k, v in model.state_dict().items()}
        if want != {k: v.shape for k, v in ck["model"].items()}:
            raise ValueError("the weights do not fit its model_args")
    except (TypeError, ValueError, AttributeError) as e:
        raise Unreadable(f"{path}: {oneline(e)}")
    if not all_finite(ck["model"].values()):
        raise Unreadable(f"{path} holds non-finite (NaN/inf) weights: use an earlier snapshot")
    if resume and not {"optimizer", "rng", "config"} <= ck.keys():
        raise Unreadable(f"{path} is a model-only snapshot: it cannot be resumed (no optimizer state), but it can be "
                         "fine-tuned (finetune_glue.py --init_from=) or exported (export_hf.py --init_from=)")
    if resume and not OPTIMIZER(ck["optimizer"]):  # what a resume alone reads
        raise Unreadable(f"{path}: its optimizer ({str(ck['optimizer'])[:40]!r}) is not what train.py writes (edited, "
                         "or another program's file): use another checkpoint")
    return ck


def model_id(ck):
    """What a result computed from the checkpoint ck names as its model: the run id and step it was saved with (None
    before run ids) and a hash of its weights, which decides: the same weights copied elsewhere are the same model,
    another model saved at the same path is not."""
    h = hashlib.sha256()
    for name in sorted(ck["model"]):
        t = ck["model"][name].detach().cpu().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return {"run_id": ck.get("run_id"), "step": int(ck["iter_num"]), "weights": h.hexdigest()[:16]}


def describe(model_id):
    """A model_id in words, for a message."""
    if not isinstance(model_id, dict):
        return "a model it does not name (made before results named their model)"
    return (f"run {model_id.get('run_id') or '(no id)'} at step {model_id.get('step')}, weights "
            f"{model_id.get('weights')}")

"""
A run's folder: its lock, its checkpoints, its log, and whether it holds the run a command asks for. Files are
written whole or not at all, and every problem a user can cause ends in one line (SystemExit).
"""
import dataclasses
import fcntl
import json
import math
import os
import socket
import sys
import time
import warnings
from contextlib import contextmanager

import torch

from configurator import oneline
from model import Bert, BertClassifier, BertConfig


# ----------------------------------------------------------------------------- files written whole
def atomic_write(path, write, mode="wb"):
    """Write a file whole or not at all: write(f) fills path.tmp.<pid>, which is flushed to disk and renamed over
    path. On any failure (a full disk, Ctrl-C) the temporary file is removed and path is as it was; a failure of
    the disk itself ends in one line."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SystemExit(f"cannot write {path}: {e.strerror or e}; it is unchanged") from None
        raise


def write_json(path, obj):
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1) + "\n"), mode="w")


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"cannot read {what} {path} ({oneline(e)}); it was left as it is")


def remove_stale_temporaries(path):
    """Removes the *.tmp.<pid> files that writes killed mid-way left in path (and path/snapshots): call it only
    while holding path's lock, so that no live writer owns them."""
    for folder in (path, os.path.join(path, "snapshots")):
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if ".tmp." in name and name.rsplit(".tmp.", 1)[1].isdigit():
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


# ----------------------------------------------------------------------------- the lock
_held = {}  # folder -> file descriptor of its lock, held until released or the process exits


def lock_dir(path, who):
    """Creates path if needed and holds it for this process: an exclusive flock on path/.lock, whose text names
    the holder. The operating system releases it when the process ends in any way, so the lock of a dead
    process is free again. Another live holder: one line naming it."""
    if os.path.abspath(path) in _held:  # this process has it already
        return
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise SystemExit(f"cannot use {path} as an output folder: {e.strerror}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 300).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise SystemExit(f"{path} is in use by {holder}: wait for it to end, or choose another output folder")
    os.ftruncate(fd, 0)
    os.write(fd, f"{who} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
    _held[os.path.abspath(path)] = fd


def unlock_dir(path):
    fd = _held.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def locked(path, who):
    """`with locked(folder, 'script.py'):` the folder is this process's for the block (see lock_dir)."""
    lock_dir(path, who)
    try:
        yield
    finally:
        unlock_dir(path)


# ----------------------------------------------------------------------------- checkpoints
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


# ----------------------------------------------------------------------------- is this the same run?
MACHINE_KEYS = ("init_from", "out_dir", "device", "dtype", "compile")  # where and how a run is made, not what it is
END_KEYS = ("target_loss", "min_iters", "max_iters")  # where it ends


SAVE_KEYS = ("save_interval", "checkpoint_interval")  # how often it is saved: not what it computes


def run_changes(old, new, ignore=MACHINE_KEYS):
    """What makes the settings `new` another run than the run made with `old`: ['key old -> new', ...] over the
    settings both have, other than `ignore`, how often it is saved, and where a run ends (target_loss, min_iters;
    max_iters too under a constant learning rate, where a longer run has the same past)."""
    ends = tuple(k for k in END_KEYS if k != "max_iters" or not new.get("decay_lr", True))
    return [f"{k} {old[k]!r} -> {v!r}" for k, v in new.items()
            if k in old and k not in ignore + ends + SAVE_KEYS and old[k] != v]


def is_finished(ck, config):
    """The run at the state ck (iter_num, last_eval, eval_loss: a checkpoint's) has gone as far as config asks: to
    max_iters, or to an eval at or after min_iters (never step 0) with a loss at or below target_loss (0: none)."""
    stopped = config["target_loss"] and ck.get("eval_loss") is not None and ck.get("last_eval") == ck["iter_num"] \
        and ck["eval_loss"] <= config["target_loss"] and ck["iter_num"] >= max(config["min_iters"], 1)
    return ck["iter_num"] >= config["max_iters"] or bool(stopped)


def open_run(out_dir, config, given):
    """train.py's policy for out_dir, decided before any compute. Returns (ckpt, model_args, changed):
    - init_from='resume': the run of out_dir/ckpt.pt goes on. Every setting not given now (`given`: those set by a
      config file or --key=value) is the run's own, its precision too (config is updated in place); `changed` lists
      the given ones that make it another run (not an exact continuation). Asking for another model is an error.
    - a new run: ckpt is None. The same run, finished, is nothing to do (exit 0); any other run there is never
      touched (an error)."""
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    model_keys = [f.name for f in dataclasses.fields(BertConfig) if f.name in config]
    if config["init_from"] == "resume":
        ckpt = load_checkpoint(ckpt_path, resume=True)
        config.update({k: v for k, v in ckpt["config"].items() if k in config and k not in given | set(MACHINE_KEYS)})
        if "dtype" not in given and (ckpt["config"].get("dtype") != "float16" or config["device"].startswith("cuda")):
            config["dtype"] = ckpt["config"].get("dtype", config["dtype"])  # its precision (fp16: on a GPU only)
        model_args = ckpt["model_args"]  # the checkpoint decides the architecture
        clash = [f"{k} {config[k]!r} (checkpoint: {model_args.get(k)!r})" for k in model_keys
                 if k in given and config[k] != model_args.get(k, BertConfig.__dataclass_fields__[k].default)]
        if clash:
            raise SystemExit(f"train: resuming {ckpt_path}, but the settings ask for another model: {', '.join(clash)}."
                             " Drop them to resume, or start a new out_dir")
        return ckpt, model_args, sorted(run_changes(ckpt["config"], config))
    snapshots = os.path.join(out_dir, "snapshots")
    found = [n for n in ("ckpt.pt", "log.jsonl") if os.path.exists(os.path.join(out_dir, n))]
    found += ["snapshots/"] if os.path.isdir(snapshots) and os.listdir(snapshots) else []
    if "ckpt.pt" in found:
        try:
            old = load_checkpoint(ckpt_path, resume=True)
        except SystemExit:  # not even readable: certainly not this run (refused below, nothing touched)
            old = None
        if old and not run_changes(old["config"], config) and is_finished(old, config):
            further = "--init_from=resume" + (" --target_loss=0" if old["iter_num"] < config["max_iters"] else
                                              " and a higher --max_iters")
            print(f"{out_dir} already holds this run, finished at step {old['iter_num']}: nothing to do. To train "
                  f"it further: {further}; a new run: another --out_dir")
            sys.exit(0)
    if found:
        raise SystemExit(f"train: {out_dir} holds another run ({', '.join(found)}): continue it with "
                         "--init_from=resume, or choose another out_dir (nothing is overwritten)")
    try:
        return None, vars(BertConfig(**{k: config[k] for k in model_keys})), []
    except ValueError as e:
        raise SystemExit(f"train: {e}")


# ----------------------------------------------------------------------------- the log
def open_log(path, resume_step=None, also=None):
    """train.py's log.jsonl as a function log(record), which appends the record with the wall-clock time (and calls
    also(record), if given). On a resume the file is first cut back to the records up to resume_step: those after it
    belong to steps the run repeats (a half-written line of a killed run goes too)."""
    if resume_step is not None and os.path.exists(path):
        kept = []
        with open(path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= resume_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    pass
        atomic_write(path, lambda f: f.writelines(kept), mode="w")
    f = open(path, "a")

    def log(record):
        record["time"] = round(time.time(), 1)  # how long a run took, across resumes
        f.write(json.dumps(record) + "\n")
        f.flush()
        if also:
            also(record)
    return log


def read_evals(run):
    """The eval records of a train.py run (its out_dir or log.jsonl), sorted by step. A half-written last line
    (a killed run) is skipped; anything else malformed is a one-line error."""
    path = os.path.join(run, "log.jsonl") if os.path.isdir(run) else run
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"cannot read {path} ({getattr(e, 'strerror', None) or e}): not a train.py out_dir?")
    evals = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line) if line.strip() else {}
        except ValueError:
            if n == len(lines):
                continue
            raise SystemExit(f"{path}, line {n}: not JSON; is this a train.py log.jsonl?")
        if isinstance(r, dict) and r.get("type") == "eval":
            if not isinstance(r.get("step"), int) or not isinstance(r.get("loss"), (int, float)) or \
                    not math.isfinite(r["loss"]):
                raise SystemExit(f"{path}, line {n}: an eval record needs a step and a finite loss")
            evals.append(r)
    if not evals:
        if lines and not any(line.strip().startswith("{") for line in lines):
            raise SystemExit(f"{path} is not JSON lines: is this a train.py log.jsonl?")
        raise SystemExit(f"{path} has no eval records: run train.py past its first eval_interval")
    return sorted(evals, key=lambda r: r["step"])


def first_step_below(evals, level):
    """The study's criterion: the first eval step whose loss is <= level (None if never)."""
    return next((r["step"] for r in evals if r["loss"] <= level), None)

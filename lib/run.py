"""
A training run's life in its folder (out_dir), which train.py reads as `run = Run(...)`: the folder held by one
process, the decision before any compute (a new run, the run there resumed with its own settings, or nothing to do),
a resumed run's state restored to the bit, saves that are whole and never of a non-finite model, the stop on a
signal at the end of a step (every process together), the log, and what it says at its start and end (notes,
learnt, summary). What makes two settings the same run (run_changes) is here too: study.py asks it of its records.
"""
import dataclasses
import json
import os
import signal
import time
import uuid

import torch
import torch.distributed as dist

from lib.checkpoint import all_finite, load_checkpoint, save_checkpoint
from lib.files import atomic_write, lock_dir, remove_stale_temporaries
from model import BertConfig


class NothingToDo(Exception):
    """The run asked for is in out_dir, finished: the message says so and how to train it further."""


class Run:
    """train.py's run in out_dir. Made before any compute: rank 0 holds the folder and removes the half-written files
    of killed runs, then open_run decides (nothing_to_do: the same run is finished there). config, updated in place by
    a resume, holds the run's own settings."""

    def __init__(self, out_dir, config, given, rank=0, who="train.py"):
        self.master = rank == 0
        if self.master:  # before anything in the folder is read; an empty out_dir is refused, never the cwd
            lock_dir(out_dir, who[:200])
        self.out_dir = os.path.abspath(out_dir)
        self.ckpt_path = os.path.join(self.out_dir, "ckpt.pt")
        if self.master:  # a user's file or folder where the run keeps its own (a file named snapshots): one line
            for name, folder in (("ckpt.pt", False), ("log.jsonl", False), ("snapshots", True)):
                path = os.path.join(self.out_dir, name)
                if os.path.exists(path) and os.path.isdir(path) != folder:
                    raise SystemExit(f"train: {path} is a {'file' if folder else 'folder'}, where train.py keeps its "
                                     f"{name}{'/ folder' if folder else ''}: move it away or choose another out_dir "
                                     "(nothing was changed)")
        if self.master:  # the files this class writes, half-written by a killed run: nothing else
            remove_stale_temporaries(self.out_dir, (r"ckpt\.pt", r"log\.jsonl"))
            remove_stale_temporaries(os.path.join(self.out_dir, "snapshots"), (r"ckpt_\d+\.pt",))
        self.nothing_to_do = None  # or a message: the same run is finished there (train.py exits 0)
        try:
            self.ckpt, self.model_args, self.changed = open_run(self.out_dir, config, given, who)
        except NothingToDo as e:
            self.nothing_to_do, self.ckpt, self.model_args, self.changed = str(e), None, None, []
        self.config, self.resumed = config, self.ckpt is not None
        # the run's identity, saved in every checkpoint and at the top of log.jsonl: a checkpoint of another run is
        # never resumed over this folder's log (an old checkpoint has none: a new one from here on)
        head = None if self.resumed or self.nothing_to_do else log_head(os.path.join(self.out_dir, "log.jsonl"))
        self.run_id = (self.ckpt or head or {}).get("run_id") or uuid.uuid4().hex[:16]  # a new run: a new id (this
        # run started again, killed before its first save: its own, which its snapshots name)
        # the seed its weights were initialised from, saved in every checkpoint: a resume may change config's seed
        # (sample.py --untrained=True rebuilds the untrained model from this one)
        self.init_seed = self.ckpt.get("init_seed", self.ckpt["config"].get("seed", config["seed"])) if self.ckpt \
            else config["seed"]
        # the schedules the weights followed, saved in every checkpoint: a resume on another one (a higher max_iters:
        # the lr goes back up) starts a new entry, so that export_hf.py's model card tells them all
        self.schedules = schedules(self.ckpt, config)
        self.data = None  # the dataset's fingerprint (dataloader.fingerprint), given to restore
        self.last_good = self.ckpt_path if self.resumed else None  # named when a run must stop
        self.signals, self.log, self.rng = [], None, None

    def restore(self, model, optimizer, scaler, rank=0, world=1, device_type="cpu", flag_group=None, data=None):
        """The resumed run's model, optimizer and loss scaler, and its loop state as save() wrote it: {iter_num,
        last_eval (the step of its latest eval: a resume skips it), eval_loss, probe ((step, scores) at that eval, to
        see how fast the scores move), spent (seconds of training steps: max_minutes' budget)}; a new run's is step 0
        with no eval. Its RNG state waits for restore_rng (compiling draws from it). The run keeps what it needs to
        save and to stop. data: the dataset's fingerprint, which a resume checks against the run's own (other data
        would mix two eval sets in one log)."""
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.world, self.device_type, self.flag_group, self.data = world, device_type, flag_group, data
        if not self.resumed:
            return {"iter_num": 0, "last_eval": -1, "eval_loss": None, "probe": None, "spent": 0.0}
        ck = self.ckpt
        if data and ck.get("data") and ck["data"] != data:
            raise SystemExit(f"train: the dataset {self.config['dataset']} is not the data {self.ckpt_path} was trained "
                             f"on (fingerprint {data}, the run's {ck['data']}: rebuilt or changed since): resume on the "
                             "run's own data, or start a new out_dir")
        if self.master and data and not ck.get("data"):
            print(f"note: {self.ckpt_path} predates data fingerprints: its data cannot be checked", flush=True)
        model.load_state_dict(ck["model"])
        try:
            optimizer.load_state_dict(ck["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:  # groups of another qk_lr_scale, or damaged
            own = ck['config'].get('qk_lr_scale', 1.0)
            raise SystemExit(f"train: {self.ckpt_path}'s optimizer state does not fit these settings ({e}): " + (
                f"resume with the run's own qk_lr_scale ({own})" if self.config.get("qk_lr_scale", 1.0) != own else
                "it is damaged or another program's: resume another checkpoint"))
        if scaler.is_enabled() and ck.get("scaler"):  # empty when the run was not fp16
            scaler.load_state_dict(ck["scaler"])
        iter_num, last_eval = ck["iter_num"], ck.get("last_eval", ck["iter_num"])
        eval_loss = ck.get("eval_loss") if last_eval == iter_num else None  # a run stopped at target_loss stays so
        self.rng = ck["rng"][rank] if len(ck["rng"]) == world else None
        if self.master:
            print(f"resuming {self.ckpt_path} at step {iter_num:,} of {self.config['max_iters']:,}", flush=True)
            if self.changed:
                print(f"resuming with changed settings ({', '.join(self.changed)}): not an exact continuation",
                      flush=True)
            if self.rng is None:
                print(f"resuming with {world} processes instead of {len(ck['rng'])}: dropout RNG re-seeded", flush=True)
        return {"iter_num": iter_num, "last_eval": last_eval, "eval_loss": eval_loss, "probe": ck.get("probe"),
                "spent": ck.get("spent", 0.0)}

    def notes(self, model, n_pred, step, spent, device_type):
        """Rank 0's start-up notes: the budget, and settings that will not do what they seem to: a GPU-sized run on a
        CPU (said before hours pass), a GPU attention kernel on another device, the compiled optimizer under fp16,
        a warm-up longer than the run. model: for its FLOPs; n_pred: the predicted positions per sequence."""
        if not self.master:
            return
        c, T = self.config, self.model_args["block_size"]
        say = lambda s: print(s, flush=True)
        if c["max_minutes"]:
            say(f"budget: {c['max_minutes']:g} minute{'s' * (c['max_minutes'] != 1)} of training steps (evals and "
                f"saves not counted), {spent / 60:.2f} spent; the learning rate follows the fraction spent")
        steps = c["max_iters"] - step
        flops = model.flops_per_token(T, n_pred / T) * c["batch_size"] * T * c["gradient_accumulation_steps"] * steps
        if device_type == "cpu" and flops > 0.4e12 * 86400:  # a day at 0.4 TFLOP/s: 2 x86 cores in bf16 (performance)
            say(f"note: the {steps:,} steps to go are {flops:.2g} FLOPs: ~{flops / 0.4e12 / 86400:,.0f} days on a CPU "
                "at 0.4 TFLOP/s. This config is meant for GPUs; config/tiny*.py are the CPU ones")
        if device_type != "cuda" and c["sdpa_backend"] not in ("auto", "math"):  # model.set_kernels: a no-op there
            say(f"note: sdpa_backend={c['sdpa_backend']} is a GPU kernel: on {device_type} PyTorch picks its own")
        if c["compile_optimizer"] and c["dtype"] == "float16":
            say("note: compile_optimizer is off under fp16: its GradScaler steps the fused AdamW eagerly")
        if c["warmup_iters"] > c["max_iters"] > 0:
            say(f"note: warmup_iters ({c['warmup_iters']}) > max_iters ({c['max_iters']}): the learning rate never "
                f"reaches {c['learning_rate']:g}")

    def restore_rng(self):
        """The interrupted run's RNG state, for a bit-exact continuation; the checkpoint is let go."""
        if self.rng is not None:
            torch.set_rng_state(self.rng["cpu"])
            if self.device_type == "cuda" and self.rng.get("cuda") is not None:
                torch.cuda.set_rng_state(self.rng["cuda"])
        self.ckpt = self.rng = None

    def open_log(self, step, wandb_project=None):
        """log.jsonl, cut back to `step` on a resume (rank 0 writes it), and each record to Weights & Biases too if
        a wandb_project is given."""
        if not self.master:
            return
        also = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise SystemExit("train: wandb_log=True but wandb is not installed: pip install wandb")
            wandb.init(project=wandb_project, name=os.path.basename(self.out_dir), config=self.config)
            also = lambda record: wandb.log(record, step=record["step"])
        head = {"type": "run", "step": 0, "run_id": self.run_id, "data": self.data, "config": self.config}
        self.log = open_log(os.path.join(self.out_dir, "log.jsonl"), head, step if self.resumed else None, also)

    def finished(self, state):
        """The loop's state has gone as far as the run asks (is_finished)."""
        return is_finished(state, self.config)

    def stop(self, reason, step):
        hint = " or dtype=bfloat16 (float32's range)" if self.config["dtype"] == "float16" else ""
        raise SystemExit(f"train: {reason} at step {step}; nothing was saved. Last good checkpoint: "
                         f"{self.last_good or 'none'}. Try a lower learning_rate{hint}")

    def save(self, path, state, full=True):
        """The model at the loop's state (iter_num, last_eval, eval_loss, probe), never a non-finite one; with full,
        also the optimizer, the scaler and every process's RNG state, to continue to the bit. Rank 0 writes."""
        if not all_finite(self.model.parameters()):
            self.stop("the weights are not finite (NaN/inf)", state["iter_num"])
        ck = {"model": self.model.state_dict(), "model_args": self.model_args, "config": self.config,
              "run_id": self.run_id, "init_seed": self.init_seed, "data": self.data, "schedules": self.schedules,
              **state}
        if full:
            rng = {"cpu": torch.get_rng_state(),
                   "cuda": torch.cuda.get_rng_state() if self.device_type == "cuda" else None}
            rngs = [rng]
            if self.world > 1:
                rngs = [None] * self.world
                dist.all_gather_object(rngs, rng)
            ck.update(optimizer=self.optimizer.state_dict(), scaler=self.scaler.state_dict(), rng=rngs)
        if self.master:
            save_checkpoint(ck, path)
        if full and path == self.ckpt_path:
            self.last_good = path

    def catch_signals(self):
        """From here on SIGTERM and SIGINT are noted, not fatal: the loop finishes its step, saves and stops."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.signals.append(signum))

    def signalled(self, spent=0.0):
        """(the signal to stop on (0: none), the seconds spent on training steps); with several processes the largest
        of all of theirs, over a CPU side channel (no GPU sync), so that they stop at the same step and follow the same
        budget."""
        stopping = max(self.signals, default=0)
        if self.flag_group is not None:
            flag = torch.tensor([stopping, spent], dtype=torch.float64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.flag_group)
            stopping, spent = int(flag[0].item()), flag[1].item()
        return stopping, spent

    def summary(self, step, eval_loss, eval_acc, spent=0.0):
        """What the finished run left where, and the commands that come next."""
        rel = os.path.relpath(self.out_dir) if not os.path.relpath(self.out_dir).startswith("..") else self.out_dir
        c, name = self.config, os.path.basename(self.out_dir)
        evaluated = f", eval loss {eval_loss:.4f}, MLM accuracy {eval_acc:.4f}" if eval_acc is not None else ""
        m = c.get("max_minutes")
        budget = m and spent >= 60 * m
        target = "" if step >= c["max_iters"] else f" (its budget of {m:g} minute{'s' * (m != 1)} spent)" if budget \
            else f" (at or below target_loss {c['target_loss']})"
        folder = os.path.join(self.out_dir, "snapshots")
        snapshots = len(os.listdir(folder)) if os.path.isdir(folder) else 0
        return (f"done: step {step}{evaluated}{target}. In {rel}/: ckpt.pt (the full state), log.jsonl (the curves), "
                f"snapshots/ ({snapshots} model-only)."
                f"\nnext: python sample.py --init_from={rel}/ckpt.pt --text='The [MASK] sat on the mat.'"
                f"\n      python finetune_glue.py --init_from={rel}/ckpt.pt --data_dir=<GLUE folder> --tasks=sst2,stsb"
                f"\n      python plot.py --runs={rel}    |    python export_hf.py --init_from={rel}/ckpt.pt "
                f"--out_dir=hf/{name}\n      to train further: a higher --max_iters"
                + (" or --max_minutes" if budget else "") + " with --init_from=resume"
                + (" --target_loss=0" if c["target_loss"] else ""))

    def learnt(self, step, eval_loss, u):
        """The last lines of a finished run: its eval loss beside the untrained model's (step 0, read from log.jsonl)
        and u, that of guessing each token from its frequency alone (dataloader.frequency_only_loss)."""
        first = None
        try:
            with open(os.path.join(self.out_dir, "log.jsonl")) as f:
                first = next((r["loss"] for r in map(json.loads, f) if r.get("type") == "eval" and r.get("step") == 0),
                             None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # a damaged log: the lines go without it
        return ("learnt: eval loss " + (f"{first:.2f} untrained (step 0), " if first is not None else "")
                + f"{eval_loss:.2f} at step {step}: {abs(u - eval_loss):.2f} nats "
                f"{'below' if eval_loss <= u else 'above'} U = {u:.2f}\n        (U: the loss of guessing each masked "
                "token from its frequency in the training data alone, without context)")

    def close(self):
        """Every process waits for rank 0's last save before the processes end: none leaves early (torchrun would
        stop the others while rank 0 is still writing)."""
        if self.flag_group is not None:
            dist.barrier(group=self.flag_group)
            dist.destroy_process_group()


SCHEDULE_KEYS = ("learning_rate", "warmup_iters", "max_iters", "decay_lr", "max_minutes")  # what sets the lr's course


def schedules(ckpt, config):
    """[[first step, {SCHEDULE_KEYS: value}], ...]: the schedules a run followed, the last one config's (a new run: one;
    a checkpoint from before this record: its own config's, from step 0)."""
    course = lambda c: {k: c.get(k) for k in SCHEDULE_KEYS if k != "max_iters" or c.get("decay_lr", True) or
                        c.get("max_minutes")}  # a constant lr does not depend on where the run ends
    now = course(config)
    if not ckpt:
        return [[0, now]]
    past = ckpt.get("schedules") or [[0, course(ckpt["config"])]]
    if now == past[-1][1]:
        return past
    return [p for p in past if p[0] < ckpt["iter_num"]] + [[ckpt["iter_num"], now]]  # none left untaken


# ----------------------------------------------------------------------------- is this the same run?
MACHINE_KEYS = ("init_from", "out_dir", "device", "dtype", "compile",  # where and how a run is made, not what it is
                "compile_mode", "compile_optimizer", "fused_qkv", "sdpa_backend", "fused_loss", "pause_at")
END_KEYS = ("target_loss", "min_iters", "max_iters", "max_minutes")  # where it ends


SAVE_KEYS = ("save_interval", "checkpoint_interval")  # how often it is saved: not what it computes


def run_changes(old, new, ignore=MACHINE_KEYS):
    """What makes the settings `new` another run than the run made with `old`: ['key old -> new', ...] over the
    settings both have, other than `ignore`, how often it is saved, and where a run ends (target_loss, min_iters;
    max_iters and max_minutes too under a constant learning rate, where a longer run has the same past)."""
    ends = tuple(k for k in END_KEYS if k not in ("max_iters", "max_minutes") or not new.get("decay_lr", True))
    return [f"{k} {old[k]!r} -> {v!r}" for k, v in new.items()
            if k in old and k not in ignore + ends + SAVE_KEYS and old[k] != v]


def is_finished(ck, config):
    """The run at the state ck (iter_num, last_eval, eval_loss, spent: a checkpoint's) has gone as far as config asks:
    to max_iters, through its budget (max_minutes), or to an eval at or after min_iters (never step 0) with a loss at
    or below target_loss (0: none)."""
    stopped = config["target_loss"] and ck.get("eval_loss") is not None and ck.get("last_eval") == ck["iter_num"] \
        and ck["eval_loss"] <= config["target_loss"] and ck["iter_num"] >= max(config["min_iters"], 1)
    spent = config.get("max_minutes") and ck.get("spent", 0.0) >= 60 * config["max_minutes"]
    return ck["iter_num"] >= config["max_iters"] or bool(stopped) or bool(spent)


def open_run(out_dir, config, given, who="train.py"):
    """train.py's decision for out_dir, before any compute: one of four outcomes.
    - a new run: (None, model_args, []). The folder holds nothing of a run, or only this run's log.jsonl (killed
      before its first save): it starts from step 0 whether asked to start or to resume, so that a requeued job goes
      on with the same command.
    - a resume (init_from='resume' and a ckpt.pt): (ckpt, model_args, changed). Every setting not given on the
      command line (`given`: {key: where its value came from}, configurator.configure's) is the run's own, a config
      file's too (nanoGPT's convention: the checkpoint is the run), its precision too (config is updated in place);
      `changed` lists the command line's that make it another run (not an exact continuation). who: the command.
    - nothing to do: NothingToDo, when the run asked for is there, finished.
    - refused (SystemExit, one line, nothing touched): another run is there; this run is there unfinished but a new
      start was asked for; the checkpoint is not the log's run; a resume asks for another model."""
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    model_keys = [f.name for f in dataclasses.fields(BertConfig) if f.name in config]
    head = log_head(os.path.join(out_dir, "log.jsonl"))  # the run this folder's log belongs to (None: unknown)
    snapshots = os.path.join(out_dir, "snapshots")
    found = [n for n in ("ckpt.pt", "log.jsonl") if os.path.exists(os.path.join(out_dir, n))]
    found += ["snapshots/"] if os.path.isdir(snapshots) and os.listdir(snapshots) else []

    # nothing saved of this run yet (an empty folder, or this run killed or diverged before its first save): new. A
    # log is this run's when its head holds the model's settings and none of them differ (an empty one is no run's)
    this = head and set(model_keys) <= head["config"].keys() and not run_changes(head["config"], config)
    if "ckpt.pt" not in found and (not found or this):
        if config["init_from"] == "resume" or found:
            print(f"{out_dir} holds no checkpoint of this run yet (nothing saved): starting it from step 0" + (
                " under its run id, its snapshots made again" if "snapshots/" in found else ""), flush=True)
        config["init_from"], found = "scratch", []

    if config["init_from"] == "resume":  # the checkpoint's run, with its own settings where none are given
        ckpt = load_checkpoint(ckpt_path, resume=True)
        if head and (head.get("run_id") != ckpt["run_id"] if ckpt.get("run_id") else  # an old checkpoint: its settings
                     run_changes(head["config"], ckpt["config"], MACHINE_KEYS + ("max_iters",))):
            raise SystemExit(f"train: {ckpt_path} is not the checkpoint of the run that {out_dir}/log.jsonl records (run "
                             f"{ckpt.get('run_id') or 'of other settings'}, the log's {head.get('run_id')}): nothing "
                             "was changed; resume that checkpoint in a folder of its own")
        ckpt["run_id"] = ckpt.get("run_id") or head and head.get("run_id")  # an old checkpoint: the log's id
        model_args = ckpt["model_args"]  # the checkpoint decides the architecture
        model_of = lambda k: model_args.get(k, BertConfig.__dataclass_fields__[k].default)
        cli = {k for k, where in given.items() if where.startswith("--")}  # the command line's, not a file's
        clash = [k for k in model_keys if k in cli and config[k] != model_of(k)]
        if clash:
            again = " ".join(["python", *(a for a in who.split() if a.split("=")[0][2:] not in clash)]
                             + ([] if "init_from" in given else ["--init_from=resume"]))
            raise SystemExit(f"train: resuming {ckpt_path}, but the command line asks for another model: " + ", ".join(
                f"{given[k]} (the run's: {model_of(k)!r})" for k in clash) + f". To resume it: {again}; or start "
                "a new out_dir")
        ours = {k: v for k, v in ckpt["config"].items() if k in config and k not in cli | set(MACHINE_KEYS)}
        fits = lambda v, now: type(v) is type(now) or isinstance(now, float) and type(v) is int or (
            None in (v, now) and isinstance(v, (int, float, type(None))) and not isinstance(v, bool))  # None: a
        # setting whose default is None (attention_dropout)
        if bad := next((k for k, v in ours.items() if not fits(v, config[k])), None):
            want = "number or None" if config[bad] is None else type(config[bad]).__name__
            raise SystemExit(f"train: {ckpt_path}'s own setting {bad} is {str(ours[bad])[:40]!r}, not a {want} "
                             "(edited, or another program's file): resume another checkpoint")
        # a config file's values yield to the run's own
        if yield_ := [f"{k} {v!r} ({given[k]}: {config[k]!r})" for k, v in ours.items() if k in given and config[k] != v]:
            print(f"resuming with the run's own settings: {', '.join(yield_)}", flush=True)
        config.update(ours)
        if "dtype" not in given and (ckpt["config"].get("dtype") != "float16" or config["device"].startswith("cuda")):
            config["dtype"] = ckpt["config"].get("dtype", config["dtype"])  # its precision (fp16: on a GPU only)
        return ckpt, model_args, sorted(run_changes(ckpt["config"], config))

    # a new start asked for where a checkpoint is: the same run finished is nothing to do; unfinished, refused
    if "ckpt.pt" in found:
        try:
            old = load_checkpoint(ckpt_path, resume=True)
        except SystemExit:  # not even readable: certainly not this run (refused below, nothing touched)
            old = None
        if old and not run_changes(old["config"], config):
            if is_finished(old, config):
                budget = config.get("max_minutes") and old.get("spent", 0.0) >= 60 * config["max_minutes"]
                further = "--init_from=resume" + (" and a higher --max_iters" if old["iter_num"] >= config["max_iters"]
                                                  else " and a higher --max_minutes" if budget else " --target_loss=0")
                raise NothingToDo(f"{out_dir} already holds this run, finished at step {old['iter_num']}: nothing to "
                                  f"do. To train it further: {further}; a new run: another --out_dir")
            raise SystemExit(f"train: {out_dir} holds this run, saved at step {old['iter_num']}: continue it with "
                             "--init_from=resume (a new start would overwrite it), or choose another out_dir")
    if found:  # another run's files
        raise SystemExit(f"train: {out_dir} holds another run ({', '.join(found)}): continue it with "
                         "--init_from=resume, or choose another out_dir (nothing is overwritten)")
    try:  # a new run
        return None, vars(BertConfig(**{k: config[k] for k in model_keys})), []
    except ValueError as e:
        raise SystemExit(f"train: {e}")


# ----------------------------------------------------------------------------- the log
def repeated(raw, resume_step):
    """The log line raw is a train or eval record of a step after resume_step: one that a resume repeats."""
    try:
        r = json.loads(raw)
    except ValueError:
        return False
    return isinstance(r, dict) and r.get("type") in ("train", "eval") and type(r.get("step")) is int \
        and r["step"] > resume_step


def log_head(path):
    """The first record of a train.py log.jsonl when it names its run ({"type": "run", "run_id", "config", "data"});
    None for an old log, another file or none."""
    try:
        with open(path, "rb") as f:
            head = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return head if isinstance(head, dict) and head.get("type") == "run" and isinstance(head.get("config"), dict) \
        else None


def open_log(path, head, resume_step=None, also=None):
    """train.py's log.jsonl as a function log(record), which appends the record with the wall-clock time (and calls
    also(record), if given). A new run's log starts with head, the record that names the run (a log left by this
    run killed before its first save is replaced). On a resume the file is first cut back: only the train and eval
    records it wrote after resume_step go (the run repeats those steps), and a record of a killed run cut short at
    the end. Every other line stays where it is: a user's note, a record whose step is not a whole number, a damaged
    byte. An old log gets head at its top."""
    line = lambda r: (json.dumps(r) + "\n").encode()
    kept = [line(head)]
    if resume_step is not None and os.path.exists(path):
        try:
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
        except OSError as e:
            raise SystemExit(f"train: cannot read {path} ({e.strerror or e})")
        cut = lines.pop()  # b"" after a whole last line; else the last line has no end
        if cut and not cut.startswith(b'{"type": '):  # not a record of ours cut short: someone else's, kept whole
            lines.append(cut)
        records = [raw + b"\n" for raw in lines if not repeated(raw, resume_step)]
        kept = records if log_head(path) else kept + records
    atomic_write(path, lambda f: f.writelines(kept))
    try:
        f = open(path, "a")
    except OSError as e:
        raise SystemExit(f"train: cannot write {path} ({e.strerror or e})")

    def log(record):
        record["time"] = round(time.time(), 1)  # how long a run took, across resumes
        try:
            f.write(json.dumps(record) + "\n")
            f.flush()
        except OSError as e:  # a full disk: the log line is lost, ckpt.pt is as last saved
            raise SystemExit(f"train: cannot write {path} ({e.strerror or e}); continue with --init_from=resume once "
                             "there is space") from None
        if also:
            also(record)
    return log

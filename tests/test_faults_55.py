"""Issue #55: what a second adversarial battery found, one test (or a few) per cause (the studies' causes 2, 6 and
cause 1 in study_glue.py: test_faults_55_studies.py). Each fails on the code before the fix: a traceback, a silently
wrong result, or a user's line deleted."""
import json
import os
import shutil

import pytest
import torch

import configurator
import export_hf
import finetune_glue as fg
import sample
from conftest import run_script
from lib.checkpoint import load_checkpoint, model_id
from lib.device import set_up
from lib.run import open_log
from model import Bert, BertConfig
from test_glue import run as run_glue, save_ckpt, synthetic
from test_train import TINY, one_line_error, run_train


# ---- 8: a user's file where train.py keeps a folder is one line, and kept ---------------------------------------
def test_8_a_file_named_snapshots_is_one_line_and_kept(data_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "snapshots").write_text("my notes")
    p = run_script("train.py", *TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--max_iters=2")
    one_line_error(p, "snapshots is a file, where train.py keeps its snapshots/ folder: move it away")
    assert (out / "snapshots").read_text() == "my notes" and sorted(os.listdir(out)) == [".lock", "snapshots"]


# ---- 7: a resume cuts back only the records it repeats: a user's lines stay -----------------------------------
def test_7_a_resume_keeps_every_log_line_it_did_not_write(tmp_path):
    path = tmp_path / "log.jsonl"
    head = {"type": "run", "step": 0, "run_id": "r", "config": {}, "data": None}
    rec = lambda kind, step: json.dumps({"type": kind, "step": step, "loss": 5.0})
    mine = [json.dumps({"type": "note", "step": "after the lr change", "text": "lr halved"}), "plain words, no JSON",
            json.dumps({"type": "eval", "step": 3.5, "loss": 1.0})]  # lines train.py did not write
    lines = [json.dumps(head), rec("eval", 0), rec("train", 1), rec("eval", 2), mine[0], rec("train", 3), mine[1],
             rec("eval", 4), mine[2]]
    path.write_text("\n".join(lines) + "\n" + rec("train", 5)[:20])  # a killed run's record, cut short
    open_log(str(path), head, resume_step=2)
    assert path.read_text().splitlines() == lines[:5] + mine[1:]  # steps 3 and 4 are repeated, the cut record goes
    path.write_text("\n".join(lines[:5]) + "\nmy last words")  # a user's line without its newline: kept whole
    open_log(str(path), head, resume_step=2)
    assert path.read_text().splitlines() == lines[:5] + ["my last words"]


# ---- 4: settings that would make the work meaningless are refused in one line -----------------------------------
SMALL_BENCH = ["--attention_types=original", "--modes=eager", "--hf_modes=", "--seq_lens=", "--warmup=1", "--steps=1",
               "--repeats=1", "--n_layer=1", "--n_head=2", "--n_embd=32", "--n_inner=64", "--block_size=32",
               "--matmul_size=64", "--dtypes=float32"]


@pytest.mark.parametrize("script,args,msg", [
    ("finetune_glue.py", ["--init_from=x.pt", "--max_seq_len=2"], "max_seq_len must hold [CLS] a [SEP] b [SEP]"),
    ("finetune_glue.py", ["--init_from=x.pt", "--max_seq_len=4", "--tasks=rte"], "at least 5 (3 for cola and sst2"),
    ("bench.py", SMALL_BENCH + ["--latency=1x"], "latency must be a comma list of batch x sequence shapes"),
    ("bench.py", SMALL_BENCH + ["--latency=0x128"], "latency must be a comma list of batch x sequence shapes"),
    ("bench.py", SMALL_BENCH + ["--mask_prob=0.01"], "mask_prob 0.01 predicts no position of a 32-token sequence")])
def test_4_settings_that_make_the_work_meaningless_are_refused(script, args, msg, monkeypatch):
    import bench  # here: it is a script, its globals set per test
    mod = {"finetune_glue.py": fg, "bench.py": bench}[script]
    config = configurator.configure(dict(vars(mod)), argv=["--device=cpu", *args])  # as the script's start does
    for key, value in config.items():
        monkeypatch.setattr(mod, key, value)
    with pytest.raises(SystemExit) as e:
        fg.make_settings(config) if mod is fg else bench.main()  # a traceback, or timings of nothing, before
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_4_an_input_too_short_for_a_pair_is_never_made():
    rows = [("the red dog sat on the mat", "a blue car on the road", 1)]
    with pytest.raises(SystemExit, match="max_seq_len 4 holds no pair: at least 5"):
        fg.encode(rows, 4)  # the cut went below 0: the inputs came out longer than max_seq_len
    assert fg.encode(rows, 5)["len"].tolist() == [5] and fg.encode(rows[:1], 9)["len"].tolist() == [9]


# ---- 3: Ctrl-C in any script: one line, exit 130, the finished work kept -----------------------------------------
def interrupted(script, args, after):
    """python script args, with a Ctrl-C (SIGINT to itself) just after the first call of `after` (module.function)
    returns: an interrupt at a known point of its work."""
    mod, fn = after.rsplit(".", 1)
    code = (f"import os, runpy, signal, sys\nsys.argv = [{script!r}, *{[str(a) for a in args]!r}]\nimport {mod}\n"
            f"real = {mod}.{fn}\ndef hit(*a, **k):\n    out = real(*a, **k)\n    os.kill(os.getpid(), signal.SIGINT)\n"
            f"    return out\n{mod}.{fn} = hit\nrunpy.run_path({script!r}, run_name='__main__')\n")
    return run_script("-c", code)


def one_line_stop(p, msg):
    assert p.returncode == 130 and msg in p.stderr and "Traceback" not in p.stderr, (p.returncode, p.stderr[-2000:])
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]


def test_3_ctrl_c_during_fine_tuning_is_one_line_and_keeps_the_finished_results(tmp_path):
    synthetic(tmp_path / "glue", 64, 32)
    out = tmp_path / "out"
    args = [f"--init_from={save_ckpt(tmp_path / 'ckpt.pt')}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte",
            "--seeds=1,2", "--epochs=1", "--max_seq_len=32", "--device=cpu", f"--out_dir={out}"]
    p = interrupted("finetune_glue.py", args, "lib.files.write_json")  # right after seed 1's result is written
    one_line_stop(p, f"finetune_glue: interrupted by signal 2; the results finished so far are kept in {out}")
    assert list(json.loads((out / "glue_results.json").read_text())["runs"]["rte"]) == ["1"]
    p = run_script("finetune_glue.py", *args)
    assert p.returncode == 0 and "rte seed 1: done already" in p.stdout and "rte seed 2: rte" in p.stdout


def test_3_ctrl_c_during_an_export_is_one_line_and_leaves_no_half_file(tmp_path):
    args = [f"--init_from={save_ckpt(tmp_path / 'ckpt.pt')}", f"--out_dir={tmp_path / 'hf'}"]
    p = interrupted("export_hf.py", args, "os.fsync")  # after the first file written beside the old export
    one_line_stop(p, "export_hf: interrupted by signal 2; no file was left half-written")
    assert not (tmp_path / "hf").exists()  # the new files go with it, and the folder made for them


# ---- 5: what a record says is what ran ----------------------------------------------------------------------------
def test_5_a_compiled_step_on_a_cpu_gives_the_same_numbers_every_time():
    """train.py's compiled step added the embedding's gradient (a scatter) with atomic adds in thread order: four quick
    starts gave four step-10 losses. set_up makes a CPU deterministic."""
    was = torch.are_deterministic_algorithms_enabled()
    try:
        set_up("cpu", "float32")
        g = torch.Generator().manual_seed(0)
        ids, up = torch.randint(0, 50, (16384,), generator=g), torch.randn(16384, 64, generator=g)  # ids repeat
        w = torch.randn(1000, 64, generator=g, requires_grad=True)
        step = torch.compile(lambda w: (torch.nn.functional.embedding(ids, w) * up).sum())
        grads = []
        for _ in range(6):
            w.grad = None
            step(w).backward()
            grads.append(w.grad.clone())
        assert all(torch.equal(grads[0], x) for x in grads[1:])  # bit for bit
    finally:
        torch.use_deterministic_algorithms(was)


def test_5_the_model_card_of_a_budget_run_describes_the_schedule_it_ran():
    cfg = BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, block_size=64)
    config = {"dataset": "builtin", "batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 1e-3,
              "warmup_iters": 10_000, "decay_lr": True, "max_iters": 100_000, "max_minutes": 0.1, "dtype": "float32",
              "seed": 3}
    ck = {"model": Bert(cfg).state_dict(), "model_args": vars(cfg), "config": config, "iter_num": 7, "spent": 6.2}
    card = export_hf.model_card(ck, export_hf.hf_weights(cfg, ck["model"]))
    assert "step 100,000" not in card and "on a budget of 0.1 minutes of training steps" in card
    assert "warm-up over the first 10.0%, then linear decay to 0, reached as the budget ran out at step 7" in card
    card = export_hf.model_card({**ck, "spent": 3.0}, export_hf.hf_weights(cfg, ck["model"]))  # a snapshot on the way
    assert "then linear decay to 0 as the budget runs out (or at step 100,000, if sooner)" in card


def test_5_the_untrained_model_is_the_runs_own_after_a_resume_with_another_seed(data_dir, tmp_path):
    out = str(tmp_path / "run")
    args = [*TINY, f"--dataset={data_dir}", f"--out_dir={out}", "--eval_interval=2"]
    run_train(*args, "--max_iters=2", "--seed=1")
    run_train(*args, "--max_iters=4", "--seed=2", "--init_from=resume")
    ck = load_checkpoint(os.path.join(out, "ckpt.pt"))
    torch.manual_seed(1)  # train.py's step 0: the seed the run started with
    want = Bert(BertConfig(**ck["model_args"])).state_dict()
    got = sample.untrained_model(ck).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    card = export_hf.model_card(ck, export_hf.hf_weights(BertConfig(**ck["model_args"]), ck["model"]))
    assert "seed 1 (resumed with seed 2)" in card


# ---- 1: a result names the model it came from, never another's at the same path ----------------------------------
def test_1_results_are_of_a_model_not_of_a_path(tmp_path):
    synthetic(tmp_path / "glue", 64, 32)
    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "out"
    args = [f"--data_dir={tmp_path / 'glue'}", "--tasks=rte", "--seeds=1", "--epochs=1", f"--out_dir={out}"]
    save_ckpt(ckpt, seed=1)
    assert run_glue(f"--init_from={ckpt}", *args).returncode == 0  # without its classifier
    shutil.copy(ckpt, tmp_path / "copy.pt")  # the same model elsewhere: its results are the same model's; the pair
    p = run_glue(f"--init_from={tmp_path / 'copy.pt'}", *args, "--save_models=True")  # was done, but its classifier
    assert p.returncode == 0 and "its classifier was not kept: fine-tuned again" in p.stdout, p.stderr[-2000:]
    named = json.loads((out / "glue_results.json").read_text())["protocol"]["pretrained"]
    assert torch.load(out / "rte_s1.pt", weights_only=True)["pretrained"] == named == model_id(torch.load(ckpt))
    first = (out / "glue_results.json").read_text()
    save_ckpt(ckpt, seed=2)  # another model retrained at the same path, at the same step
    one_line_error(run_glue(f"--init_from={ckpt}", *args), "glue_results.json holds the results of another model "
                                                         "(run (no id) at step 0")
    assert (out / "glue_results.json").read_text() == first  # the first model's results, left as they are


def test_1_a_benchmark_step_of_another_model_is_refused_before_any_compute(tmp_path):
    synthetic(tmp_path / "glue", 64, 32)
    run = tmp_path / "train"
    os.makedirs(run / "snapshots")
    for step in (100, 200):
        save_ckpt(run / "snapshots" / f"ckpt_{step:07d}.pt", iter_num=step, seed=step)
    args = [f"--benchmark={run}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte", "--seeds=1", "--epochs=1",
            f"--out_dir={tmp_path / 'bench'}"]
    assert run_glue(*args).returncode == 0
    bench = (tmp_path / "bench" / "benchmark.json").read_text()
    for step in (100, 200, 300):  # the run trained again in the same folder: other weights at the same steps
        save_ckpt(run / "snapshots" / f"ckpt_{step:07d}.pt", iter_num=step, seed=step + 1)
    one_line_error(run_glue(*args), "step_0000100/glue_results.json holds the results of another model")
    assert (tmp_path / "bench" / "benchmark.json").read_text() == bench and not (tmp_path / "bench" /
                                                                                 "step_0000300").exists()


# ---- the third battery (#57): a model card says what ran, a benchmark row what it timed -----------------------------
def test_57_the_model_card_says_when_a_run_was_untrained_or_cut_short():
    cfg = BertConfig(n_layer=1, n_head=2, n_embd=32, n_inner=64, block_size=64)
    config = {"dataset": "builtin", "batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 1e-4,
              "warmup_iters": 10, "decay_lr": True, "max_iters": 400, "max_minutes": 0.0, "dtype": "float32", "seed": 3}
    ck = {"model": Bert(cfg).state_dict(), "model_args": vars(cfg), "config": config, "iter_num": 79}
    card = lambda **kw: export_hf.model_card({**ck, **kw}, export_hf.hf_weights(cfg, ck["model"]))
    assert "then linear decay to 0 at step 400, but it ended at step 79, its last at lr 8.26e-05, before the " \
           "schedule's end" in card()  # stopped by a signal
    assert "ended at step 4, its last at lr 3e-08, within the warm-up" in card(
        iter_num=4, config={**config, "warmup_iters": 10_000, "max_iters": 4})  # never reached its lr
    untrained = card(iter_num=0, config={**config, "max_iters": 0})
    assert "no optimizer step was taken" in untrained and "It is untrained" in untrained
    assert "pre-trained only" not in untrained and "linear decay" not in untrained
    assert "but it ended" not in card(iter_num=400)  # a whole run: its schedule as it ran


def test_57_a_benchmark_row_that_sets_a_key_twice_is_refused():
    import bench
    with pytest.raises(SystemExit, match="sets fused_qkv twice"):
        bench.parse_row("original+fused_qkv+fused_qkv=False", ["original"], "ours")

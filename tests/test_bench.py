"""bench.py: it runs and prints its tables at a tiny shape (and the profile's categories); bad options are one line."""
import json
import os

import pytest

from conftest import run_script

try:
    import transformers  # noqa: F401  (not a requirement of the project: Hugging Face's rows need it)
    HAVE_HF = True
except ImportError:
    HAVE_HF = False


def bench(*args):
    return run_script("bench.py", *args, timeout=300)


TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--n_inner=64", "--vocab_size=512", "--block_size=32",
        "--batch_size=2", "--modes=eager", "--warmup=1", "--steps=1", "--repeats=1", "--matmul_size=64"]


def test_bench_runs_and_reports_every_operator_in_both_precisions():
    p = bench(*TINY, "--hf_modes=", "--dtypes=float32,bfloat16", "--seq_lens=64,128")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {(r[0].lstrip("| "), r[1]): r for r in (line.split(" | ") for line in p.stdout.splitlines()
                                                    if line.startswith("| ours"))}
    ops = ("original", "symmetric", "pairwise", "additive", "hybrid")
    assert set(rows) == {(f"ours, {op}", dtype) for op in ops for dtype in ("float32", "bfloat16")}
    for row in rows.values():  # tokens/s is the batch's 64 tokens over the step time printed beside it
        assert float(row[4].replace(",", "")) == pytest.approx(64 / (float(row[3]) / 1e3), rel=0.01)
    assert "matmul peak here (64 x 64): float32 " in p.stdout and ", bfloat16 " in p.stdout
    ratios = dict(part.rsplit(" ", 1) for part in p.stdout.split("bf16 over float32, per model: ")[1]
                  .splitlines()[0].split(", "))
    for op in ops:  # each model's bf16-over-float32 speed-up is the ratio of its two step times
        want = float(rows[(f"ours, {op}", "float32")][3]) / float(rows[(f"ours, {op}", "bfloat16")][3])
        assert float(ratios[op].rstrip("x")) == pytest.approx(want, rel=0.05, abs=0.01)
    assert "| additive |" in p.stdout  # the seq-len table


def test_bench_compares_with_hugging_face_at_the_same_precision():
    pytest.importorskip("transformers")
    p = bench(*TINY, "--dtypes=bfloat16", "--attention_types=pairwise", "--seq_lens=")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line.split(" | ") for line in p.stdout.splitlines() if line.startswith("| HF") or line.startswith("| ours")]
    assert [r[1] for r in rows] == ["bfloat16", "bfloat16"]
    hf_ms, ours_ms, ratio = float(rows[0][3]), float(rows[1][3]), float(rows[1][5].rstrip("x"))
    assert ratio == pytest.approx(hf_ms / ours_ms, rel=0.02) and rows[0][5] == "1.00x"


def test_bench_profile_accounts_for_the_step():
    """--profile: every model's step by category; the categories add up to the profiled step, matmuls are found in
    ours and in Hugging Face's, and its matmuls alone take less than the step that holds them."""
    pytest.importorskip("transformers")
    p = bench(*TINY, "--dtypes=float32", "--attention_types=original", "--seq_lens=", "--profile", "--repeats=2")
    assert "USDT:" not in p.stderr, p.stderr[-2000:]  # torch 2.13's profiler writes 2 lines a profile to stderr
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("| category |")):]
    cells = {row.split(" | ")[0].lstrip("| "): row.strip("| ").split(" | ")[1:] for row in table[2:] if "|" in row}
    ms = lambda cell: float(cell.split(" (")[0])
    for col in range(2):  # HF, ours
        parts = [ms(v[col]) for k, v in cells.items() if not k.startswith("*")]
        shares = [float(v[col].split("(")[1].rstrip("%)")) for k, v in cells.items() if not k.startswith("*")]
        assert sum(shares) == pytest.approx(100, abs=len(shares))  # rounded shares of one whole
        assert ms(cells["matmuls"][col]) > 0 and sum(parts) > 0
        assert float(cells["*its matmuls alone, at its shapes*"][col]) < float(cells["*the step, timed*"][col])
    row = next(line for line in lines if line.startswith("| ours, original | float32 |")).split(" | ")
    assert row[6].endswith("%") and row[7].rstrip(" |").endswith("%")  # of the peak, of its matmuls


@pytest.mark.parametrize("bad,msg", [("--modes=compile", "unknown mode 'compile'"),
                                     ("--attention_types=asym", "unknown attention type 'asym'"),
                                     ("--device=cuda:7", "is not available here"),
                                     ("--dtypes=float16", "would need a GradScaler"),
                                     ("--dtypes=fp8", "dtype must be auto, float32")])
def test_bad_options_are_one_line(bad, msg):
    p = bench(bad)
    assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-1000:]


def test_a_fused_kernel_is_counted_where_its_largest_part_belongs():
    import bench  # a compiled graph names a kernel after everything it fuses: the embedding's gradient is not dropout's
    assert bench.category("graph_1_cpp_fused__to_copy_add_embedding_dense_backward_native_dropout_backward_0") == \
        "embedding"
    assert bench.category("graph_0_cpp_fused_gelu_native_dropout_3") == "norm, activation, dropout"
    assert bench.category("aten::bernoulli_") == "norm, activation, dropout"
    assert bench.category("aten::addmm") == "matmuls"


def test_latency_mode_and_the_json_of_step_times(tmp_path):
    """--latency: forward-only ms per batch of a classifier per operator and shape, written to --json with the ratios
    printed against the first operator; the training table's --json holds each of ours, '+sub_ln' included."""
    p = bench(*TINY, "--dtypes=float32", "--attention_types=original,hybrid+sub_ln", "--latency=1x16,2x64",
              f"--json={tmp_path}/lat.json")
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads((tmp_path / "lat.json").read_text())["ms_per_forward"]
    assert set(got) == {f"{t} {s}" for t in ("original", "hybrid+sub_ln") for s in ("1x16", "2x64")}
    row = next(line for line in p.stdout.splitlines() if line.startswith("| hybrid+sub_ln |")).split(" | ")
    want = got["hybrid+sub_ln 2x64"] / got["original 2x64"]
    assert row[2].startswith(f"{got['hybrid+sub_ln 2x64']:.1f} ({want:.2f}x)")
    p = bench(*TINY, "--hf_modes=", "--seq_lens=", "--dtypes=float32", "--attention_types=pairwise,hybrid+sub_ln",
              f"--json={tmp_path}/steps.json")
    assert p.returncode == 0, p.stderr[-2000:]
    steps = json.loads((tmp_path / "steps.json").read_text())["ms_per_step"]
    assert set(steps) == {"pairwise", "hybrid+sub_ln"} and all(v > 0 for v in steps.values())


def test_sub_ln_spec_builds_the_sub_layer_norms():
    import bench as b
    assert b.config("hybrid+sub_ln").sub_ln and b.config("hybrid+sub_ln").attention_type == "hybrid"
    assert not b.config("hybrid").sub_ln


def test_matmuls_alone_reads_a_profile_with_or_without_strides_and_dtypes(monkeypatch):
    """PyTorch < 2.12's profiler records shapes only (a GPU machine had 2.11): the matmuls are then timed on
    contiguous inputs in the step's dtype; with strides and dtypes recorded, those are used. FLOPs: 2 m k n."""
    from types import SimpleNamespace

    import torch

    import bench

    old = SimpleNamespace(name="aten::mm", input_shapes=[[4, 8], [8, 16]])
    new = SimpleNamespace(name="aten::addmm", input_shapes=[[16], [4, 8], [8, 16], [], []],
                          structured_input_strides=[[1], [8, 1], [1, 8]], input_dtypes=["float", "c10::BFloat16"])
    made, real = [], torch.empty_strided
    monkeypatch.setattr(torch, "empty_strided", lambda s, st, dtype, device: made.append((tuple(s), tuple(st), dtype))
                        or real(s, st, dtype=dtype, device=device))
    prof = SimpleNamespace(events=lambda: [old, old, new, SimpleNamespace(name="aten::add", input_shapes=[])])
    flops, seconds = bench.matmuls_alone(prof, "float32")
    assert flops == 2 * (2 * 4 * 8 * 16) + 2 * 4 * 8 * 16 and seconds > 0
    assert made == [((4, 8), (8, 1), torch.float32), ((8, 16), (16, 1), torch.float32),
                    ((16,), (1,), torch.bfloat16), ((4, 8), (8, 1), torch.bfloat16), ((8, 16), (1, 8), torch.bfloat16)]


def test_the_json_names_the_run_and_every_rows_levers(tmp_path):
    """--json (issue #54): the device, torch, date and shape, the matmul peak measured in the run, the SDPA kernels
    alone (--attention_kernels), and per row its model, mode, dtype, every lever's setting, tokens per optimizer step
    (batch x accum x T), ms/step, tokens/s and MFU, at its own FLOPs and at original BERT's (the same for every row
    of one shape and batch), the categories of --profile; NaN never (JSON has none)."""
    specs = ["original", "original+fused_qkv+fused_loss+sdpa_backend=math", "pairwise+batch_size=4+accum=2",
             "original+vocab_size=576+attention_dropout=0.0"]
    p = bench(*TINY, "--dtypes=float32", "--seq_lens=", f"--attention_types={','.join(specs)}", "--peak_flops=1e12",
              f"--hf_modes={'eager,eager+vocab_size=576' if HAVE_HF else ''}", "--attention_kernels", "--profile",
              "--profile_steps=1", f"--json={tmp_path}/run.json")
    assert p.returncode == 0, p.stderr[-2000:]
    text = (tmp_path / "run.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    run = json.loads(text)
    assert run["device"].startswith("CPU") and run["torch"] and run["date"].startswith("20")
    assert run["shape"] == {"n_layer": 1, "n_head": 2, "n_embd": 32, "n_inner": 64, "block_size": 32, "batch_size": 2,
                            "vocab_size": 512, "mask_prob": 0.15}
    assert run["matmul_peak_flops_per_s"]["float32"] > 0 and run["datasheet_peak_flops_per_s"] == {"float32": 1e12}
    assert run["skipped"] == [] and run["failed"] == [] and "--attention_kernels" in run["command"]
    assert run["attention_kernels"]["math, dropout 0.1"]["fwd_bwd_ms"] > 0
    assert "error" in run["attention_kernels"]["cudnn, dropout 0.1"]  # no cuDNN on a CPU: said, not fatal
    rows = run["rows"]
    assert [r["spec"] for r in rows] == (["eager", "eager+vocab_size=576"] if HAVE_HF else []) + specs
    assert [r["model"] for r in rows[-4:]] == ["ours-original", "ours-original", "ours-pairwise", "ours-original"]
    for r in rows:
        assert r["dtype"] == "float32" and r["mode"] == "eager" and r["ms_per_step"] > 0
        s = r["settings"]
        assert set(s) == {"sub_ln", "attention_dropout", "fused_qkv", "fused_loss", "sdpa_backend", "compile_mode",
                          "compile_optimizer", "vocab_size", "batch_size", "accum"}
        assert r["tokens_per_step"] == s["batch_size"] * s["accum"] * 32
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["ms_per_step"] * 1e3)
        assert r["mfu"] == pytest.approx(r["flops_per_step"] / r["ms_per_step"] * 1e3 / 1e12)
        assert r["mfu_bert"] == pytest.approx(r["flops_per_step_bert"] / r["ms_per_step"] * 1e3 / 1e12)
        assert r["of_peak"] > 0 and r["build_s"] > 0 and sum(r["ms_by_category"].values()) > 0
    base, fused, big, padded = rows[-4:]
    assert fused["settings"] | {"fused_qkv": False, "fused_loss": False, "sdpa_backend": "auto"} == base["settings"]
    assert big["tokens_per_step"] == 4 * base["tokens_per_step"] == 256
    assert big["flops_per_step_bert"] == pytest.approx(4 * base["flops_per_step_bert"])
    assert padded["settings"]["vocab_size"] == 576 and padded["settings"]["attention_dropout"] == 0.0
    assert padded["flops_per_step"] > base["flops_per_step"] == base["flops_per_step_bert"]  # the padding's FLOPs
    assert padded["flops_per_step_bert"] == base["flops_per_step_bert"]  # are no part of the comparable count
    assert "attention_math" in base["attention_op"]  # dropout 0.1 on a CPU: the math kernel
    if HAVE_HF:  # HF's vocabulary head runs at every position: its own count is larger, the comparable one the same
        assert rows[0]["model"] == "hf" and rows[0]["flops_per_step"] > rows[0]["flops_per_step_bert"]
        assert rows[0]["flops_per_step_bert"] == base["flops_per_step_bert"]
    assert run["ms_per_step"] == {r["spec"]: r["ms_per_step"] for r in rows if r["model"] != "hf"}
    n = len(rows) - 1  # the printed table of the levers, big's row
    assert f"| #{n} | ours, pairwise+batch_size=4+accum=2 | float32 | eager | 256 | {big['mfu_bert']:.1%} |" in p.stdout


def test_rows_past_the_build_budget_are_skipped_and_a_failing_row_is_left_out(monkeypatch):
    """build_rows: a row not started within build_budget is skipped, one that raises (a kernel that cannot take the
    input, out of memory) is reported and the others are built; a row with a compile_mode is compiled in that mode,
    its optimizer too with compile_optimizer (both recorded here, not run: compiling is the GPU's part)."""
    import bench as b

    for k, v in dict(n_layer=1, n_head=2, n_embd=32, n_inner=64, vocab_size=512, block_size=32, batch_size=2,
                     modes="eager", hf_modes="", warmup=1, steps=1, repeats=1, build_budget=45.0).items():
        monkeypatch.setattr(b, k, v)
    monkeypatch.setattr(b, "attention_types", "original,original+sdpa_backend=cudnn,"
                        "original+compile_mode=reduce-overhead+compile_optimizer,symmetric,pairwise")
    ticks = iter(range(0, 1000, 10))
    monkeypatch.setattr(b, "clock", lambda: next(ticks))  # 10 s per look: the 5th row starts at 50 s > 45
    compiled = []
    monkeypatch.setattr(b, "compile_model", lambda m, dt, mode="default": compiled.append(("model", mode)) or m)
    real_prepare, real_ours = b.prepare_optimizer, b.ours
    monkeypatch.setattr(b, "prepare_optimizer", lambda opt, dt, c=False, mode="default": compiled.append(
        ("optimizer", c, mode)) or real_prepare(opt, dt, False, mode))

    def ours(head, T=None, settings=None):
        if settings["sdpa_backend"] == "cudnn":
            raise RuntimeError("No available kernel. Aborting execution.")
        return real_ours(head, T, settings)
    monkeypatch.setattr(b, "ours", ours)
    skipped, failed = [], []
    rows = b.build_rows(b.plan_rows(["float32"]), None, skipped, failed)
    assert [r.spec for r in rows] == ["original", "original+compile_mode=reduce-overhead+compile_optimizer",
                                      "symmetric"]
    assert rows[1].mode == "reduce-overhead" and ("model", "reduce-overhead") in compiled
    assert ("optimizer", True, "reduce-overhead") in compiled and ("optimizer", False, "default") in compiled
    assert failed == [{"row": "ours, original+sdpa_backend=cudnn, float32, eager",
                       "why": "RuntimeError: No available kernel. Aborting execution."}]
    assert skipped == [{"row": "ours, pairwise, float32, eager", "why": "the build budget (45 s) was spent"}]


@pytest.mark.parametrize("bad,msg", [("--attention_types=original+fast", "unknown row setting 'fast'"),
                                     ("--attention_types=original+batch_size=x", "batch_size must be int"),
                                     ("--attention_types=original+sdpa_backend=fa3", "sdpa_backend 'fa3' (one of"),
                                     ("--attention_types=original+compile_mode=fast", "compile_mode 'fast' (one of"),
                                     ("--attention_types=original+vocab_size=100", "vocab_size must be the run's"),
                                     ("--hf_modes=eager+fused_qkv", "unknown row setting 'fused_qkv'"),
                                     ("--hf_modes=eager+compile_mode=max-autotune", "is run eagerly"),
                                     ("--build_budget=-1", "build_budget, profile_steps and peak_flops >= 0"),
                                     ("--peak_flops=-1e12", "profile_steps and peak_flops >= 0"),  # a negative MFU
                                     ("--n_head=5", "must be divisible by n_head (5)")])  # every row, the latency too
def test_bad_row_settings_are_one_line(bad, msg):
    p = bench(bad)
    assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-1000:]


def test_a_sigterm_while_rows_are_built_reports_the_rows_built(tmp_path):
    """A time limit (timeout's SIGTERM) while the rows are built: no more rows are built, those built are timed and
    written to the JSON, the rest named as stopped; the run exits 0."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    specs = ",".join(f"{r}+accum={k}" for k in (1, 2, 3, 4)  # 20 rows, each named once
                     for r in ["original", "symmetric", "pairwise", "original+fused_qkv", "pairwise+fused_qkv"])
    p = subprocess.Popen([sys.executable, "bench.py", *TINY, "--hf_modes=", "--seq_lens=", "--dtypes=float32",
                          f"--attention_types={specs}", f"--json={tmp_path}/run.json"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ,
                                                                                        "OMP_NUM_THREADS": "1"})
    lines = []
    deadline = time.time() + 240
    while time.time() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        if line.startswith("  ready:") and sum(x.startswith("  ready:") for x in lines) == 2:
            p.send_signal(signal.SIGTERM)
            break
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert 2 <= len(run["rows"]) < 20 and len(run["rows"]) + len(run["skipped"]) == 20 and run["failed"] == []
    assert all("stopped (SIGTERM)" in s["why"] for s in run["skipped"])
    assert all(r["ms_per_step"] > 0 for r in run["rows"])


def test_after_the_rows_are_built_a_sigterm_is_the_scripts_one_line_again(monkeypatch):
    """The handler that stops the building was put back to SIG_DFL, not to the script's own (lib/interrupt.py): a
    SIGTERM while the rows were timed killed bench.py with no line."""
    import signal
    import bench as b
    own, seen = (lambda signum, frame: None), []
    monkeypatch.setattr(b, "build_rows", lambda *a: [])
    monkeypatch.setattr(b, "median_step_times", lambda fns, warm=False: seen.append(signal.getsignal(
        signal.SIGTERM)) or [1.0] * len(fns))
    monkeypatch.setattr(b, "matmul_size", 8)
    monkeypatch.setattr(b, "hf_modes", "")
    previous = signal.signal(signal.SIGTERM, own)
    try:
        with pytest.raises(SystemExit, match="no row was built"):
            b.main()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [own]  # while timing: the handler it had before the building


def test_sdpa_backend_fastest_is_the_fastest_kernel_that_ran():
    import bench as b

    kernels = {"auto, dropout 0.1": {"fwd_bwd_ms": 3.0}, "cudnn, dropout 0.1": {"fwd_bwd_ms": 2.0},
               "flash, dropout 0.1": {"fwd_bwd_ms": 3.0}, "efficient, dropout 0.1": {"error": "No available kernel"},
               "math, dropout 0.1": {"fwd_bwd_ms": 1.0},  # never picked: it is what the fused kernels replace
               "auto, dropout 0.0": {"fwd_bwd_ms": 2.5}, "cudnn, dropout 0.0": {"error": "x"},
               "flash, dropout 0.0": {"fwd_bwd_ms": 2.0}}
    assert b.fastest_backend(kernels, None) == b.fastest_backend(kernels, 0.1) == "cudnn"
    assert b.fastest_backend(kernels, 0.0) == "flash"
    assert b.fastest_backend({"cudnn, dropout 0.1": {"error": "x"}}, None) == "auto"


def test_json_never_replaces_a_file_bench_did_not_write(tmp_path, monkeypatch):
    """#72 cause 7: --json replaced whatever file was at its path. Now, before any timing: nothing there, or a JSON run
    of bench.py's own (each kind it ever wrote, the committed ones too) is written; a user's file, a JSON of another
    kind, a folder are one line and left as they are."""
    import bench as b
    from conftest import ROOT
    for name, content in (("notes.txt", "my notes\n"), ("other.json", '{"device": "x", "rows": []}'),
                          ("empty.json", "")):
        (tmp_path / name).write_text(content)
    (tmp_path / "folder").mkdir()
    monkeypatch.setattr(b, "modes", "never")  # were --json checked late, a quick refusal of this instead
    for name in ("notes.txt", "other.json", "empty.json", "folder"):
        monkeypatch.setattr(b, "json", str(tmp_path / name))
        with pytest.raises(SystemExit, match=f"--json={tmp_path / name} is there and is no JSON run of bench.py's: "
                                             "it is left as it is"):
            b.main()  # refused first: nothing is timed
    assert (tmp_path / "notes.txt").read_text() == "my notes\n" and (tmp_path / "folder").is_dir()
    for ours in ("assets/study_glue/step_times.json", "assets/study_glue/latency.json"):
        b.check_json_path(os.path.join(ROOT, ours))  # a run of its own: replaced by the new one
    b.check_json_path(str(tmp_path / "new.json"))

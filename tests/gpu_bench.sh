#!/usr/bin/env bash
# Issue #54's measurements in one command (docs/performance.md, "Prepared, not run yet"): bench.py at bert-base seq 512
# and seq 128 and at bert-small seq 128, ours beside Hugging Face eager and compiled, each speed lever a row beside
# the baseline, a JSON per part. From the repository root, on the GPU machine:
#   bash tests/gpu_bench.sh [--parts=1,2,3] [--dry]
# 1 bert-base, seq 512, batch 32: SDPA alone per backend; HF eager and compiled; ours original (the baseline), then
#   the levers together (A: the fastest attention kernel + fused QKV; B: A + the paper's 256 sequences per optimizer
#   step; C: A + CUDA graphs + the compiled optimizer), then single levers, largest predicted gain first; --profile
# 2 bert-base, seq 128, batch 128 (the paper's first phase): HF eager and compiled, the baseline, A, B, C
# 3 bert-small, seq 128, batch 128 (the third study's shape): HF eager, the baseline, A, B, C
# 4 (not run by default: a second call) the levers part 1 leaves: single levers at seq 512, max-autotune among them,
#   HF eager with its vocabulary padded to 30528
# Each part is one bench.py run: rows in the order given, a row not started within the part's build budget skipped,
# one that fails (a kernel that cannot take the input) reported; its timeout's SIGTERM stops the building and what was
# built is still timed and written. A part starts only if its timeout fits in what is left of GPU_BENCH_BUDGET (s,
# 540); GPU_BENCH_TIMEOUTS=s1,s2,s3,s4 sets the parts' timeouts, GPU_BENCH_EXTRA more bench.py settings for all.
# --dry: the same plumbing on the CPU at toy shapes, eager (tests/test_gpu_bench.py runs it). Logs and JSONs go to
# $OUT if set (the device tool's), else .gpu/bench: gpu_bench.log, partN.log, and base512.json, base128.json,
# small128.json (part4.json): at most 8 files. Needs PyTorch and transformers; no data, no network, nothing to carry.
set -uo pipefail
PARTS=1,2,3 DRY=0 PY=${PYTHON:-python3} BUDGET=${GPU_BENCH_BUDGET:-540} GRACE=45
for a in "$@"; do
  case $a in
    --dry) DRY=1 ;;
    --parts=*) PARTS=${a#--parts=}; [[ $PARTS =~ ^[1-4](,[1-4])*$ ]] || { echo "gpu_bench: bad $a" >&2; exit 2; } ;;
    *) echo "usage: bash tests/gpu_bench.sh [--parts=1,2,3,4] [--dry]" >&2; exit 2 ;;
  esac
done

A=original+sdpa_backend=fastest+fused_qkv  # the exact levers that change kernels, not the step's structure
CG=compile_mode=reduce-overhead+compile_optimizer  # CUDA graphs, the optimizer step compiled (and graphed) too
ROWS1="original,$A,$A+accum=8,$A+$CG,original+sdpa_backend=cudnn"
ROWS2="original,$A,$A+accum=2,$A+$CG"  # accum 2 x 128 sequences: the paper's 256 per optimizer step
ROWS3="original,$A,$A+accum=2,$A+$CG"
ROWS4="original,original+accum=8,original+compile_mode=max-autotune-no-cudagraphs,original+$CG,original+fused_qkv"
ROWS4+=",original+attention_dropout=0.0,original+vocab_size=30528,original+fused_loss,original+batch_size=64+accum=4"
ROWS4+=",original+sdpa_backend=flash,original+sdpa_backend=efficient,$A+accum=8+compile_mode=max-autotune"
ROWS4+="+compile_optimizer"
HF1=eager,compiled HF2=eager,compiled HF3=eager HF4=eager,eager+vocab_size=30528
BASE="--n_layer=12 --n_head=12 --n_embd=768 --n_inner=3072" SMALL="--n_layer=4 --n_head=8 --n_embd=512 --n_inner=2048"
if ((DRY)); then  # toy shapes on the CPU, eager, one thread (as the tests): the plumbing, not the GPU
  export OMP_NUM_THREADS=1
  COMMON="--device=cpu --dtypes=float32 --modes=eager --warmup=1 --steps=1 --repeats=1 --matmul_size=128 --seq_lens="
  BASE="--n_layer=1 --n_head=2 --n_embd=64 --n_inner=128 --vocab_size=512" SMALL="$BASE"
  S1="--block_size=64 --batch_size=2" S2="--block_size=32 --batch_size=4" S3="--block_size=32 --batch_size=4" S4="$S1"
  T=100,100,100,100 BB=60,30,30,60
  for v in ROWS1 ROWS2 ROWS3 ROWS4; do  # compiling is the GPU's part: what it costs here says nothing (a row that
    # differed only by it is then another's: named once, as bench.py asks)
    printf -v $v '%s' "$(sed -E 's/\+compile_mode=[^+,]*//g; s/\+compile_optimizer//g' <<<"${!v}" | tr , '\n' |
      awk '!seen[$0]++' | paste -sd, -)"; done
  HF1=eager HF2=eager HF3=eager HF4=eager,eager+vocab_size=576
else  # an H100 compiled bert-base in ~25-30 s a model (2026-11-26); the budgets assume that, the timeouts add slack
  COMMON="--device=cuda --dtypes=bfloat16 --modes=compiled --warmup=3 --steps=5 --repeats=3 --seq_lens="
  S1="--block_size=512 --batch_size=32" S2="--block_size=128 --batch_size=128" S3="$S2" S4="$S1"
  T=290,170,75,290 BB=175,115,35,200
fi
COMMON+=" ${GPU_BENCH_EXTRA:-}"  # more bench.py settings for every part (e.g. --repeats=5)
IFS=, read -r T1 T2 T3 T4 <<<"${GPU_BENCH_TIMEOUTS:-$T}"  # seconds per part (then GRACE for the rows built)
IFS=, read -r B1 B2 B3 B4 <<<"$BB"  # seconds of each part in which rows may start building
export PYTHONUNBUFFERED=1 PY COMMON BASE SMALL S1 S2 S3 S4 ROWS1 ROWS2 ROWS3 ROWS4 HF1 HF2 HF3 HF4 B1 B2 B3 B4
export LOG=${OUT:-.gpu/bench}
mkdir -p "$LOG" || exit 1

bench() {  # bench N JSON SHAPE: one bench.py run, its JSON to $LOG/JSON, then its figures
  trap : TERM  # the part's timeout: bench.py stops building and writes what it built; this shell waits for it
  local n=$1 json=$2 shape=$3 rows=ROWS$1 hf=HF$1 budget=B$1 size=S$1 extra=${4:-}
  "$PY" bench.py $COMMON $shape ${!size} --attention_types="${!rows}" --hf_modes="${!hf}" --build_budget="${!budget}" \
    --attention_kernels $extra --json="$LOG/$json" || return
  "$PY" -c 'import json, sys
run = json.load(open(sys.argv[1]))
f = lambda r: "%s %.1f ms%s" % ("HF " + r["spec"] if r["model"] == "hf" else r["spec"] + " " + r["mode"],
                                r["ms_per_step"], " MFU %.1f%%" % (100 * r["mfu"]) if r["mfu"] is not None else "")
ours = [r for r in run["rows"] if r["model"] != "hf"]
best = max(ours, key=lambda r: r["tokens_per_s"], default=None)
print("FIGURES " + "; ".join([f(r) for r in run["rows"] if r["model"] == "hf"] + [f(r) for r in ours[:1]]
      + (["best " + f(best) + (" (at BERT FLOPs %.1f%%)" % (100 * best["mfu_bert"]) if best["mfu_bert"] else "")]
         if best else [])) + "; %d built, %d skipped, %d failed" % (len(run["rows"]), len(run["skipped"]),
                                                                    len(run["failed"])))' "$LOG/$json"
}
part1() { bench 1 base512.json "$BASE" "--profile --profile_steps=2"; }
part2() { bench 2 base128.json "$BASE"; }
part3() { bench 3 small128.json "$SMALL"; }
part4() { bench 4 part4.json "$BASE"; }
export -f bench part1 part2 part3 part4

run() {  # run N NAME: part N under its timeout if that fits in the budget left; its output in $LOG/partN.log
  local n=$1 name=$2 limit=T$1 t0=$SECONDS rc figures
  [[ ,$PARTS, == *,$n,* ]] || return 0
  limit=${!limit}
  if ((SECONDS + limit > BUDGET)); then SUMMARY+=("$n $name: SKIP (its ${limit}s exceed the budget left)"); return; fi
  echo "== part $n: $name (timeout ${limit}s)"
  # SIGTERM at the limit: bench.py stops building and times what it built; SIGKILL GRACE s later if it is still busy
  timeout -k "$GRACE" "$limit" bash -c "part$n" >"$LOG/part$n.log" 2>&1 & PART=$!; wait $PART; rc=$?
  kill -KILL -- -$PART 2>/dev/null; PART=
  grep -E '^\| (ours|HF|#)|^ *(skipped|FAILED|stopped)|^[A-Za-z.]*(Error|Exception)' "$LOG/part$n.log" | tail -n 40
  figures=$(grep '^FIGURES' "$LOG/part$n.log" | tail -n 1 | cut -c9-)
  case $rc in 0) rc=PASS ;; 124 | 137) rc="FAIL (timeout ${limit}s)" ;; *) rc="FAIL (exit $rc)" ;; esac
  SUMMARY+=("$n $name: $rc in $((SECONDS - t0))s${figures:+; $figures}")
}

stop() {  # Ctrl-C or a SIGTERM of this script: timeout runs a part in a process group of its own, which the terminal's
  # Ctrl-C does not reach, so that group is ended here (bench.py's Ctrl-C first, then KILL): nothing runs or writes on
  if [[ -n ${PART:-} ]]; then
    kill -INT -- -"$PART" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- -"$PART" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- -"$PART" 2>/dev/null
  fi
  echo "gpu_bench: stopped by $1; the part that was running was ended, its JSON not written" >&2
  exit 130
}

main() {
  SUMMARY=() PART=
  trap 'stop SIGINT' INT
  trap 'stop SIGTERM' TERM
  echo "gpu_bench: parts $PARTS$( ((DRY)) && echo ', dry (CPU)'), budget ${BUDGET}s, log $LOG"
  ((DRY)) || nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  "$PY" -c 'import importlib.util as u, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
      torch.backends.cudnn.version(), torch.cuda.is_available() and torch.cuda.get_device_name(), "|", ", ".join(
      m + (" present" if u.find_spec(m) else " absent") for m in ("transformers", "triton")))
sys.exit(0 if torch.cuda.is_available() or sys.argv[1] == "1" else "gpu_bench: PyTorch sees no GPU (--dry: CPU)")' \
    "$DRY" || return 1
  run 1 "bert-base seq 512 batch 32: HF, baseline, levers, profile"
  run 2 "bert-base seq 128 batch 128: HF, baseline, levers"
  run 3 "bert-small seq 128 batch 128: HF eager, baseline, levers"
  run 4 "bert-base seq 512: the other levers"
  local gpu again; ((DRY)) && gpu="dry, CPU" || gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  echo; echo "== summary ($gpu, ${SECONDS}s)"
  printf '%s\n' "${SUMMARY[@]}"
  again=$(printf '%s\n' "${SUMMARY[@]}" | grep -v ': PASS' | cut -c1 | paste -sd,)  # a skipped part is no pass
  [ -z "$again" ] || { echo "again: bash tests/gpu_bench.sh --parts=$again$( ((DRY)) && echo ' --dry')"; return 1; }
}
main 2>&1 | tee -i "$LOG/gpu_bench.log"  # -i: a Ctrl-C leaves it to log how main stopped
exit "${PIPESTATUS[0]}"

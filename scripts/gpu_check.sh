#!/usr/bin/env bash
# The one command to run on the GPU machine (one H100, Python 3.12, torch 2.11, Triton 3.6, no network), with
# .whl/ and runs/gpu_sample/ (scripts/gpu_wheels.sh) beside the checkout. It installs the wheels into a private
# folder, prints the versions and the GPU, runs the checks below in order (each timed, each under its own time
# limit, a failed one does not stop the next) and ends with a summary table. Logs and results go to $OUT when it
# is set (the device tool's output folder), else runs/gpu_check/ (--rehearse: runs/gpu_check_rehearse/; with
# --part N, its own partN/ under either, so a later part never deletes an earlier part's files):
# gpu_check.log (every step's output), summary.md (the steps, then the issue's targets judged by
# bench/gpu_targets.py), targets.json, attention.json, train_throughput.json, train_compiled.json, decode.json
# (copy the JSON of a GPU run into bench/results/ to keep them). No .git travels to the GPU machine: name the
# commit the copy is of, NEOX_DAR_GIT_COMMIT=<hash> bash scripts/gpu_check.sh (the hash written out: it is read
# there), and every result file and the summary record it.
#
#   bash scripts/gpu_check.sh --part 1       # --quick, the kernels: kernel-tests, bench-attention (< 7.5 min)
#   bash scripts/gpu_check.sh --part 2       # --quick, training and decoding: train-throughput, decode (< 5.5 min)
#   bash scripts/gpu_check.sh --part 3       # --quick, the long checks: identities, train-profile, train-smoke
#                                            #   (< 8 min)
#   bash scripts/gpu_check.sh --part 4       # --quick, training with torch_compile: train-compiled (< 6 min)
#                                            #   (a session's device lease is 15 minutes, the machine's start
#                                            #   included, and one command at most 10: parts 1 and 2 fit one lease,
#                                            #   which is what the issue's targets are judged on; parts 3 and
#                                            #   4 in later ones, or 2 and 4 in one. A later part on a warm
#                                            #   machine reuses the install)
#   bash scripts/gpu_check.sh                # --quick, every step in one command (over 10 minutes in all)
#   bash scripts/gpu_check.sh --full         # the whole grid and longer timings: ~30 minutes, so split it:
#                                            #   --full --steps kernel-tests,identities   (then bench-attention,
#                                            #   then train-throughput, then train-smoke,decode)
#   bash scripts/gpu_check.sh --steps bench-attention,train-smoke   # a subset, in plan order
#   bash scripts/gpu_check.sh --dry-run      # print the plan (any machine, nothing runs)
#   bash scripts/gpu_check.sh --rehearse     # every step on this machine's CPU at toy sizes (~3 CPU-minutes):
#                                            #   the same commands, result files and summary, differing only in
#                                            #   sizes and device (TRITON_INTERPRET=1; no wheels: this machine's
#                                            #   packages, and the sample tokenized small); CI runs it. Its
#                                            #   timings are the CPU's and the interpreter's, never GPU numbers.
#
# Steps (install and versions always run first):
#   kernel-tests      tests/test_kernels.py compiled on the GPU in fp32/fp16/bf16 (one pinned tile per kernel;
#                     the device-aware tests of the suite, the tiny model through the kernels included; --quick
#                     leaves out the float32 cases of the per-variant matrices: exact float32 products compile to
#                     FMA code, 5-40 s a kernel on a CPU against 1-3 s in bf16; GQA and the tiny model stay float32)
#   identities        the same file's long-sequence checks: bf16, T = 8192, every autotune candidate at d_h = 64,
#                     against SDPA: causal through identities (DAR k_glob = k_loc, DAR w = 0, MSWA windows >= T,
#                     AHA every row routed, GQA) and with the variant's mask (DAR's two key sets, MSWA windows
#                     8..512, AHA 10% routed)
#   bench-attention   bench/attention.py at the issue's shapes (B=8, H=12, d_h=64, T in {2048, 8192}, w=128):
#                     DAR, SWA, MSWA, AHA at 10% routed against SDPA causal flash and (MSWA) flex_attention,
#                     each output checked against the reference first (--full also times MSWA in one launch, the
#                     reference, DAR's SDPA path, flex for every kernel and each backward dq pass fixed);
#                     --profile: the triton and flash rows' kernels, launches and device time against the call's
#                     wall time (where the windowed kernels' fixed cost at T = 2048 goes)
#   train-throughput  bench/train_throughput.py: tokens/s, TFLOP/s, MFU, bf16, ZeRO-1, one GPU (--quick: 160M,
#                     the MFU target's model, the triton path, torch_compile off for vanilla, MSWA, SWA, DAR, AHA
#                     (with 10% of its rows routed: --aha-mu-f 0.1) and on for vanilla and MSWA, in that order:
#                     the time limit, sized for the runs without compile, keeps the runs that finished and cuts
#                     the rest; --full: 70M and 160M, torch_compile
#                     off and on, attention_impl triton and sdpa); each result records the attention kernels
#                     one step ran (SDPA's backend)
#   train-compiled    the same with torch_compile on, for the targets the step above leaves open: 160M vanilla
#                     (the ratios' denominator), DAR, AHA (10% routed), then Pythia-410M vanilla (its MFU target),
#                     in that order; train_compiled.json (left out of the rehearsal, like every compiled run)
#   train-profile     bench/profile_step.py: where a training step's time goes (160M, bf16, ZeRO-1, T = 2048,
#                     2 profiled steps after 3): GPU kernel time per category (matrix products, attention, loss,
#                     optimizer, element-wise) against the step's wall time, for the targets still open first: AHA
#                     (10% routed), DAR, then vanilla and MSWA, and vanilla with torch_compile; one JSON per run
#                     in profile/ and a table in the summary
#   train-smoke       train.py, bf16: 200 steps of Pythia-14M on the tokenized sample, stopped with a checkpoint
#                     at step 100 and resumed; the loss must fall and the resumed run continue from step 101 (the
#                     kernels train in the throughput step)
#   decode            bench/decode.py in bfloat16, the Pythia-160M shape (--quick: contexts 8k and 32k, batch 16),
#                     each variant's decode step first checked against a float32 forward (a failed check: the
#                     step fails, its times are kept, its targets not judged), one more step of each variant
#                     under the profiler (--profile: device time against wall time)
# --rehearse sizes: kernel tests one grouped-query case per kernel (fla's is CUDA only, skipped); identities at
# T = 32 (two 16-row tiles, w = 8) in fp16; bench/attention.py --interpret (B=1, H=4, d_h=16, T=32, w=8, fp32; the
# --quick methods); throughput, profiles and smoke fp32, 2 layers x 64 wide at T = 32 (without the torch_compile
# runs: inductor's C++ build of CPU graphs takes minutes on two cores; tests/test_compile.py trains
# torch_compile=true on the CPU) and 14M at T = 64 for 12 steps (stopped at 6); decode at context 64, batch 1. The
# throughput step's five command lines, the profile step's four and the smoke's two run in forks of one process
# that imported torch, dynamo and DeepSpeed once.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.whl}
SAMPLE=${GPU_SAMPLE:-runs/gpu_sample}
PART=
ALL_STEPS="kernel-tests identities bench-attention train-throughput train-compiled train-profile train-smoke decode"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "gpu_check.sh: error: $*" >&2; exit 2; }

MODE=quick
DRY=0
REHEARSE=0
STEPS=$ALL_STEPS
mode_set=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick|--full)
      [ -n "$mode_set" ] && [ "$mode_set" != "$1" ] && die "--quick and --full exclude each other"
      mode_set=$1; MODE=${1#--} ;;
    --dry-run) DRY=1 ;;
    --rehearse) REHEARSE=1 ;;
    --part)
      case "${2:-}" in
        1) wanted="kernel-tests bench-attention" ;;
        2) wanted="train-throughput decode" ;;
        3) wanted="identities train-profile train-smoke" ;;
        4) wanted="train-compiled" ;;
        *) die "--part needs 1 (kernel-tests, bench-attention), 2 (train-throughput, decode), 3 (identities," \
               "train-profile, train-smoke) or 4 (train-compiled)" ;;
      esac
      STEPS=$wanted
      PART=$2  # without $OUT each part writes its own folder: a later part must not delete an earlier one's files
      shift ;;
    --steps)
      [ $# -ge 2 ] || die "--steps needs a comma-separated list of: ${ALL_STEPS// /, }"
      wanted=${2//,/ }
      for s in $wanted; do
        [[ " $ALL_STEPS " == *" $s "* ]] || die "unknown step '$s' (steps: ${ALL_STEPS// /, })"
      done
      STEPS=""
      for s in $ALL_STEPS; do [[ " $wanted " == *" $s "* ]] && STEPS="$STEPS $s"; done
      STEPS=${STEPS# }
      shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

# Time limit of each step, seconds: --quick's parts 1 and 2 sum (each with its install) to 12.5 minutes, what a
# 15-minute lease leaves after the machine's start (38 s and about 130 s on the two 2026-11-28 leases); --full is
# split by --steps. From the H200 runs' measured seconds: on 2026-11-27 (bench/results/gpu-h200-2026-11-27*)
# identities 64, train-smoke 52; on 2026-11-28 (bench/results/gpu-h200-2026-11-28 and -28b) install 14 (7-8 on the
# warm machine), kernel-tests 118 and then over 140 (8 workers: 112 of 116 tests in 140 s; 14 workers now, so 140 s
# should leave room: the tests compile the kernels' specializations, on the CPU's 16 cores),
# bench-attention 240 with the targets' methods, stopped in its last call, MSWA's flex baseline (inductor's compile;
# --profile now also replays each profiled call from a CUDA graph: a few seconds more;
# bench/attention.py saves after each kernel and T, so a cut run keeps those it finished), the seven 160M
# throughput runs 254 and 231 (245 s may cut the last, compiled MSWA, which gpu_targets.py then names as not
# measured: parts 1 and 2 must fit one lease), decode 22 (a 6-layer model) and 27 (the 160M shape; --profile adds a step a point).
# GPU_CHECK_LIMIT_<step> (e.g. GPU_CHECK_LIMIT_bench_attention=300) overrides one.
# train-profile, not yet run: five 160M runs at the throughput runs' ~33 s each, the compiled one longer.
# decode's check of every variant before timing (bench/decode.py) is not yet timed on a GPU: 10 s more.
# train-compiled, not yet run: from the runs above, 160M vanilla compiled 40-48 s and MSWA compiled 65-72 s (its
# kernels' autotuning included), so ~45 + 70 (DAR) + 70 (AHA) + ~80 (410M: twice the layers to compile) s.
declare -A LIMIT_QUICK=([install]=25 [kernel-tests]=140 [identities]=90 [bench-attention]=260
                        [train-throughput]=245 [train-compiled]=330 [train-profile]=270 [train-smoke]=70
                        [decode]=55)
declare -A LIMIT_FULL=([install]=45 [kernel-tests]=540 [identities]=300 [bench-attention]=540
                       [train-throughput]=1500 [train-compiled]=540 [train-profile]=400 [train-smoke]=120
                       [decode]=300)
# --rehearse: the CPU's times (a shared 2-core machine: each step takes 10-60 s), limits that only catch a hang
declare -A LIMIT_REHEARSE=([install]=120 [kernel-tests]=300 [identities]=300 [bench-attention]=300
                           [train-throughput]=600 [train-compiled]=60 [train-profile]=300 [train-smoke]=300
                           [decode]=120)
limit() {  # GPU_CHECK_LIMIT_<step> (dashes as underscores) overrides a step's limit
  local override="GPU_CHECK_LIMIT_${1//-/_}"
  if [ -n "${!override:-}" ]; then echo "${!override}"
  elif [ "$REHEARSE" = 1 ]; then echo "${LIMIT_REHEARSE[$1]}"
  elif [ "$MODE" = quick ]; then echo "${LIMIT_QUICK[$1]}"
  else echo "${LIMIT_FULL[$1]}"; fi
}

SITE=/tmp/neox_dar_gpu_site
WORK=${TMPDIR:-/tmp}/neox_dar_gpu_check

# ------------------------------------------------------------------------------------------------ sizes
# What differs between the GPU run and the rehearsal: sizes and the device, nothing else.
ATTENTION_METHODS=""  # --full: every method
# --quick: the targets' methods only (the reference checks every output untimed; flex for MSWA, its one target)
[ "$MODE" = quick ] && ATTENTION_METHODS="--methods triton sdpa_causal flex --flex-kernels mswa"
if [ "$REHEARSE" = 0 ]; then
  LOG_DIR=${OUT:-runs/gpu_check${PART:+/part$PART}}
  XDIST="-n 14"                   # 16 cores: compile kernel specializations in parallel processes
  KERNEL_TESTS="not long_sequence"
  [ "$MODE" = quick ] && KERNEL_TESTS="not long_sequence and not float32]"  # the matrices' float32 ids
  LONG_T=8192
  PRECISION=bf16
  MICRO=""                        # the config's micro-batch
  MODEL_SIZE=""
  SMOKE_SIZE="seq_length=512 train_batch_size=16 train_micro_batch_size_per_gpu=16" SMOKE_ITERS=200 SMOKE_LOG=10
  DECODE_SIZE="--preset pythia-160m"  # the 160M shape: contexts 8k and 32k, batch 16, 20 timed steps after 3
  DECODE_STEPS=""
  if [ "$MODE" = quick ]; then
    ATTENTION_SIZE="--warmup-ms 25 --rep-ms 100 --profile $ATTENTION_METHODS"
    THROUGHPUT_STEPS="--steps 4 --warmup 2" PROFILE_STEPS="--steps 2 --warmup 3 --top 30"
  else
    ATTENTION_SIZE="--profile" THROUGHPUT_STEPS="--steps 10 --warmup 3" PROFILE_STEPS="--steps 3 --warmup 3 --top 40"
    DECODE_STEPS="--contexts 2048,8192,32768 --batches 1,16"
  fi
else
  XDIST="-n 0"                    # a few tests on 2 cores: no worker processes
  KERNEL_TESTS="not long_sequence and (grouped_query and 37 or fla_kernel)"  # one GQA case per kernel (the smallest)
  LONG_T=32
  PRECISION=fp32                  # the interpreter refuses bf16
  MICRO=1
  MODEL_SIZE="num_layers=2 hidden_size=64 num_attention_heads=4 seq_length=32 train_micro_batch_size_per_gpu=$MICRO"
  SMOKE_SIZE="seq_length=64 train_batch_size=4 train_micro_batch_size_per_gpu=4" SMOKE_ITERS=12 SMOKE_LOG=2
  DECODE_SIZE="--contexts 64 --batches 1"
  # (--interpret leaves flex out: inductor's CPU build takes minutes)
  ATTENTION_SIZE="--interpret --warmup-ms 0 --rep-ms 0 $ATTENTION_METHODS" THROUGHPUT_STEPS="--steps 1 --warmup 0"
  PROFILE_STEPS="--steps 1 --warmup 0 --top 10"
  DECODE_STEPS="--steps 1 --warmup 0"
  SAMPLE=$WORK/gpu_sample         # made by the install step, from the same C4 sample as gpu_wheels.sh
  LOG_DIR=${OUT:-runs/gpu_check_rehearse${PART:+/part$PART}}
fi

# ------------------------------------------------------------------------------------------------ the commands
throughput_runs() {
  # throughput_runs STEP: one line per run of STEP (train-throughput, train-compiled):
  # "<model> <attention> <attention_impl> <torch_compile>"
  if [ "$1" = train-compiled ]; then  # none in the rehearsal (see the header)
    [ "$REHEARSE" = 1 ] || printf '%s\n' "160m vanilla sdpa true" "160m dar triton true" "160m aha triton true" \
                                        "410m vanilla sdpa true"
    return
  fi
  if [ "$MODE" = quick ]; then
    for a in vanilla mswa swa dar aha; do  # the order of the targets' weight: a time limit cuts the last ones
      if [ "$a" = vanilla ]; then echo "160m vanilla sdpa false"; else echo "160m $a triton false"; fi
    done
    # with torch_compile: inductor on the GPU; left out of the rehearsal (see the header)
    [ "$REHEARSE" = 1 ] || printf '160m vanilla sdpa true\n160m mswa triton true\n'
    return
  fi
  for m in 70m 160m; do
    for c in false true; do
      echo "$m vanilla sdpa $c"
      for a in dar swa mswa aha; do for i in triton sdpa; do echo "$m $a $i $c"; done; done
    done
  done
}

profile_runs() {
  # one line per run: "<attention> <attention_impl> <torch_compile>", the open targets' variants first; the compiled
  # run stays on the GPU (see the header)
  printf 'aha triton false\ndar triton false\nvanilla sdpa false\nmswa triton false\n'
  [ "$REHEARSE" = 1 ] || echo "vanilla sdpa true"
}

micro_batch() {  # micro_batch MODEL: the kit's micro-batch (--rehearse: $MICRO), else the config's
  if [ -n "$MICRO" ]; then echo "$MICRO"
  else sed -n 's/^train_micro_batch_size_per_gpu: *\([0-9]*\).*/\1/p' "configs/pythia-$1.yml"; fi
}

step_commands() {
  case "$1" in
    install)
      if [ "$REHEARSE" = 1 ]; then  # no wheels: this machine's packages; the training sample as gpu_wheels.sh makes it
        echo "$PY -m data_prep.tokenize data/sample/c4_sample.jsonl --tokenizer data/20B_tokenizer.json" \
             "--out $SAMPLE/c4_sample --no-progress --max-tokens 50000"
      else
        echo "$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE $WHEELS/*.whl"
        echo "PYTHONPATH=$SITE $PY -m pip check  # versions the wheels need, against the machine's packages"
      fi ;;
    kernel-tests)
      echo "$PY -m pytest tests/test_kernels.py tests/test_attention_linear.py -q -p no:cacheprovider $XDIST -k '$KERNEL_TESTS'" ;;
    identities)
      local workers="-n 8"  # one check per worker: each compiles and tunes its own kernels
      [ "$REHEARSE" = 1 ] && workers=$XDIST
      echo "KERNEL_TESTS_LONG_T=$LONG_T $PY -m pytest tests/test_kernels.py -q -p no:cacheprovider $workers -k long_sequence" ;;
    bench-attention)
      # shellcheck disable=SC2086
      echo "$PY bench/attention.py" $ATTENTION_SIZE "--out $LOG_DIR/attention.json" ;;
    train-throughput|train-compiled)
      throughput_runs "$1" | while read -r m a i c; do
        local micro  # two micro-batches of the config per step: a short step, the config's per-GPU shapes
        micro=$(micro_batch "$m")
        local routed=""  # AHA as its target has it: about 10% of the rows routed (a zero router routes none)
        [ "$a" = aha ] && routed="--aha-mu-f 0.1"
        echo "$PY bench/train_throughput.py configs/pythia-$m.yml configs/attention/$a.yml precision=$PRECISION" \
             "zero_optimization.stage=1 attention_impl=$i torch_compile=$c" $MODEL_SIZE \
             "train_batch_size=$((2 * micro)) $THROUGHPUT_STEPS $routed --no-compare-hf --out $WORK/$1/$m-$a-$i-compile_$c.json"
      done ;;
    train-profile)
      profile_runs | while read -r a i c; do
        local routed=""
        [ "$a" = aha ] && routed="--aha-mu-f 0.1"
        echo "$PY bench/profile_step.py configs/pythia-160m.yml configs/attention/$a.yml precision=$PRECISION" \
             "zero_optimization.stage=1 attention_impl=$i torch_compile=$c" $MODEL_SIZE \
             "train_batch_size=$((2 * $(micro_batch 160m))) $PROFILE_STEPS" $routed \
             "--out $LOG_DIR/profile/$a-$i-compile_$c.json"
      done ;;
    train-smoke)
      local half=$((SMOKE_ITERS / 2))
      local common="configs/pythia-14m.yml configs/attention/vanilla.yml data_path=$SAMPLE/c4_sample"
      common="$common save=$WORK/smoke precision=$PRECISION $SMOKE_SIZE train_iters=$SMOKE_ITERS"
      common="$common lr_decay_iters=$SMOKE_ITERS checkpoint_factor=$half log_interval=$SMOKE_LOG"
      common="$common eval_interval=$half eval_iters=2 exit_interval=$half"
      echo "$PY train.py $common  # twice: stops at step $half with a checkpoint (exit 3), then resumes to $SMOKE_ITERS (exit 0)"
      echo "(then: the logged loss falls, and the resumed run logs steps $((half + 1))..$SMOKE_ITERS, status done)" ;;
    decode)  # GPU_CHECK_DECODE_ARGS: more bench/decode.py options (the last of a repeated option wins)
      # shellcheck disable=SC2086  # (unquoted: word-split, joined by single spaces)
      echo "$PY bench/decode.py --dtype bfloat16 --profile" $DECODE_SIZE $DECODE_STEPS ${GPU_CHECK_DECODE_ARGS:-} \
           "--out $LOG_DIR/decode.json" ;;
  esac
}

print_plan() {
  if [ "$REHEARSE" = 1 ]; then
    echo "gpu_check.sh --$MODE --rehearse (this CPU, toy sizes; no timing here is a GPU number): logs and results in $LOG_DIR/"
  else
    echo "gpu_check.sh --$MODE: logs and results in $LOG_DIR/"
  fi
  local total=0 n=0
  for s in install $STEPS; do
    n=$((n + 1)); total=$((total + $(limit "$s")))
    printf '%d. %-17s (time limit %4ss)\n' "$n" "$s" "$(limit "$s")"
    step_commands "$s" | sed 's/^/     /'
  done
  if [ "$REHEARSE" = 1 ]; then echo "time limit in all: ${total}s (rehearsal limits: they only catch a hang)"
  elif [ "$total" -gt 570 ]; then
    echo "time limit in all: ${total}s, over the device tool's 600s command limit: run --part 1, then --part 2" \
         "(one 15-minute lease), and --part 3 and --part 4 in later leases"
  else echo "time limit in all: ${total}s (the device tool's command limit is 600s)"; fi
}

# ------------------------------------------------------------------------------------------------ running
declare -A STATUS SECONDS_TAKEN
log() { echo "$*" | tee -a "$LOG"; }

run_step() {  # run_step NAME FUNCTION: time it, log it, never stop the script
  local name=$1 fn=$2 start rc
  log ""
  log "=================== $name (limit $(limit "$name")s) $(date -u +%H:%M:%S)"
  start=$(date +%s)
  ( "$fn" ) > "$WORK/$name.log" 2>&1 &
  local pid=$!
  ( sleep "$(limit "$name")"; kill -TERM -- -"$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null ) &
  local watchdog=$!
  wait "$pid" 2>/dev/null; rc=$?
  kill -- -"$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
  SECONDS_TAKEN[$name]=$(( $(date +%s) - start ))
  cat "$WORK/$name.log" >> "$LOG"
  if [ "$rc" -eq 0 ]; then STATUS[$name]=ok
  elif { [ "$rc" -eq 143 ] || [ "$rc" -eq 137 ]; } && [ "${SECONDS_TAKEN[$name]}" -ge "$(limit "$name")" ]; then
    STATUS[$name]=TIMEOUT
  else STATUS[$name]="FAILED ($rc)"; fi
  [ "${STATUS[$name]}" = ok ] || { echo "--- last lines of $name:"; tail -n 25 "$WORK/$name.log"; }
  log "=================== $name: ${STATUS[$name]} in ${SECONDS_TAKEN[$name]}s"
}

do_install() {
  if [ "$REHEARSE" = 1 ]; then
    rm -rf "$SAMPLE"
    eval "$(step_commands install)" || return 1
  else
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS/: run scripts/gpu_wheels.sh and carry it"; return 1; }
    local wanted
    wanted=$(cd "$WHEELS" && ls -- *.whl | sort | sha256sum)
    if [ "$(cat "$SITE/.neox_dar_wheels" 2>/dev/null)" = "$wanted" ]; then  # a later part on the same machine
      echo "the same $(ls "$WHEELS"/*.whl | wc -l) wheels are installed in $SITE already (an earlier part)"
    else
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || return 1
      echo "$wanted" > "$SITE/.neox_dar_wheels"
      echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE"
    fi
    PYTHONPATH=$SITE "$PY" -m pip check || echo "(pip check lists the conflicts above; steps that need them may fail)"
  fi
  REHEARSE=$REHEARSE "$PY" - <<'EOF'
import importlib.metadata, importlib.util, os, platform, subprocess, sys
import torch, triton
print(f"python {platform.python_version()}  torch {torch.__version__} (CUDA {torch.version.cuda})  triton {triton.__version__}")
missing = []
for dist, module in [("deepspeed", "deepspeed"), ("megatron-core", "megatron.core"), ("lm-eval", "lm_eval"),
                     ("wandb", "wandb"), ("transformers", "transformers")]:
    try:
        found = importlib.util.find_spec(module) is not None
        print(f"{dist} {importlib.metadata.version(dist)}" + ("" if found else f" (module {module} NOT found)"))
    except (ImportError, importlib.metadata.PackageNotFoundError) as e:
        found = False
        print(f"{dist}: NOT installed ({e})")
    if not found:
        missing.append(dist)
if missing:
    sys.exit("missing: " + ", ".join(missing))
if os.environ["REHEARSE"] == "1":
    print(f"rehearsal: CPU, {os.cpu_count()} cores, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}")
    sys.exit(0)
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to torch")
print(f"GPU {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}), "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip())
EOF
}

do_kernel_tests() { eval "$(step_commands kernel-tests)"; }
do_identities() { eval "$(step_commands identities)"; }
do_bench_attention() { eval "$(step_commands bench-attention)"; }

merge_throughput() {  # merge_throughput STEP [--table]: STEP's runs so far into STEP's JSON, train_throughput.json
  # or train_compiled.json (--table: and print them)
  "$PY" -c "$MERGE_THROUGHPUT" "$WORK/$1" "$LOG_DIR/${1//-/_}.json" "$(throughput_runs "$1" | wc -l)" "${@:2}"
}
IFS= read -r -d '' MERGE_THROUGHPUT <<'EOF'
import json, sys
from pathlib import Path
runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
Path(sys.argv[2]).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
if "--table" not in sys.argv:
    sys.exit(0)
if len(runs) != int(sys.argv[3]):
    print(f"{len(runs)} of {sys.argv[3]} runs wrote a result")
print(f"{'model':28s} {'attention':9s} {'impl':6s} {'compile':7s} {'tokens/s':>12s} {'TFLOP/s':>8s} {'MFU':>6s} "
      f"{'loss, first step':>16s}")
for r in runs:
    c, e = r["config"], r["engine"]
    mfu = f"{100 * e['mfu']:.1f}%" if e.get("mfu") else "n/a"
    print(f"{c['hidden_size']}x{c['num_layers']:<24} {c['attention_type']:9s} {c.get('attention_impl', ''):6s} "
          f"{str(c.get('torch_compile', '')):7s} {e['tokens_per_sec']:12,.0f} {e['tflops_per_device']:8.1f} {mfu:>6s} "
          f"{e['loss_first_step']:16.4f}")
sys.exit(len(runs) != int(sys.argv[3]))
EOF

run_forked() {  # run_forked PRELOAD CMD...: python command lines ("$PY SCRIPT ARGS"), each in a child forked from
  # one process that imported PRELOAD (comma-separated modules) and SCRIPT's own imports first, "--- NAME" before
  # each; the rehearsal's (on the CPU a torch + DeepSpeed + dynamo start is ~5 s a run; on the GPU each command runs
  # as a process of its own). FORKED_MERGE=STEP: merge_throughput STEP after each; FORKED_RCS=FILE: the runs'
  # exit codes written there, on one line. Exit status 1 when a run's is not 0.
  local step=${FORKED_MERGE:-} count=0
  [ -z "$step" ] || count=$(throughput_runs "$step" | wc -l)
  MERGE_RUNS="$WORK/$step" MERGE_OUT="$LOG_DIR/${step//-/_}.json" MERGE_COUNT=$count \
    MERGE_THROUGHPUT=$MERGE_THROUGHPUT "$PY" -c "$RUN_FORKED" "$@"
}
IFS= read -r -d '' RUN_FORKED <<'EOF'
import os, shlex, subprocess, sys

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "scripts")]
from forked import preload, run_script

cmds = sys.argv[2:]
preload(sys.argv[1].split(","), sorted({shlex.split(c)[1] for c in cmds}))
rcs = []
for cmd in cmds:
    argv = shlex.split(cmd)[1:]  # [SCRIPT, ARGS...]
    name = os.path.basename(argv[argv.index("--out") + 1] if "--out" in argv else argv[0])
    print(f"--- {name}", flush=True)
    pid = os.fork()
    if pid == 0:
        run_script(argv)
    rcs.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    if rcs[-1] != 0 and not os.environ.get("FORKED_RCS"):  # (FORKED_RCS: the caller judges the codes)
        print(f"FAILED: {name} (exit {rcs[-1]})", flush=True)
    if os.environ.get("FORKED_MERGE"):
        subprocess.run([sys.executable, "-c", os.environ["MERGE_THROUGHPUT"],
                        *(os.environ[k] for k in ("MERGE_RUNS", "MERGE_OUT", "MERGE_COUNT"))])
if os.environ.get("FORKED_RCS"):
    with open(os.environ["FORKED_RCS"], "w") as f:
        f.write(" ".join(map(str, rcs)) + "\n")
sys.exit(int(any(rcs)))
EOF

run_engine_commands() {  # run_engine_commands STEP [MERGE]: STEP's training-engine command lines, each as a
  # process of its own (--rehearse: in forks of one process, run_forked); MERGE=merge: merge_throughput after each
  # run (a step stopped by its time limit keeps the runs it finished). Exit status 1 when a run failed.
  local failed=0 cmd cmds
  if [ "$REHEARSE" = 1 ]; then
    mapfile -t cmds < <(step_commands "$1")
    FORKED_MERGE=$([ "${2:-}" = merge ] && echo "$1") \
      run_forked torch,torch._dynamo,deepspeed,neox_dar.training.engine,neox_dar.training.batches "${cmds[@]}" \
      || failed=1
  else
    while read -r cmd; do
      echo "--- ${cmd##*/}"
      eval "$cmd" || { failed=1; echo "FAILED: ${cmd##*/}"; }
      [ "${2:-}" = merge ] && merge_throughput "$1"
    done < <(step_commands "$1")
  fi
  return $failed
}

engine_step() {  # engine_step STEP: STEP's throughput runs (train-throughput, train-compiled), merged after each
  rm -rf "${WORK:?}/$1" "$LOG_DIR/${1//-/_}.json"
  mkdir -p "$WORK/$1"
  local failed=0
  [ -z "$(throughput_runs "$1")" ] || run_engine_commands "$1" merge || failed=1
  merge_throughput "$1" --table || failed=1
  return $failed
}
do_train_throughput() { engine_step train-throughput; }
do_train_compiled() { engine_step train-compiled; }

do_train_profile() {
  rm -rf "$LOG_DIR/profile"
  mkdir -p "$LOG_DIR/profile"
  local failed=0
  run_engine_commands train-profile || failed=1
  profile_table "$(profile_runs | wc -l)" || failed=1
  return $failed
}

profile_table() {  # profile_table [EXPECTED]: the profiles in $LOG_DIR/profile/ as a table; exit 1 when fewer
  "$PY" - "$LOG_DIR/profile" "${1:-0}" <<'EOF'
import json, sys
from pathlib import Path
runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
cats = ("matmul", "attention", "loss", "elementwise", "optimizer", "other")
print("| run | ms a step | kernel ms (busy) | " + " | ".join(cats) + " |")
print("|---|---|---|" + "---|" * len(cats))
for r in runs:
    c, p = r["config"], r["profile"]
    name = f"{c['attention_type']} ({c['attention_impl']}{', compiled' if c['torch_compile'] else ''})"
    if "aha_mu_f" in p:
        name += f", {100 * p['aha_mu_f']['measured']:.0f}% routed"
    print(f"| {name} | {p['step_wall_ms']:.1f} | {p['kernel_ms']:.1f} ({100 * p['busy_fraction']:.0f}%) | "
          + " | ".join(f"{p['categories_ms'].get(k, 0.0):.1f}" for k in cats) + " |")
if len(runs) < int(sys.argv[2]):
    print(f"{len(runs)} of {sys.argv[2]} runs wrote a profile")
    sys.exit(1)
EOF
}

do_train_smoke() {
  rm -rf "$WORK/smoke"
  [ -f "$SAMPLE/c4_sample.bin" ] || { echo "no $SAMPLE/c4_sample.bin: run scripts/gpu_wheels.sh and carry it"; return 1; }
  local cmd
  cmd=$(step_commands train-smoke | sed -n 1p | sed 's/ *#.*//')
  local rc rc2=1
  if [ "$REHEARSE" = 1 ]; then  # the command twice, in forks of one process (run_forked)
    FORKED_RCS=$WORK/smoke.rcs run_forked torch,torch._dynamo,deepspeed,neox_dar.training.loop,neox_dar.training.checks \
      "$cmd" "$cmd"
    read -r rc rc2 < "$WORK/smoke.rcs"
  else
    eval "$cmd"; rc=$?
    [ "$rc" -eq 3 ] && { eval "$cmd"; rc2=$?; }
  fi
  [ "$rc" -eq 3 ] || { echo "first run: exit $rc, expected 3 (stopped with a checkpoint at step $((SMOKE_ITERS / 2)))"; return 1; }
  [ "$rc2" -eq 0 ] || { echo "the resumed run failed"; return 1; }
  "$PY" - "$WORK/smoke" "$SMOKE_ITERS" <<'EOF'
import json, sys
from pathlib import Path
save, iters = Path(sys.argv[1]), int(sys.argv[2])
rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines() if line.strip()]
train = [r for r in rows if "loss" in r and "valid_loss" not in r]
steps = [r["step"] for r in train]
status = json.loads((save / "status.json").read_text())
first, last = train[0]["loss"], sum(r["loss"] for r in train[-3:]) / 3
print(f"logged steps {steps}; loss {first:.3f} -> {last:.3f} (mean of the last 3); status {status}")
assert status["state"] == "done" and status["step"] == iters, f"status.json: {status}"
assert steps == sorted(set(steps)) and steps[-1] == iters and any(s > iters // 2 for s in steps), \
    "the resume did not continue"
assert last < first - 0.5, f"the loss did not fall: {first:.3f} -> {last:.3f}"
print(f"train-smoke: loss falls, resume continued to step {iters}")
EOF
}

do_decode() {
  eval "$(step_commands decode)"
}

commit() {  # what the result files record (neox_dar.provenance: the checkout's commit, else NEOX_DAR_GIT_COMMIT)
  "$PY" -c 'from neox_dar.provenance import code_version; print(code_version()["git_commit"] or "unknown (set NEOX_DAR_GIT_COMMIT)")'
}

summary() {
  local on
  on="GPU $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  [ "$REHEARSE" = 1 ] && on="rehearsal on this CPU at toy sizes (no timing here is a GPU number)"
  {
    echo "gpu_check.sh --$MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(commit): $on"
    echo
    echo "| step | status | seconds | time limit |"
    echo "|---|---|---|---|"
    for s in install $STEPS; do
      local st=${STATUS[$s]:-not run}
      echo "| $s | $st | ${SECONDS_TAKEN[$s]:--} | $(limit "$s") |"
    done
    echo
    if ls "$LOG_DIR"/profile/*.json >/dev/null 2>&1; then
      echo "Where a training step's time goes (bench/profile_step.py; profile/; per optimizer step, kernel time by"
      echo "category in ms; busy: kernel time / wall time, a lower bound: the profiler slows the host):"
      echo
      profile_table
      echo
    fi
    echo "Targets (bench/gpu_targets.py: ratios measured in this run; judged only on a GPU):"
    echo
    "$PY" bench/gpu_targets.py "$LOG_DIR" --out "$LOG_DIR/targets.json" 2>&1
  } > "$LOG_DIR/summary.md"
  echo
  echo "gpu_check.sh --$MODE summary ($LOG_DIR/summary.md; full log $LOG_DIR/gpu_check.log):"
  cat "$LOG_DIR/summary.md"
}

# The step commands are command lines (printed in the plan, then run): a path with a space would split in them
for v in ROOT PY WHEELS SAMPLE WORK LOG_DIR; do
  [[ "${!v}" =~ [[:space:]] ]] && die "the kit's paths must not contain spaces; $v is '${!v}'" \
    "(set OUT and TMPDIR, or move the checkout)"
done
if [ "$DRY" = 1 ]; then
  print_plan
  exit 0
fi

mkdir -p "$LOG_DIR" "$WORK"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
LOG=$LOG_DIR/gpu_check.log
: > "$LOG"
# a step that fails leaves none of an earlier run's
rm -rf "$LOG_DIR"/{attention,train_throughput,train_compiled,decode,targets}.json "$LOG_DIR/profile"
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline
if [ "$REHEARSE" = 1 ]; then  # the CPU, the kernels interpreted; DeepSpeed's CPU op from this machine's cache
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
else
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$WORK/torch_extensions}
fi
print_plan | tee -a "$LOG"
set -m  # each step in its own process group, so a time limit ends the step's children too
run_step install do_install
for s in $STEPS; do run_step "$s" "do_${s//-/_}"; done
summary
for s in install $STEPS; do [ "${STATUS[$s]}" = ok ] || exit 1; done
exit 0

#!/usr/bin/env bash
# A small-budget replication of the papers' orderings on real text (docs/experiments.md, "A small replication"):
# the 8 runs of configs/sweeps/replicate-small.yml (Pythia-14M shape, T = 2048, English Wikipedia without the
# WikiText-103 validation/test articles), 100.0M tokens each (1,526 steps of 32 x 2048), evaluated on WikiText-103
# test (the official file), the held-out Wikipedia articles and the shipped C4 and FineWeb-Edu samples, in commands
# ("parts") of under 9 minutes on one GPU, each continuing where the previous one stopped.
#
#   bash scripts/replicate.sh --pack     # here (network for nothing): runs/replicate-pack/ = the text (28 MiB of
#                                        #   compressed Wikipedia), the wheels the recipe needs (from .whl/, built by
#                                        #   scripts/gpu_wheels.sh); checks that it and the tree stay under 64 MiB
#   bash scripts/replicate.sh --part     # on the GPU machine: install, tokenize; the first part measures the
#                                        #   throughput and says how many parts the plan needs (runs/replicate/
#                                        #   budget.json); then trains and evaluates the runs in order until the
#                                        #   part's deadline. Run it again until it reports the runs done (exit 0;
#                                        #   exit 3: stopped at the deadline); the last part writes the report
#   bash scripts/replicate.sh --report   # anywhere: the tables, figures and the targets from runs/replicate/runs
#   bash scripts/replicate.sh --smoke    # CPU, toy size: the whole pipeline (pack, parts, report) in a few minutes
#   bash scripts/replicate.sh --cpu      # CPU: the CPU replication (configs/sweeps/replicate-cpu.yml): text,
#                                        #   byte-level tokens, the 9 runs one after another, the report; every step
#                                        #   is skipped when its output exists, and a stopped run continues
#   bash scripts/replicate.sh --cpu --smoke --work DIR   # the same at toy size (tiny model, 2 steps, 2 runs; tests)
#
# Options: --work DIR (default runs/replicate, with --cpu runs/replicate-cpu; with --smoke a scratch folder),
# --pack-dir DIR (default runs/replicate-pack), --model 14m|31m (default 14m). A part stops itself at its deadline
# (PART_SECONDS, default 510 s from its start; 600 s per part with --smoke): the running trainer writes a
# checkpoint and the next part continues it (runs that are done are skipped; on a machine that kept the checkpoint
# the run continues, on a fresh one it starts again). Every result is under the work folder; when $OUT is set (the
# device tool's output folder) each part also copies the results without checkpoints or data to $OUT/replicate.
# Each run's progress is printed on the terminal and kept in the work folder's logs/. --cpu: SHARED (default
# ../shared/data) holds wikipedia/ and wikitext103/; OMP_NUM_THREADS defaults to 1; NICE=N runs the sweep under
# nice -n N (a negative N needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
SWEEP=configs/sweeps/replicate-small.yml
CPU_SWEEP=configs/sweeps/replicate-cpu.yml
WORK=
PACK=runs/replicate-pack
MODEL=14m
MODE=
CPU=
PART_SECONDS_GIVEN=${PART_SECONDS:-}
PART_SECONDS=${PART_SECONDS:-510}
PARTS=${PARTS:-3}                                  # the parts the recipe plans for (budget.json: does the plan fit)
PACK_MIB=${PACK_MIB:-28}
CPU_MIB=${CPU_MIB:-4}                              # --cpu: compressed training text (MiB)
NICE=${NICE:-0}
LIMIT_MIB=64
SITE=${TMPDIR:-/tmp}/neox_dar_replicate_site
SHARED=${SHARED:-../shared/data}
RUNS=                                              # the runs to train, in the sweep's order (empty: all of them)
MEASURE_RUNS="vanilla-seed1 dar aha-w128"          # the variants whose throughput the check uses (the slowest wins)
MEASURE_STEPS=${MEASURE_STEPS:-40}
MEASURE_LOG=5                                      # metrics rows every 5 steps: the first (warm-up) is left out
MEASURE_EVAL=1                                     # time one evaluation too (the check's eval_seconds)
WORKERS=${WORKERS:-1}                              # runs at once (the check assumes one)
# Wheels the recipe needs from .whl/: the closure of deepspeed, megatron-core and lm-eval (no wandb: the recipe
# logs no W&B), computed from the wheels' metadata against the GPU machine's packages (scripts/gpu_wheels.sh)
RECIPE_WHEELS="annotated_types chardet dataproperty datasets deepspeed defusedxml dill evaluate hjson lm_eval
mbstrdecoder megatron_core more_itertools multiprocess nltk pathvalidate pydantic pydantic_core pytablewriter pytz
rouge_score sqlitedict tabledata tcolorpy typepy typing_inspection word2number"

die() { echo "replicate.sh: error: $*" >&2; exit 2; }
log() { echo "[replicate $(date -u +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --pack|--report|--smoke|--part) [ -z "$MODE" ] || die "give one of --pack, --part, --report, --smoke"
                                    MODE=${1#--} ;;
    --cpu) CPU=1 ;;
    --work) [ $# -ge 2 ] || die "--work needs a folder"; WORK=$2; shift ;;
    --pack-dir) [ $# -ge 2 ] || die "--pack-dir needs a folder"; PACK=$2; shift ;;
    --model) [ $# -ge 2 ] || die "--model needs 14m or 31m"; MODEL=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
if [ -n "$CPU" ]; then
  [[ -z $MODE || $MODE == smoke ]] || die "--cpu goes alone or with --smoke, not with --$MODE"
  MODE=cpu$([ "$MODE" = smoke ] && echo -toy || true)
fi
[ -n "$MODE" ] || die "say what to do: --pack, --part, --report, --smoke or --cpu (see --help)"
[[ $MODEL == 14m || $MODEL == 31m ]] || die "--model is 14m or 31m, got '$MODEL'"

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }

show() {  # show LOG PREFIX CMD...: run CMD with its output on the terminal (each line after PREFIX) and in LOG
  local logfile=$1 prefix=$2
  shift 2
  "$@" > >(tee -a "$logfile" | sed -u "s/^/$prefix/") 2>&1
}

# ------------------------------------------------------------------------------------------------ pack (here)
pack_text() {  # pack_text ARGS...: the text of the recipe into $PACK/text
  "$PY" -m data_prep.wikipedia --wikipedia "$SHARED/wikipedia" --wikitext "$SHARED/wikitext103" --out "$PACK/text" "$@"
}

do_pack() {
  [ -d .whl ] || die ".whl/ does not exist: run bash scripts/gpu_wheels.sh first (it needs PyPI)"
  pack_text --max-mib "$PACK_MIB"
  rm -rf "$PACK/wheels"
  mkdir -p "$PACK/wheels"
  for name in $RECIPE_WHEELS; do
    found=$(ls .whl/"$name"-*.whl 2>/dev/null | head -n 1)
    [ -n "$found" ] || die "no $name wheel in .whl/: run bash scripts/gpu_wheels.sh"
    ln "$found" "$PACK/wheels/" 2>/dev/null || cp "$found" "$PACK/wheels/"
  done
  local tree pack total
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null \
         | awk '{s += $1} END {print s + 0}')
  pack=$(du -sb "$PACK" | cut -f1)
  total=$((tree + pack))
  awk -v t="$tree" -v p="$pack" -v d="$PACK" 'BEGIN { m = 1048576
    printf "carry: working tree %.1f MiB + %s/ %.1f MiB = %.1f MiB (limit 64 MiB; runs/replicate/ adds ~1 MiB per part)\n",
           t/m, d, p/m, (t+p)/m }'
  [ "$total" -lt $(((LIMIT_MIB - 2) * 1048576)) ] || die "over $((LIMIT_MIB - 2)) MiB: lower PACK_MIB (now $PACK_MIB)"
  echo "ok: carry $PACK, then run: bash scripts/replicate.sh --part (again until it reports the runs done)"
}

# ------------------------------------------------------------------------------------------------ a part (there)
install() {  # the pack's wheels into a private folder, when the machine lacks them
  if "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('deepspeed') and u.find_spec('lm_eval')))"; then
    return 0
  fi
  ls "$PACK"/wheels/*.whl >/dev/null 2>&1 || die "no wheels in $PACK/wheels: run bash scripts/replicate.sh --pack"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$PACK"/wheels/*.whl || die "installing the wheels failed"
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  log "installed $(ls "$PACK"/wheels/*.whl | wc -l) wheels into $SITE"
}

prepare_data() {  # the evaluation files and the tokenized training text under $WORK/data
  local data=$WORK/data
  mkdir -p "$data"
  if [ ! -f "$data/wiki.test.tokens" ]; then  # whole or not at all: a cut gunzip left a file the next run took
    gunzip -c "$PACK/text/wiki.test.tokens.gz" > "$data/wiki.test.tokens.tmp"
    mv "$data/wiki.test.tokens.tmp" "$data/wiki.test.tokens"
  fi
  cp -f "$PACK/text/wiki_heldout.jsonl.gz" "$data/"
  cp -f "$PACK/text/manifest.json" "$data/pack_manifest.json"
  [ -f "$data/wiki_train.idx" ] || \
    "$PY" -m data_prep.tokenize "$PACK/text/wiki_train.jsonl.zst" --tokenizer data/20B_tokenizer.json \
      --out "$data/wiki_train" --no-progress
}

sweep() { "$PY" -m neox_dar.sweep "$SWEEP_FILE" "$@"; }

plan() {  # the sweep's configs with the data (and the smoke's or --model's overrides); prints the plan
  # shellcheck disable=SC2086
  sweep plan --out "$WORK/runs" "data_path=$WORK/data/wiki_train" $MODEL_OVERRIDES
}

since() {  # since T0: seconds since the date +%s.%N stamp T0
  awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f\n", b - a }'
}

measure() {  # short runs of the measured variants, one evaluation, then the check of the plan (the first part, once)
  local m=$WORK/measure t0 t1 run first=${MEASURE_RUNS%% *} iters
  t0=$(date +%s.%N)
  mkdir -p "$m"
  for run in $MEASURE_RUNS; do
    [ -f "$m/$run/wall_seconds" ] && continue
    rm -rf "${m:?}/$run"
    log "measuring $run: $MEASURE_STEPS steps"
    t1=$(date +%s.%N)
    show "$m/$run.log" "  [measure $run] " "$PY" train.py "$WORK/runs/$run/config.yml" "save=$m/$run" \
      "train_iters=$MEASURE_STEPS" "lr_decay_iters=$MEASURE_STEPS" "log_interval=$MEASURE_LOG" \
      || die "measuring $run failed (log: $m/$run.log)"
    since "$t1" > "$m/$run/wall_seconds"
  done
  local eval_s=0
  if ((MEASURE_EVAL)); then
    t1=$(date +%s.%N)
    # shellcheck disable=SC2086
    show "$m/eval.log" "  [measure eval] " "$PY" -m neox_dar.sweep.evaluate "$m/$first" $EVAL_ARGS \
      || die "evaluating $first failed (log: $m/eval.log)"
    eval_s=$(since "$t1")
  fi
  iters=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["train_iters"])' \
          "$WORK/runs/$first/config.yml")
  # shellcheck disable=SC2086
  "$PY" -m neox_dar.sweep.budget "$m" --train-iters "$iters" --runs $(echo $RUNS | wc -w) --parts "$PARTS" \
    --part-seconds "$PART_SECONDS" --setup-seconds "$SETUP_SECONDS" --measure-seconds "$(since "$t0")" \
    --eval-seconds "$eval_s" --out "$WORK/budget.json"
}

mirror() {  # the results (no checkpoints, no data) to $OUT/replicate, when $OUT is set
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT/replicate"
  tar -C "$WORK" --exclude='./runs/*/checkpoints' --exclude=./data --exclude='./measure/*/checkpoints' -cf - . \
    | tar -C "$OUT/replicate" -xf -
}

prune() {  # the checkpoints of the runs that are trained and evaluated: the results stay small
  "$PY" - "$WORK/runs" "$@" <<'EOF'
import shutil, sys
from pathlib import Path
from neox_dar.sweep.rundir import needs_eval, needs_training
for run in sys.argv[2:]:
    d = Path(sys.argv[1], run)
    if d.is_dir() and not needs_training(d) and not needs_eval(d, ["wikipedia"]):
        shutil.rmtree(d / "checkpoints", ignore_errors=True)
EOF
}

train_runs() {  # train_runs N RUNS...: the runs, in WORKERS processes at once, until the part's deadline
  local n=$1 left rc=0 w pids=() codes=() prefix
  shift
  left=$((PART_SECONDS - $(elapsed)))
  if ((left < 10)); then log "part $n: no time left before its deadline; run --part again"; return 3; fi
  log "part $n: $* (${left}s left, $WORKERS worker(s))"
  local groups=()
  for ((w = 0; w < WORKERS; w++)); do groups[w]=""; done
  local i=0 run
  for run in "$@"; do groups[i % WORKERS]="${groups[i % WORKERS]} $run"; i=$((i + 1)); done
  for ((w = 0; w < WORKERS; w++)); do
    [ -n "${groups[w]}" ] || continue
    prefix=$( ((WORKERS > 1)) && echo "  [worker $w] " || echo "  " )
    # SIGTERM at the deadline reaches the trainer through the sweep: it writes a checkpoint, the sweep exits 3
    # shellcheck disable=SC2086
    show "$WORK/logs/part$n-worker$w.log" "$prefix" timeout --foreground -s TERM -k 20 "$left" \
      "$PY" -m neox_dar.sweep "$SWEEP_FILE" run --local --keep-going --out "$WORK/runs" --only ${groups[w]} &
    pids+=($!)
  done
  for w in "${!pids[@]}"; do
    wait "${pids[w]}" || codes+=($?)
  done
  for rc in "${codes[@]}"; do
    if ((rc == 3 || rc == 124)); then log "part $n stopped at its deadline: run --part again to continue"; return 3; fi
  done
  if ((${#codes[@]})); then log "part $n: a run failed (exit ${codes[0]}); see $WORK/logs and the runs' logs/"; return 1; fi
  return 0
}

do_part() {  # the next part: train and evaluate the plan's runs in order until the deadline; the report at the end
  local n rc=0
  [ -f "$PACK/text/manifest.json" ] || die "no pack in $PACK (no text/manifest.json): run bash scripts/replicate.sh" \
                                          "--pack first, or give its folder with --pack-dir"
  mkdir -p "$WORK/logs"
  n=$(($(cat "$WORK/parts" 2>/dev/null || echo 0) + 1))
  echo "$n" > "$WORK/parts"
  install
  prepare_data
  plan
  SETUP_SECONDS=$(elapsed)
  log "part $n: setup (install, data, plan) took ${SETUP_SECONDS}s"
  [ -f "$WORK/budget.json" ] || measure
  # shellcheck disable=SC2086
  train_runs "$n" $RUNS || rc=$?
  # shellcheck disable=SC2086
  prune $RUNS
  sweep status --out "$WORK/runs" || true
  if ((rc == 0)); then
    log "part $n: its runs are trained and evaluated: $RUNS"
    do_report || rc=$?
  fi
  mirror
  return $rc
}

# ------------------------------------------------------------------------------------------------ report
do_report() {  # the report's tables and figures, then the expected orderings with the vanilla seed spread beside each
  "$PY" -m neox_dar.report "$WORK/runs" --out "$WORK/report"
  "$PY" - "$WORK/report/table.json" "$WORK/budget.json" <<'EOF' | tee "$WORK/report/targets.md"
import json, os, statistics, sys

table = json.load(open(sys.argv[1]))
budget = json.load(open(sys.argv[2])) if os.path.isfile(sys.argv[2]) else None
cols = table["columns"]
papers = ["FineWeb-Edu", "C4", "WikiText-103"]
rows = {r[0]: dict(zip(cols, r)) for r in table["rows"]}
rows = {n: r for n, r in rows.items() if all(r.get(c) is not None for c in papers)}  # the evaluated runs


def rel(a: str, b: str) -> float:  # Rel. (%) of run a's perplexities against run b's, mean over the papers' corpora
    return statistics.fmean(rows[a][c] / rows[b][c] * 100 for c in papers)


def verdict(diff: float, noise: float | None) -> str:  # a difference expected to be negative (lower is better)
    if noise is None:
        return "no noise floor (vanilla-seed2 not evaluated)"
    if abs(diff) <= noise:
        return "within the noise floor"
    return "seen" if diff < 0 else "opposite"


print("## Targets" + (f": {budget['tokens_per_run']:,} tokens per run ({budget['train_iters']} steps of "
                      f"{budget['tokens_per_step']:,})" if budget else "") + "\n")
base = "vanilla-seed1"
noise = None
if base in rows and "vanilla-seed2" in rows:
    spread = rel("vanilla-seed2", base) - 100
    noise = abs(spread)
    print(f"- noise floor: vanilla seed 2 against seed 1, {spread:+.2f} points; a difference within {noise:.2f} points "
          "is not an ordering")
if base in rows and "dar" in rows:
    d = rel("dar", base) - 100
    close = abs(d) <= max(1.5, noise or 0)
    print(f"- DAR d/4 - vanilla: {d:+.2f} points; expected close to vanilla (|diff| <= 1.5 points or within the "
          f"noise floor): {'seen' if close else 'not seen'}")
if base in rows and "dar" in rows and "uniform" in rows:
    u = rel("dar", base) - rel("uniform", base)
    v = verdict(u, noise)
    if v == "seen" and u > -3:
        v = "DAR better, by less than 3 points"
    print(f"- DAR d/4 - uniform d/4: {u:+.2f} points; expected DAR clearly better (>= 3 points, beyond the noise "
          f"floor): {v}")
if base in rows and "swa-w128" in rows and "mswa-w128" in rows:
    diff = rel("mswa-w128", base) - rel("swa-w128", base)
    cost = {n: rows[n].get("Cost") for n in ("mswa-w128", "swa-w128")}
    costs = (f" at attention cost {cost['mswa-w128']:.3f} vs {cost['swa-w128']:.3f}"
             if all(isinstance(c, float) for c in cost.values()) else "")
    print(f"- MSWA w=128 - SWA w=128: {diff:+.2f} points{costs}; expected MSWA better at its smaller window budget: "
          f"{verdict(diff, noise)}")
mu = {n: (rows.get(n) or {}).get("mu_f (%)") for n in ("aha-w32", "aha-w128")}
if all(isinstance(v, float) for v in mu.values()):
    print(f"- AHA mu_f: {mu['aha-w32']:.2f}% at w=32, {mu['aha-w128']:.2f}% at w=128; expected lower at w=128: "
          f"{'seen' if mu['aha-w128'] < mu['aha-w32'] else 'not seen'}")
EOF
}

# ------------------------------------------------------------------------------------------------ the CPU replication
do_cpu() {  # the text, the byte-level tokens, the sweep's runs one after another, the report; each step resumable
  local text=$WORK/text data=$WORK/data sweep_file=$CPU_SWEEP
  mkdir -p "$data" "$WORK/logs"
  if [ -f "$text/manifest.json" ]; then log "text: $text exists, skipped"; else
    log "text: Wikipedia and WikiText-103 from $SHARED into $text"
    # shellcheck disable=SC2086
    "$PY" -m data_prep.wikipedia --wikipedia "$SHARED/wikipedia" --wikitext "$SHARED/wikitext103" --out "$text" \
      --max-mib "$CPU_MIB" $CPU_TEXT_ARGS
  fi
  local name
  for name in wiki_train:wiki_train.jsonl.zst wiki_heldout:wiki_heldout.jsonl.gz; do
    if [ -f "$data/${name%%:*}.idx" ]; then log "tokens: $data/${name%%:*} exists, skipped"; continue; fi
    "$PY" -m data_prep.tokenize "$text/${name#*:}" --tokenizer data/byte_tokenizer.json --out "$data/${name%%:*}" \
      --no-progress
  done
  if [ ! -f "$data/wiki.test.tokens" ]; then
    gunzip -c "$text/wiki.test.tokens.gz" > "$data/wiki.test.tokens.tmp" && mv "$data/wiki.test.tokens.tmp" "$data/wiki.test.tokens"
  fi
  if [ ! -f "$data/wiki_heldout100.jsonl.gz" ]; then
    { gunzip -c "$text/wiki_heldout.jsonl.gz" | head -n 100 || true; } | gzip -n > "$data/wiki_heldout100.jsonl.gz.tmp"
    mv "$data/wiki_heldout100.jsonl.gz.tmp" "$data/wiki_heldout100.jsonl.gz"
  fi
  if [ "$(realpath -m "$WORK")" != "$(realpath -m "$ROOT/runs/replicate-cpu")" ] || [ "$MODE" = cpu-toy ]; then
    # the sweep with its paths under $WORK (the shipped file names runs/replicate-cpu/...)
    sweep_file=$WORK/replicate-cpu.yml
    TOY=$([ "$MODE" = cpu-toy ] && echo 1 || echo 0) "$PY" - "$CPU_SWEEP" "$sweep_file" "$WORK" <<'EOF'
import os, sys, yaml
src, dst, work = sys.argv[1:4]
sweep = yaml.safe_load(open(src).read().replace("runs/replicate-cpu/", f"{work.rstrip('/')}/"))
if os.environ["TOY"] == "1":
    sweep["eval"]["max_docs"] = 1
    sweep["eval"]["args"] += ["--no-progress"]
open(dst, "w").write(f"# {src} with its paths under {work}\n" + yaml.safe_dump(sweep, sort_keys=False))
EOF
  fi
  log "plan: $sweep_file -> $WORK"
  # shellcheck disable=SC2086
  "$PY" -m neox_dar.sweep "$sweep_file" plan --out "$WORK" $CPU_OVERRIDES
  log "training and evaluating the runs one after another (a stopped run continues where it stopped)"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} nice -n "$NICE" "$PY" -m neox_dar.sweep "$sweep_file" run --local \
    --out "$WORK" ${RUNS:+--only $RUNS} > >(tee -a "$WORK/logs/sweep.log") 2>&1 \
    || { rc=$?; log "the sweep stopped (exit $rc; 3: interrupted at a checkpoint): run the same command again to continue"
         exit "$rc"; }
  log "report: $WORK/report"
  "$PY" -m neox_dar.report "$WORK" --out "$WORK/report"
}

# ------------------------------------------------------------------------------------------------ settings
MODEL_OVERRIDES=""
[ "$MODEL" = 31m ] && MODEL_OVERRIDES="num_layers=6 hidden_size=256 num_attention_heads=8"
SWEEP_FILE=$SWEEP
CPU_TEXT_ARGS=""
CPU_OVERRIDES=""

case "$MODE" in
  smoke)
    # the same pipeline at toy size on CPU: a tiny model, few articles and documents, two steps per run
    [ -n "$WORK" ] || WORK=$(mktemp -d "${TMPDIR:-/tmp}/replicate-smoke.XXXXXX")
    [ "$(realpath -m "$WORK")" != "$(realpath -m "$ROOT/runs/replicate")" ] || die "--smoke must not write into runs/replicate"
    PACK=$WORK/pack
    PART_SECONDS=${PART_SECONDS_GIVEN:-600}
    RUNS="vanilla-seed1 dar uniform mswa-w128 aha-w32"   # every attention path once (SWA's is MSWA's)
    MEASURE_RUNS="vanilla-seed1"
    MEASURE_STEPS=3
    MEASURE_LOG=1
    MEASURE_EVAL=0
    WORKERS=2
    PARTS=1
    MODEL_OVERRIDES="num_layers=2 hidden_size=64 num_attention_heads=4 seq_length=256 train_batch_size=2
train_micro_batch_size_per_gpu=2 train_iters=2 log_interval=1"
    ;;
  cpu|cpu-toy)
    WORK=${WORK:-runs/replicate-cpu}
    if [ "$MODE" = cpu-toy ]; then
      # the same at toy size: a few articles and documents, a tiny model, two steps per run, two of the runs
      [ "$(realpath -m "$WORK")" != "$(realpath -m "$ROOT/runs/replicate-cpu")" ] || die "--cpu --smoke needs --work DIR (not runs/replicate-cpu)"
      CPU_TEXT_ARGS="--max-articles 20 --heldout-articles 3 --test-articles 1"
      CPU_MIB=1
      RUNS="vanilla-seed1 vanilla-seed2"   # the baseline and the noise floor
      CPU_OVERRIDES="hidden_size=64 seq_length=128 max_position_embeddings=128 train_batch_size=2
train_micro_batch_size_per_gpu=2 train_iters=2 lr_decay_iters=2 eval_interval=1 eval_iters=1 log_interval=1"
    fi
    ;;
  *) WORK=${WORK:-runs/replicate} ;;
esac
mkdir -p "$WORK"
if [[ $MODE == part || $MODE == smoke ]]; then
  # the sweep with its data paths under $WORK (the shipped file names runs/replicate/data)
  SWEEP_FILE=$WORK/replicate-small.yml
  SMOKE=$([ "$MODE" = smoke ] && echo 1 || echo 0) "$PY" - "$SWEEP" "$SWEEP_FILE" "$WORK" <<'EOF'
import os, sys, yaml
src, dst, work = sys.argv[1:4]
text = open(src).read().replace("runs/replicate/data/", f"{work}/data/")
sweep = yaml.safe_load(text)
if os.environ["SMOKE"] == "1":
    sweep["eval"]["max_docs"] = 1
    sweep["eval"]["args"] += ["--batch-size", "2", "--no-progress"]
open(dst, "w").write(f"# {src} with its data under {work}\n" + yaml.safe_dump(sweep, sort_keys=False))
EOF
  # the eval arguments (for the measured evaluation) and, unless given, every run of the sweep in its order
  { read -r EVAL_ARGS; read -r ALL_RUNS; } < <("$PY" -c 'import shlex, sys
from neox_dar.sweep import load_sweep
from neox_dar.sweep.slurm import eval_args
sweep = load_sweep(sys.argv[1])
print(" ".join(shlex.quote(a) for a in eval_args(sweep.eval) if a != "--sweep-manifest"))
print(" ".join(r.name for r in sweep.runs))' "$SWEEP_FILE")
  RUNS=${RUNS:-$ALL_RUNS}
fi

case "$MODE" in
  pack) do_pack ;;
  report) do_report ;;
  part) do_part ;;
  cpu|cpu-toy) do_cpu ;;
  smoke)
    log "smoke run in $WORK (parts of ${PART_SECONDS}s)"
    pack_text --max-mib 1 --max-articles 8 --heldout-articles 1 --test-articles 1 >/dev/null
    for n in 1 2 3 4; do
      START=$(date +%s)
      rc=0
      do_part || rc=$?
      ((rc == 3)) || exit $rc
      log "smoke: part $n stopped at its deadline (${PART_SECONDS}s); the next part continues it, as on the GPU"
    done
    die "the smoke's runs did not finish in 4 parts of ${PART_SECONDS}s (PART_SECONDS)"
    ;;
esac

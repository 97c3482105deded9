#!/usr/bin/env bash
# A small-budget replication of the papers' orderings on real text (docs/experiments.md, "A small replication"):
# the 13 runs of configs/sweeps/replicate-small.yml (Pythia-14M shape, T = 2048, English Wikipedia without the
# WikiText-103 validation/test articles) trained for one token budget and evaluated on WikiText-103 test (the
# official file), the held-out Wikipedia articles, and the shipped C4 and FineWeb-Edu samples, in at most three
# commands of under 9 minutes on one GPU.
#
#   bash scripts/replicate.sh --pack     # here (network for nothing): runs/replicate-pack/ = the text (30 MiB of
#                                        #   compressed Wikipedia), the wheels the recipe needs (from .whl/, built by
#                                        #   scripts/gpu_wheels.sh); checks that it and the tree stay under 64 MiB
#   bash scripts/replicate.sh --part 1   # on the GPU machine: install, tokenize, measure throughput, choose the budget
#                                        #   (runs/replicate/budget.json), train and evaluate part 1's runs
#   bash scripts/replicate.sh --part 2   # then part 2's and part 3's runs (carry runs/replicate-pack and the
#   bash scripts/replicate.sh --part 3   #   runs/replicate/ that the previous parts returned); part 3 ends with the report
#   bash scripts/replicate.sh --report   # anywhere: the tables, figures and the targets from runs/replicate/runs
#   bash scripts/replicate.sh --smoke    # CPU, toy size: the whole pipeline (pack, parts 1-3, report) in a few minutes
#
# Options: --work DIR (default runs/replicate; with --smoke a scratch folder), --pack-dir DIR (default
# runs/replicate-pack), --model 14m|31m (default 14m). A part stops itself at its deadline (PART_SECONDS, default
# 510 s from its start): the running trainer writes a checkpoint; run the same part again to finish it (runs that are
# done are skipped; on a machine that kept the checkpoint the run continues, on a fresh one it starts again). Every
# result is under the work folder; when $OUT is set (the device tool's output folder) each part also copies the
# results without checkpoints or data to $OUT/replicate after every run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
SWEEP=configs/sweeps/replicate-small.yml
WORK=runs/replicate
PACK=runs/replicate-pack
MODEL=14m
MODE=
PART=
WORK_SET=
PART_SECONDS=${PART_SECONDS:-510}
PACK_MIB=${PACK_MIB:-28}
LIMIT_MIB=64
SITE=${TMPDIR:-/tmp}/neox_dar_replicate_site
SHARED=${SHARED:-../shared/data}
# The runs of each part, in order (part 1 also measures the throughput, so it trains fewer)
PART_RUNS=("vanilla-seed1 dar-seed1 uniform-seed1"
           "swa-w128 mswa-w128 aha-w32 aha-w128 vanilla-seed2"
           "dar-seed2 uniform-seed2 vanilla-seed3 dar-seed3 uniform-seed3")
MEASURE_RUNS="vanilla-seed1 dar-seed1 aha-w128"   # the variants whose throughput sets the budget (the slowest wins)
MEASURE_STEPS=${MEASURE_STEPS:-40}
MEASURE_LOG=5                                      # metrics rows every 5 steps: the first (warm-up) is left out
MEASURE_EVAL=1                                     # time one evaluation too (the budget's eval_seconds)
WORKERS=${WORKERS:-1}                              # runs at once (the budget assumes one)
# Wheels the recipe needs from .whl/: the closure of deepspeed, megatron-core and lm-eval (no wandb: the recipe
# logs no W&B), computed from the wheels' metadata against the GPU machine's packages (scripts/gpu_wheels.sh)
RECIPE_WHEELS="annotated_types chardet dataproperty datasets deepspeed defusedxml dill evaluate hjson lm_eval
mbstrdecoder megatron_core more_itertools multiprocess nltk pathvalidate pydantic pydantic_core pytablewriter pytz
rouge_score sqlitedict tabledata tcolorpy typepy typing_inspection word2number"

die() { echo "replicate.sh: error: $*" >&2; exit 2; }
log() { echo "[replicate $(date -u +%H:%M:%S)] $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --pack|--report|--smoke) MODE=${1#--} ;;
    --part) [ $# -ge 2 ] || die "--part needs 1, 2 or 3"; MODE=part; PART=$2; shift ;;
    --work) [ $# -ge 2 ] || die "--work needs a folder"; WORK=$2; WORK_SET=1; shift ;;
    --pack-dir) [ $# -ge 2 ] || die "--pack-dir needs a folder"; PACK=$2; shift ;;
    --model) [ $# -ge 2 ] || die "--model needs 14m or 31m"; MODEL=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[ -n "$MODE" ] || die "say what to do: --pack, --part 1|2|3, --report or --smoke (see --help)"
[[ $MODEL == 14m || $MODEL == 31m ]] || die "--model is 14m or 31m, got '$MODEL'"
if [ "$MODE" = part ]; then [[ $PART == 1 || $PART == 2 || $PART == 3 ]] || die "--part is 1, 2 or 3, got '$PART'"; fi

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }

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
  echo "ok: carry $PACK (and runs/replicate from part 2 on), then run: bash scripts/replicate.sh --part 1"
}

# ------------------------------------------------------------------------------------------------ a part (there)
install() {  # the pack's wheels into a private folder, when the machine lacks them
  if "$PY" -c "import deepspeed, lm_eval" 2>/dev/null; then return 0; fi
  ls "$PACK"/wheels/*.whl >/dev/null 2>&1 || die "no wheels in $PACK/wheels: run bash scripts/replicate.sh --pack"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$PACK"/wheels/*.whl || die "installing the wheels failed"
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  log "installed $(ls "$PACK"/wheels/*.whl | wc -l) wheels into $SITE"
}

prepare_data() {  # the evaluation files and the tokenized training text under $WORK/data
  local data=$WORK/data
  mkdir -p "$data"
  [ -f "$data/wiki.test.tokens" ] || gunzip -c "$PACK/text/wiki.test.tokens.gz" > "$data/wiki.test.tokens"
  cp -f "$PACK/text/wiki_heldout.jsonl.gz" "$data/"
  cp -f "$PACK/text/manifest.json" "$data/pack_manifest.json"
  [ -f "$data/wiki_train.bin" ] && [ -f "$data/wiki_train.idx" ] || \
    "$PY" -m data_prep.tokenize "$PACK/text/wiki_train.jsonl.zst" --tokenizer data/20B_tokenizer.json \
      --out "$data/wiki_train" --no-progress
}

sweep() { "$PY" -m neox_dar.sweep "$SWEEP_FILE" "$@"; }

plan() {  # plan TRAIN_ITERS: the sweep's configs with the data and the budget
  sweep plan --out "$WORK/runs" "data_path=$WORK/data/wiki_train" "train_iters=$1" $MODEL_OVERRIDES >/dev/null
}

since() {  # since T0: seconds since the date +%s.%N stamp T0
  awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f\n", b - a }'
}

measure() {  # short runs of the measured variants, one evaluation, then the budget (part 1, once)
  local m=$WORK/measure t0 t1 run first=${MEASURE_RUNS%% *}
  t0=$(date +%s.%N)
  plan 1
  mkdir -p "$m"
  for run in $MEASURE_RUNS; do
    [ -f "$m/$run/wall_seconds" ] && continue
    rm -rf "${m:?}/$run"
    log "measuring $run: $MEASURE_STEPS steps"
    t1=$(date +%s.%N)
    "$PY" train.py "$WORK/runs/$run/config.yml" "save=$m/$run" "train_iters=$MEASURE_STEPS" \
      "lr_decay_iters=$MEASURE_STEPS" "log_interval=$MEASURE_LOG" >"$m/$run.log" 2>&1 \
      || { tail -n 20 "$m/$run.log"; die "measuring $run failed (log: $m/$run.log)"; }
    since "$t1" > "$m/$run/wall_seconds"
  done
  local eval_s=0
  if ((MEASURE_EVAL)); then
    t1=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$PY" -m neox_dar.sweep.evaluate "$m/$first" $EVAL_ARGS >"$m/eval.log" 2>&1 \
      || { tail -n 20 "$m/eval.log"; die "evaluating $first failed (log: $m/eval.log)"; }
    eval_s=$(since "$t1")
  fi
  # shellcheck disable=SC2086
  "$PY" -m neox_dar.sweep.budget "$m" --runs-per-part $RUNS_PER_PART --part-seconds "$PART_SECONDS" \
    --setup-seconds "$SETUP_SECONDS" --measure-seconds "$(since "$t0")" --eval-seconds "$eval_s" \
    $BUDGET_OPTIONS --out "$WORK/budget.json"
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
  local n=$1 left rc=0 w pids=() codes=()
  shift
  left=$((PART_SECONDS - $(elapsed)))
  if ((left < 10)); then log "part $n: no time left; run --part $n again"; return 3; fi
  log "part $n: $* (${left}s left, $WORKERS worker(s))"
  local groups=()
  for ((w = 0; w < WORKERS; w++)); do groups[w]=""; done
  local i=0 run
  for run in "$@"; do groups[i % WORKERS]="${groups[i % WORKERS]} $run"; i=$((i + 1)); done
  for ((w = 0; w < WORKERS; w++)); do
    [ -n "${groups[w]}" ] || continue
    # SIGTERM at the deadline reaches the trainer through the sweep: it writes a checkpoint, the sweep exits 3
    # shellcheck disable=SC2086
    timeout --foreground -s TERM -k 20 "$left" "$PY" -m neox_dar.sweep "$SWEEP_FILE" run --local --keep-going \
      --out "$WORK/runs" --only ${groups[w]} > "$WORK/logs/part$n-worker$w.log" 2>&1 &
    pids+=($!)
  done
  for w in "${!pids[@]}"; do
    wait "${pids[w]}" || codes+=($?)
  done
  for rc in "${codes[@]}"; do
    if ((rc == 3 || rc == 124)); then log "part $n stopped at its deadline: run --part $n again"; return 3; fi
  done
  if ((${#codes[@]})); then log "part $n: a run failed (exit ${codes[0]}); see $WORK/logs and the runs' logs/"; return 1; fi
  return 0
}

do_part() {  # do_part N: train and evaluate part N's runs until its deadline
  local n=$1 runs rc=0
  runs=${PART_RUNS[$((n - 1))]}
  install
  prepare_data
  SETUP_SECONDS=$(elapsed)
  log "setup (install, data) took ${SETUP_SECONDS}s"
  if [ ! -f "$WORK/budget.json" ]; then
    [ "$n" = 1 ] || die "$WORK/budget.json is missing: run --part 1 first (and carry its runs/replicate)"
    measure
  fi
  plan "$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["train_iters"])' "$WORK/budget.json")"
  mkdir -p "$WORK/logs"
  # shellcheck disable=SC2086
  train_runs "$n" $runs || rc=$?
  # shellcheck disable=SC2086
  prune $runs
  sweep status --out "$WORK/runs" || true
  if [ "$n" = 3 ]; then do_report || rc=$?; fi
  mirror
  return $rc
}

# ------------------------------------------------------------------------------------------------ report
do_report() {  # the report's tables and figures, then the issue's targets with the seed spread beside each number
  "$PY" -m neox_dar.report "$WORK/runs" --out "$WORK/report"
  "$PY" - "$WORK/report/table.json" "$WORK/budget.json" <<'EOF' | tee "$WORK/report/targets.md"
import json, statistics, sys

table, budget = (json.load(open(p)) for p in sys.argv[1:3])
cols = table["columns"]
rows = {r[0]: dict(zip(cols, r)) for r in table["rows"]}
papers = ["FineWeb-Edu", "C4", "WikiText-103"]


def rel(a: dict, b: dict) -> float:  # Rel. (%) of perplexities a against b, mean over the papers' corpora
    return statistics.fmean(a[c] / b[c] * 100 for c in papers)


def seeds(variant: str) -> dict[str, dict]:
    return {n.rsplit("-", 1)[1]: r for n, r in rows.items() if n.startswith(variant + "-seed")
            and all(r.get(c) is not None for c in papers)}


def stat(values: list[float]) -> str:
    return f"{statistics.fmean(values):+.2f}" + (f" (sd {statistics.stdev(values):.2f} over {len(values)} seeds)"
                                                  if len(values) > 1 else " (one seed)")


vanilla, dar, uniform = seeds("vanilla"), seeds("dar"), seeds("uniform")
print(f"## Targets: {budget['tokens_per_run']:,} tokens per run ({budget['train_iters']} steps of "
      f"{budget['tokens_per_step']:,})\n")
if len(vanilla) > 1:
    mean = {c: statistics.fmean(r[c] for r in vanilla.values()) for c in papers}
    noise = [rel(r, mean) - 100 for r in vanilla.values()]
    print(f"- noise floor: vanilla's seeds against their mean, Rel. sd {statistics.stdev(noise):.2f} points")
paired = sorted(set(vanilla) & set(dar))
if paired:
    d = [rel(dar[s], vanilla[s]) - 100 for s in paired]
    print(f"- DAR d/4 - vanilla: {stat(d)} points; target |diff| <= 1.5: "
          f"{'met' if abs(statistics.fmean(d)) <= 1.5 else 'not met'}")
paired = sorted(set(vanilla) & set(dar) & set(uniform))
if paired:
    u = [rel(uniform[s], vanilla[s]) - rel(dar[s], vanilla[s]) for s in paired]
    print(f"- uniform d/4 - DAR d/4: {stat(u)} points; target DAR >= 3 points better: "
          f"{'met' if statistics.fmean(u) >= 3 else 'not met'}")
swa, mswa, base = rows.get("swa-w128"), rows.get("mswa-w128"), vanilla.get("seed1")
if swa and mswa and base and all(x.get(c) is not None for x in (swa, mswa) for c in papers):
    diff = rel(mswa, base) - rel(swa, base)
    print(f"- MSWA w=128 - SWA w=128: {diff:+.2f} points (one seed each; the noise floor above applies) at attention "
          f"cost {mswa.get('Cost') or 0:.3f} vs {swa.get('Cost') or 0:.3f}; target MSWA better at the smaller "
          f"budget: {'met' if diff < 0 and (mswa.get('Cost') or 0) < (swa.get('Cost') or 0) else 'not met'}")
mu = {n: (rows.get(n) or {}).get("mu_f (%)") for n in ("aha-w32", "aha-w128")}
if all(isinstance(v, float) for v in mu.values()):
    print(f"- AHA mu_f: {mu['aha-w32']:.2f}% at w=32, {mu['aha-w128']:.2f}% at w=128 (one seed each); target lower "
          f"at w=128: {'met' if mu['aha-w128'] < mu['aha-w32'] else 'not met'}")
EOF
}

# ------------------------------------------------------------------------------------------------ settings
RUNS_PER_PART=""
for runs in "${PART_RUNS[@]}"; do set -- $runs; RUNS_PER_PART="$RUNS_PER_PART $#"; done
MODEL_OVERRIDES=""
[ "$MODEL" = 31m ] && MODEL_OVERRIDES="num_layers=6 hidden_size=256 num_attention_heads=8"
BUDGET_OPTIONS=""
SWEEP_FILE=$SWEEP

if [ "$MODE" = smoke ]; then
  # the same pipeline at toy size on CPU: a tiny model, few articles and documents, two steps per run, one seed
  [ -n "$WORK_SET" ] || WORK=$(mktemp -d "${TMPDIR:-/tmp}/replicate-smoke.XXXXXX")
  [ "$WORK" != runs/replicate ] || die "--smoke must not write into runs/replicate"
  PACK=$WORK/pack
  PART_SECONDS=${PART_SECONDS:-600}
  PART_RUNS=("vanilla-seed1 dar-seed1" "uniform-seed1 mswa-w128" "aha-w32")   # every attention path once (SWA's is MSWA's)
  MEASURE_RUNS="vanilla-seed1"
  MEASURE_STEPS=3
  MEASURE_LOG=1
  MEASURE_EVAL=0
  WORKERS=2
  MODEL_OVERRIDES="num_layers=2 hidden_size=64 num_attention_heads=4 seq_length=256 train_batch_size=2
train_micro_batch_size_per_gpu=2 log_interval=1"
  BUDGET_OPTIONS="--max-iters 2"
  RUNS_PER_PART=""
  for runs in "${PART_RUNS[@]}"; do set -- $runs; RUNS_PER_PART="$RUNS_PER_PART $#"; done
fi
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
  EVAL_ARGS=$("$PY" -c 'import shlex, sys
from neox_dar.sweep import load_sweep
from neox_dar.sweep.slurm import eval_args
print(" ".join(shlex.quote(a) for a in eval_args(load_sweep(sys.argv[1]).eval) if a != "--sweep-manifest"))' "$SWEEP_FILE")
fi

case "$MODE" in
  pack) do_pack ;;
  report) do_report ;;
  part) do_part "$PART" ;;
  smoke)
    log "smoke run in $WORK"
    pack_text --max-mib 1 --max-articles 40 --heldout-articles 1 --test-articles 1 >/dev/null
    for n in 1 2 3; do START=$(date +%s); do_part "$n"; done
    ;;
esac

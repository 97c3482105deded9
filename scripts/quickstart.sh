#!/usr/bin/env bash
# Quickstart on the embedded sample data (no network): install, tokenize the C4 sample, train a tiny
# vanilla and a tiny DAR model (CPU works; a GPU is used when present), evaluate both with rolling-window
# perplexity on the shipped FineWeb-Edu, C4 and WikiText samples, and print the papers' comparison table.
#   bash scripts/quickstart.sh                  # a few minutes on a 2-core CPU (bench/results/quickstart_cpu.json)
#   STEPS=2000 bash scripts/quickstart.sh       # longer runs
#   SETUP=0 bash scripts/quickstart.sh          # the packages are installed: skip scripts/setup.sh
# Each phase prints its time ("[quickstart] train vanilla: 95 s"), the total at the end.
set -euo pipefail
if [ $# -gt 0 ]; then  # it takes settings from the environment only: --help printed nothing and ran it all
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  case $1 in -h|--help) exit 0 ;; *) echo "quickstart.sh: takes no arguments (got '$1'); set STEPS, OUT, DOCS or SETUP as above" >&2; exit 2 ;; esac
fi
for n in STEPS DOCS; do
  [[ ${!n:-1} =~ ^[1-9][0-9]*$ ]] || { echo "quickstart.sh: $n must be a whole number >= 1, got '${!n}'" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/neox-dar/torch_extensions}
export WANDB_MODE=${WANDB_MODE:-offline}
OUT=${OUT:-runs/quickstart}
STEPS=${STEPS:-200}
DOCS=${DOCS:-20}

phase() {  # phase NAME COMMAND...: run it and say how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "[quickstart] $name: $((SECONDS - start)) s"
}

[ "${SETUP:-1}" = 0 ] || phase setup bash scripts/setup.sh
phase tokenize python3 -m data_prep.tokenize data/sample/c4_sample.jsonl --tokenizer data/20B_tokenizer.json \
  --out "$OUT/data/c4_sample"

for variant in vanilla dar; do
  phase "train $variant" python3 train.py configs/tiny.yml "configs/attention/$variant.yml" \
    data_path="$OUT/data/c4_sample" save="$OUT/$variant" train_iters="$STEPS" \
    window_size=16 checkpoint_factor="$STEPS" eval_interval=100 log_interval=20
  phase "evaluate $variant" python3 -m eval.perplexity "$OUT/$variant" --max-docs "$DOCS" --out "$OUT/$variant/eval.json"
done

python3 -m eval.table "$OUT/dar/eval.json" --baseline "$OUT/vanilla/eval.json" --names "DAR w=16 d_down=16" \
  --format markdown | tee "$OUT/table.md"
echo "[quickstart] total: $SECONDS s"

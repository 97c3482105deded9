#!/usr/bin/env bash
# Quickstart on the embedded sample data (no network): install, tokenize the C4 sample, train a tiny
# vanilla and a tiny DAR model (CPU works; a GPU is used when present), evaluate both with rolling-window
# perplexity on the shipped FineWeb-Edu, C4 and WikiText samples, and print the papers' comparison table.
#   bash scripts/quickstart.sh                  # about 10 minutes on a 2-core CPU, 1-2 on a GPU
#   STEPS=2000 bash scripts/quickstart.sh       # longer runs
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/neox-dar/torch_extensions}
export WANDB_MODE=${WANDB_MODE:-offline}
OUT=${OUT:-runs/quickstart}
STEPS=${STEPS:-200}
DOCS=${DOCS:-20}

python3 -m data_prep.tokenize data/sample/c4_sample.jsonl --tokenizer data/20B_tokenizer.json --out "$OUT/data/c4_sample"

for variant in vanilla dar; do
  python3 train.py configs/tiny.yml "configs/attention/$variant.yml" \
    data_path="$OUT/data/c4_sample" save="$OUT/$variant" train_iters="$STEPS" \
    window_size=16 checkpoint_factor="$STEPS" eval_interval=100 log_interval=20
  python3 -m eval.perplexity "$OUT/$variant" --max-docs "$DOCS" --out "$OUT/$variant/eval.json"
done

python3 -m eval.table "$OUT/dar/eval.json" --baseline "$OUT/vanilla/eval.json" --names "DAR w=16 d_down=16" \
  --format markdown | tee "$OUT/table.md"

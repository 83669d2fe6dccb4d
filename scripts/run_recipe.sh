#!/usr/bin/env bash
# Run a whole recipe: tokenizer -> train -> average the last checkpoints -> translate the test
# split with beam search -> score with sacreBLEU (JSON report in the run directory).
# Usage: bash scripts/run_recipe.sh configs/multi30k_de_en.yaml [section.key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
config="$1"
shift
run=$(python -c "import sys; from transformer import load_config; print(load_config(sys.argv[1], sys.argv[2:]).train.run_dir)" "$config" "$@")
split=$(python -c "import sys; from transformer import load_config; print(load_config(sys.argv[1], sys.argv[2:]).data.test_split)" "$config" "$@")

transformer-train "$config" "$@"       # trains the tokenizer first; resumes if interrupted
transformer-average --run-dir "$run" --last 5 --output "$run/checkpoint_averaged.pt"
transformer-evaluate --checkpoint "$run/checkpoint_averaged.pt" --split "$split" \
    --output "$run/$split.hyp" --report "$run/$split.json"

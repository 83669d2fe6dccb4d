#!/usr/bin/env bash
# The newcomer's tour: train a small German->English model on Multi30k (about 15 minutes on a
# 2-core CPU), translate a few sentences, and score the test set with sacreBLEU.
# Usage: bash scripts/demo.sh   (TRANSFORMER_DATA points at the folder holding multi30k/)
set -euo pipefail
cd "$(dirname "$0")/.."
data="${TRANSFORMER_DATA:-../shared/data}"
run=runs/demo_de_en

transformer-train configs/multi30k_demo.yaml "data.dataset=$data/multi30k" "train.run_dir=$run"

echo "== translating a few sentences"
transformer-translate --checkpoint "$run/checkpoint_best.pt" \
    "Ein Mann fährt mit dem Fahrrad eine Straße entlang." \
    "Zwei Kinder spielen im Schnee." \
    "Eine Frau mit einem roten Hut liest ein Buch."

echo "== scoring Multi30k test2016"
transformer-evaluate --checkpoint "$run/checkpoint_best.pt" --dataset "$data/multi30k" --split test2016 \
    --output "$run/test2016.hyp.en" --report "$run/test2016.json"

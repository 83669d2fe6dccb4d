#!/usr/bin/env bash
# The newcomer's tour: train a small German->English model on Multi30k (about 15 minutes on a
# 2-core CPU), translate a few sentences, and score the test set with sacreBLEU.
# Usage: bash scripts/demo.sh [section.key=value ...]
# The corpus: $TRANSFORMER_DATA/multi30k (default ../shared/data/multi30k) when it exists, otherwise
# the hub dataset $MULTI30K_HUB (default bentrevett/multi30k), which needs internet. Overrides go to
# the training command (and train.run_dir=... moves the run).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;; esac
data="${TRANSFORMER_DATA:+$(realpath -m -- "$TRANSFORMER_DATA")}"  # relative to where the demo is started
started="$PWD"
cd "$(dirname "$0")/.."
data="${data:-../shared/data}"
if [ -d "$data/multi30k" ]; then
    dataset="$data/multi30k"
else
    dataset="${MULTI30K_HUB:-bentrevett/multi30k}"
    if ! reason=$(python -c "import sys; from transformer.data.loading import hub_unreachable; r = hub_unreachable(sys.argv[1]); print(r or ''); sys.exit(1 if r else 0)" "$dataset" 2>/dev/null); then
        echo "demo: no corpus at $data/multi30k, and the hub dataset $dataset cannot be read (${reason:-unknown error}): set TRANSFORMER_DATA to the folder holding multi30k/, or go online" >&2
        exit 2
    fi
    echo "== no corpus at $data/multi30k: using the hub dataset $dataset"
fi
# One Python start reads what the demo needs (scripts/recipe_settings.py): the overrides anchored where the demo
# is started, as run_recipe.sh takes them, the run directory and test split they give, the command as given.
# A bad override is its one-line error, exit 2
mapfile -d '' -t fields < <(python scripts/recipe_settings.py --dataset="$dataset" --check-test-split \
    -- scripts/demo.sh configs/multi30k_demo.yaml "$started" "$@")  # a test split the corpus lacks: now, not at its end
[ "${#fields[@]}" -eq $(($# + 5)) ] || exit 2  # the error is said above
run="${fields[0]}" test="${fields[2]}"
overrides=("${fields[@]:4}")
transformer-train configs/multi30k_demo.yaml "${overrides[@]}"
printf '%s\n' "${fields[3]}" > "$run/command.txt"  # for results_table.py
checkpoint="$run/checkpoint_best.pt"
if [ ! -f "$checkpoint" ]; then  # validation runs once an epoch: a run stopped within its first one has no best
    checkpoint="$run/checkpoint_last.pt"
    echo "== no checkpoint_best.pt in $run (the run never validated): using checkpoint_last.pt"
fi

echo "== translating a few sentences"
transformer-translate --checkpoint "$checkpoint" \
    "Ein Mann fährt mit dem Fahrrad eine Straße entlang." \
    "Zwei Kinder spielen im Schnee." \
    "Eine Frau mit einem roten Hut liest ein Buch."

echo "== scoring the test split"  # of the corpus and split the run was trained with (data.* overrides too)
transformer-evaluate --checkpoint "$checkpoint" --output "$run/$test.hyp.en" --report "$run/$test.json"

#!/usr/bin/env bash
# Run a whole recipe: tokenizer -> train -> average the last checkpoints -> pick the best-on-validation
# of the best, the averaged and the last checkpoint (the settled weights a train.cooldown ends on) ->
# translate the test split with beam search -> score with sacreBLEU (JSON reports in the run directory).
# Usage: bash scripts/run_recipe.sh configs/multi30k_de_en.yaml [section.key=value ...]
#        AVERAGE_LAST=5 bash scripts/run_recipe.sh ...   (how many numbered checkpoints to average; default 3)
set -euo pipefail
given="${1:?usage: bash scripts/run_recipe.sh CONFIG [section.key=value ...]}"
shift
config=$(realpath -m -- "$given")  # relative to where the recipe is started
given_overrides=("$@")
started="$PWD"
cd "$(dirname "$0")/.."
# relative paths in overrides (train.run_dir=runs/x, data.dataset=corpus/) are where the recipe is started too
mapfile -d '' -t anchored < <(python -c "import sys
from transformer.config_loading import anchored_overrides
print(*anchored_overrides(sys.argv[2:], sys.argv[1]), sep='\0', end='')" "$started" "$@")
[ "${#anchored[@]}" -eq $# ] || { echo "error: could not read the overrides $*" >&2; exit 1; }
set -- "${anchored[@]}"
setting() {  # setting EXPRESSION [overrides...]: a value of the config, e.g. c.train.run_dir; a bad one: one line
    local expression="$1"
    shift
    python -c "import sys
from transformer import load_config
from transformer.cli import USER_ERRORS
from transformer.data.corpus import check_splits
try:
    c = load_config(sys.argv[1], sys.argv[2:])
    value = $expression
except USER_ERRORS as error:
    sys.exit(f'error: {error}')
print(value)" "$config" "$@"
}
run=$(setting c.train.run_dir "$@")
valid=$(setting c.data.valid_split "$@")
test=$(setting c.data.test_split "$@")
# a test split the corpus lacks: said now, not after hours of training (training checks its own splits only)
setting "check_splits(c.data, ('test_split',))" "$@" > /dev/null

mkdir -p "$run"
python -c "import os, shlex, sys; n = os.environ.get('AVERAGE_LAST'); print((f'AVERAGE_LAST={n} ' if n else '') + shlex.join(sys.argv[1:]))" \
    bash scripts/run_recipe.sh "$given" "${given_overrides[@]}" > "$run/command.txt"  # for scripts/results_table.py, quoted as a shell reads it
transformer-train "$config" "$@"       # trains the tokenizer first; resumes if interrupted
transformer-average --run-dir "$run" --last "${AVERAGE_LAST:-3}" --output "$run/checkpoint_averaged.pt"
candidates=()
for name in best averaged last; do
    if [ ! -f "$run/checkpoint_$name.pt" ]; then  # no best: the run never validated (train.valid_every > max_steps)
        echo "== no checkpoint_$name.pt in $run: choosing among the others"
        continue
    fi
    transformer-evaluate --checkpoint "$run/checkpoint_$name.pt" --split "$valid" --report "$run/$valid.$name.json"
    candidates+=("$name")
done
chosen=$(python -c "import json, sys; run, valid = sys.argv[1:3]; print(max(sys.argv[3:], key=lambda n: json.load(open(f'{run}/{valid}.{n}.json'))['scores']['bleu']['score']))" \
    "$run" "$valid" "${candidates[@]}")  # paths as arguments: a quote in one is no Python syntax
echo "== $chosen checkpoint scores highest on $valid: translating $test with it"
transformer-evaluate --checkpoint "$run/checkpoint_$chosen.pt" --split "$test" \
    --output "$run/$test.hyp" --report "$run/$test.json"

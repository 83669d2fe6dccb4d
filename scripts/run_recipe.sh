#!/usr/bin/env bash
# Run a whole recipe: tokenizer -> train -> average the last checkpoints -> pick the best-on-validation
# of the best, the averaged and the last checkpoint (the settled weights a train.cooldown ends on) ->
# translate the test split with beam search -> score with sacreBLEU (JSON reports in the run directory).
# Usage: bash scripts/run_recipe.sh configs/multi30k_de_en.yaml [section.key=value ...]
#        AVERAGE_LAST=5 bash scripts/run_recipe.sh ...   (how many numbered checkpoints to average; default 3)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;; esac
[ $# -ge 1 ] || { echo "usage: bash scripts/run_recipe.sh CONFIG [section.key=value ...]" >&2; exit 2; }
given="$1"
shift
config=$(realpath -m -- "$given")  # relative to where the recipe is started
started="$PWD"
cd "$(dirname "$0")/.."
# One Python start reads what the recipe needs (scripts/recipe_settings.py); a bad config or override is one line
mapfile -d '' -t fields < <(python scripts/recipe_settings.py --given-config="$given" --check-test-split --recipe=single \
    --average-last="${AVERAGE_LAST:-}" -- scripts/run_recipe.sh "$config" "$started" "$@")  # =: a value may start with -
[ "${#fields[@]}" -eq $(($# + 4)) ] || exit 2  # the error is said above
run="${fields[0]}" valid="${fields[1]}" test="${fields[2]}"
set -- "${fields[@]:4}"

decode=()  # the decoding settings given: every candidate is scored with them (its own config may be older)
for setting in "$@"; do [[ "$setting" != decode.* ]] || decode+=("$setting"); done

transformer-train "$config" "$@"       # trains the tokenizer first; resumes if interrupted
# an earlier session's reports are of other weights: results_table.py must not read them beside this command
rm -f "$run/$valid".{best,averaged,last}.json "$run/$test.json" "$run/$test.hyp"
printf '%s\n' "${fields[3]}" > "$run/command.txt"  # for results_table.py; not for settings training refused
# a stop from here on (Ctrl-C, a failed evaluation) ended without a word: say where, and how to go on
stage="averaging the last checkpoints"
trap 'status=$?; [ "$status" -eq 0 ] || echo "run_recipe.sh: stopped (exit $status) while $stage; the training is done: the same command scores the run again" >&2' EXIT
transformer-average --run-dir "$run" --last "${AVERAGE_LAST:-3}" --output "$run/checkpoint_averaged.pt"
candidates=()
for name in best averaged last; do
    if [ ! -f "$run/checkpoint_$name.pt" ]; then  # no best: the run never validated (train.valid_every > max_steps)
        echo "== no checkpoint_$name.pt in $run: choosing among the others"
        continue
    fi
    stage="scoring checkpoint_$name.pt on $valid"
    transformer-evaluate --checkpoint "$run/checkpoint_$name.pt" --split "$valid" --report "$run/$valid.$name.json" \
        "${decode[@]+"${decode[@]}"}"
    candidates+=("$name")
done
chosen=$(python -c "import json, sys; run, valid = sys.argv[1:3]; print(max(sys.argv[3:], key=lambda n: json.load(open(f'{run}/{valid}.{n}.json'))['scores']['bleu']['score']))" \
    "$run" "$valid" "${candidates[@]}")  # paths as arguments: a quote in one is no Python syntax
echo "== $chosen checkpoint scores highest on $valid: translating $test with it"
stage="translating $test"
transformer-evaluate --checkpoint "$run/checkpoint_$chosen.pt" --split "$test" \
    --output "$run/$test.hyp" --report "$run/$test.json" "${decode[@]+"${decode[@]}"}"

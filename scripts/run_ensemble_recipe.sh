#!/usr/bin/env bash
# An ensemble recipe: MEMBERS (default 3) models of one config trained at once, differing in train.seed alone (1, 2,
# ...), each a whole scripts/run_recipe.sh in RUN/seed_K (its checkpoint chosen on validation, its test split
# scored); then their ensemble (the chosen checkpoints averaging their log-probabilities at every step:
# docs/decoding.md) scored on validation, and on the test split if it scores higher there than every member.
# Why at once: on a GPU the recipe's small model leaves most of the chip idle (docs/gpu.md), so a few trainings side
# by side take little more wall time than one. The members train their own tokenizers, from the same text while the
# tokenizer's sample is the whole corpus (data.spm_input_sentence_size: source and target sentences together with a
# joint vocabulary; not a streamed corpus): different ones are refused once the members have trained.
# Usage: MEMBERS=3 bash scripts/run_ensemble_recipe.sh CONFIG [section.key=value ...]
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;; esac
usage="usage: MEMBERS=3 bash scripts/run_ensemble_recipe.sh CONFIG [section.key=value ...]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
given="$1"
shift
for setting in "$@"; do  # each member's seed is its number
    if [[ "$setting" == train.seed=* ]]; then
        echo "error: $setting: the members train with seeds 1 to MEMBERS; drop it" >&2
        exit 2
    fi
done
members="${MEMBERS:-3}"
if ! [[ "$members" =~ ^[0-9]+$ ]] || [ "$((10#$members))" -lt 2 ]; then
    echo "error: MEMBERS=$members: an ensemble has 2 members or more" >&2
    exit 2
fi
members=$((10#$members))  # 08 is 8, not an octal error
config=$(realpath -m -- "$given")  # relative to where the recipe is started
started="$PWD"
cd "$(dirname "$0")/.."
mapfile -d '' -t fields < <(python scripts/recipe_settings.py --given-config="$given" --check-test-split --recipe=ensemble \
    --average-last="${AVERAGE_LAST:-}" -- scripts/run_ensemble_recipe.sh "$config" "$started" "$@")
[ "${#fields[@]}" -eq $(($# + 4)) ] || exit 2  # the error is said above
run="${fields[0]}" valid="${fields[1]}" test="${fields[2]}" command="MEMBERS=$members ${fields[3]}"
set -- "${fields[@]:4}"
mkdir -p "$run"

echo "== training $members members at once: $run/seed_1 ... seed_$members (their output: $run/seed_K.log)"
stamp="== $(date -u '+%F %T UTC'): $command"  # a re-run resumes the members: their logs grow, not start over
threads=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / members ))  # the cores shared out (a train.threads=
# given wins: it comes after); nproc counts OMP_NUM_THREADS, not the cores, where it is set
pids=()
for k in $(seq "$members"); do
    echo "$stamp" >>"$run/seed_$k.log"
    bash scripts/run_recipe.sh "$config" train.threads=$((threads > 0 ? threads : 1)) "$@" train.run_dir="$run/seed_$k" \
        train.seed="$k" >>"$run/seed_$k.log" 2>&1 &
    pids+=($!)
done
# as each member ends: the first to fail stops the others (they save a checkpoint; the same command resumes them),
# where it was said only once every other member had trained its whole budget
failed=0 interrupted=0
trap 'interrupted=1' INT  # a Ctrl-C reaches the members too: wait for them to save, then say so (not die at once)
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
    status=0 ended=""  # none, where the wait was cut short by the Ctrl-C's trap
    wait -n "${running[@]}" || status=$?  # (wait -p, which names the one, needs bash 5.1)
    left=()  # the one reaped is the one no longer there (one that ended meanwhile is there until reaped)
    for pid in "${running[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then left+=("$pid"); else ended="$pid"; fi
    done
    running=("${left[@]+"${left[@]}"}")
    for k in $(seq "$members"); do [ "${pids[k - 1]}" != "$ended" ] || break; done
    if [ "$status" -eq 130 ]; then  # a Ctrl-C: each member saved and says so in its log; the command resumes them
        interrupted=1
    elif [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
        echo "== member $k failed; the end of $run/seed_$k.log:" >&2
        tr '\r' '\n' <"$run/seed_$k.log" | grep -v '^ *$' | tail -n 5 >&2
        failed=1
        for pid in "${pids[@]}"; do  # each member's training (a TERM to its script alone would leave it running)
            pkill -TERM -P "$pid" 2>/dev/null || true
        done
        echo "== stopping the other members" >&2
    fi
done
[ "$failed" -eq 0 ] || exit 1
[ "$interrupted" -eq 0 ] || { echo "interrupted: the same command resumes the members" >&2; exit 130; }

# the members' validation scores, the time their trainings took, then each one's chosen checkpoint
mapfile -t summary < <(python scripts/ensemble_members.py "$run" "$valid" "$test" "$members")
[ "${#summary[@]}" -eq $((members + 2)) ] || exit 1  # its error is said above
echo "== members' validation BLEU: ${summary[0]}; training: ${summary[1]}"
checkpoints=()
for checkpoint in "${summary[@]:2}"; do
    checkpoints+=(--checkpoint "$checkpoint")
done
transformer-evaluate "${checkpoints[@]}" --split "$valid" --report "$run/$valid.ensemble.json"
best=$(python scripts/ensemble_members.py "$run" "$valid" "$test" "$members" --best)
if [ "$best" = ensemble ]; then
    echo "== the ensemble scores highest on $valid: translating $test with it"
    transformer-evaluate "${checkpoints[@]}" --split "$test" --output "$run/$test.hyp" --report "$run/$test.json"
else
    echo "== member ${best#seed_} scores higher on $valid than the ensemble: its $test report is the recipe's"
    cp "$run/$best/$test.json" "$run/$test.json"
fi
printf '%s\n' "$command" >"$run/command.txt"

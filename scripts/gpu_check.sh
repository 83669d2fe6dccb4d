#!/usr/bin/env bash
# The GPU measurements of issue 32 in one call of a lent GPU (docs/gpu.md).
#
#   bash scripts/gpu_check.sh prepare             # here, once: wheels the GPU machine lacks + the corpus, into .gpu/
#   bash scripts/gpu_check.sh STAGE [STAGE ...]   # there; results in $OUT. Stages, run in the order given:
#       benchmark   the GPU benchmark (scripts/benchmark.py --parts gpu)
#       loss        the training loss's two forms at the base size's 25k tokens, eager and compiled (four
#                   compilations, a minute or two: scripts/benchmarks/loss_forms.py; transformer/fast/loss.py)
#       tests       tests/test_cuda.py
#       de-en       the 90-second recipe, configs/multi30k_de_en_gpu.yaml (under CUDA graphs)
#       en-de       the 3-minute recipe, configs/multi30k_en_de_gpu.yaml (likewise), with EN_DE_OVERRIDES if set
#                   (a variant of en-de-sweep's, e.g. EN_DE_OVERRIDES="train.max_steps=4000 model.d_model=512 ...")
#       (with MEMBERS=N set, the recipes of the call are scripts/run_ensemble_recipe.sh's: N seeds at once, ensembled)
#       multilingual  issue 33's comparison: six bilingual models of MULTILINGUAL_STEPS (default 1500) steps
#                   and the multilingual one of six times that, all at once on the GPU (scripts/compare_multilingual.py)
#       en-de-sweep  en->de variants (EN_DE_VARIANTS below) side by side for SWEEP_STEPS (default 4000) steps each,
#                   started in the background: the stages named after it run beside them (not the timed recipes:
#                   they must run alone), and the script waits for the sweep at its end and prints its table
#
# The GPU machine has torch but not `datasets` (with dill and multiprocess; its pyarrow and fsspec may be
# out of the range datasets needs), and cannot download: they travel as wheels, and Multi30k as a copy,
# in the git-ignored .gpu/ that the device call carries. Each stage has a time limit (the variables
# below), so that one that overruns leaves time for the next; each runs alone on the GPU, but for the stages
# named after en-de-sweep, which run beside its trainings (a timed recipe or the benchmark may not). Their
# limits add up to more than one 10-minute call: name the stages that fit. The exit status is 1 if a
# stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=(datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pyarrow==26.0.1 fsspec==2026.9.0)  # tested here; Python 3.12 there

if [ "${1:-}" = prepare ]; then
    set -e
    mkdir -p .gpu/wheels .gpu/data
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/wheels "${wheels[@]}"
    cp -r "${TRANSFORMER_DATA:-../shared/data}/multi30k" .gpu/data/
    du -sh .gpu
    exit 0
fi

stages=("$@")
names="benchmark, loss, tests, de-en, en-de, multilingual, en-de-sweep"
[ ${#stages[@]} -gt 0 ] || { echo "name the stages to run: $names" >&2; exit 2; }
sweeping=0
for stage in "${stages[@]}"; do
    case "$stage" in
        benchmark | loss | de-en | en-de) [ "$sweeping" -eq 0 ] || { echo "$stage after en-de-sweep would run beside its" \
            "trainings: name it first, or in a call of its own" >&2; exit 2; } ;;
        tests | multilingual) ;;
        en-de-sweep) sweeping=1 ;;
        *) echo "unknown stage $stage ($names)" >&2; exit 2 ;;
    esac
done

out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" TRANSFORMER_DATA="$PWD/.gpu/data" PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null \
    || echo "pip install -e . failed: the recipe's transformer-* commands will be missing"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c "import torch, datasets, pyarrow; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/machine.txt"

benchmark() {
    timeout "${BENCHMARK_TIMEOUT:-240}" python3 scripts/benchmark.py --parts gpu --device cuda \
        --output "$out/gpu_benchmark.json" 2>&1 | grep -v '^USDT' | tee "$out/gpu_benchmark.log"
    return "${PIPESTATUS[0]}"
}

loss() {
    timeout "${LOSS_TIMEOUT:-150}" python3 -m scripts.benchmarks.loss_forms --device cuda --tokens 25000 2>&1 \
        | grep -v '^USDT' | tee "$out/loss_forms.log"
    return "${PIPESTATUS[0]}"
}

tests() {  # stopped by an interrupt at its limit, pytest still says which tests ran and the slowest ones
    timeout -s INT -k 30 "${TESTS_TIMEOUT:-400}" python3 -m pytest tests/test_cuda.py -v -p no:cacheprovider -rs \
        --durations=0 2>&1 | tee "$out/test_cuda.log"
    return "${PIPESTATUS[0]}"
}

recipe() {  # recipe NAME CONFIG [OVERRIDE ...]: train, choose on val, score test2016; the run's records
    local name="$1" config="$2" run="/tmp/gpu_recipe_$1"  # (no checkpoints) to $OUT
    shift 2
    rm -rf "$run"  # a warm machine keeps /tmp: a new run, not a resumed one
    local script=scripts/run_recipe.sh
    [ -z "${MEMBERS:-}" ] || script=scripts/run_ensemble_recipe.sh  # MEMBERS models at once, and their ensemble
    timeout "${RECIPE_TIMEOUT:-360}" bash "$script" "$config" train.run_dir="$run" \
        data.dataset="$TRANSFORMER_DATA/multi30k" "$@" 2>&1 | tr '\r' '\n' | grep -v -E '^ *[0-9]+%|/s\]$' \
        | tee "$out/recipe_$name.log"
    local status="${PIPESTATUS[0]}"
    tar -czf "$out/recipe_$name.tar.gz" -C "$run" --exclude='*.pt' --exclude=cache . 2>/dev/null
    python3 -c "import json, pathlib, sys; [print(p.name, {k: round(v['score'], 2) for k, v in json.loads(p.read_text())
['scores'].items() if k in ('bleu', 'chrf')}) for p in sorted(pathlib.Path(sys.argv[1]).glob('*.json'))]" "$run"
    return "$status"
}

multilingual() {
    local root=/tmp/compare_multilingual
    rm -rf "$root"
    timeout "${MULTILINGUAL_TIMEOUT:-540}" python3 scripts/compare_multilingual.py --steps "${MULTILINGUAL_STEPS:-1500}" \
        --parallel 7 --run-root "$root" data.dataset="$TRANSFORMER_DATA/multi30k" train.device=cuda \
        train.precision=bf16 train.threads=2 data.batch_tokens=8192 train.cooldown=0.3 2>&1 | tee "$out/multilingual.log"
    local status="${PIPESTATUS[0]}"
    tar -czf "$out/multilingual.tar.gz" -C "$root" --exclude='*.pt' --exclude=cache --exclude=tensorboard . 2>/dev/null
    return "$status"
}

# en->de in 3 minutes (issue 32) scored 39.20 on an H100 with the recipe's model, its validation loss lowest at 5,000
# steps and its BLEU flat from 7,500 (docs/gpu.md): an ensemble of three seeds of the recipe trained at once (its seed_1 the recipe alone), the CPU
# recipe's batches and warm-up (for twice the steps: as many tokens, a step costing little more than half), a wider
# and a deeper model
EN_DE_VARIANTS=(
    "ensemble:"
    "b4096:data.batch_tokens=4096 train.warmup_steps=1000 train.max_steps=$((2 * ${SWEEP_STEPS:-4000}))"
    "wide:model.d_model=512 model.n_heads=8 model.d_ff=2048"
    "deep:model.n_encoder_layers=6 model.n_decoder_layers=6"
)
sweep_root=/tmp/en_de_sweep
sweep_pids=()

en_de_sweep() {  # each variant a whole recipe (the ensemble: scripts/run_ensemble_recipe.sh), by steps, in the background
    rm -rf "$sweep_root"
    mkdir -p "$sweep_root"
    local variant name script
    for variant in "${EN_DE_VARIANTS[@]}"; do
        name="${variant%%:*}"
        script=scripts/run_recipe.sh
        [ "$name" != ensemble ] || script=scripts/run_ensemble_recipe.sh
        read -r -a overrides <<<"${variant#*:}"
        MEMBERS=3 timeout "${SWEEP_TIMEOUT:-420}" bash "$script" configs/multi30k_en_de_gpu.yaml \
            train.run_dir="$sweep_root/$name" data.dataset="$TRANSFORMER_DATA/multi30k" train.max_time= \
            train.max_steps="${SWEEP_STEPS:-4000}" train.threads=2 "${overrides[@]}" >"$sweep_root/$name.log" 2>&1 &
        sweep_pids+=($!)
    done
    echo "en-de-sweep: ${#EN_DE_VARIANTS[@]} recipes (6 trainings) started in the background, in $sweep_root"
}

sweep_report() {  # waits for the sweep; a table of its runs (validation chooses: test2016 is printed, not used)
    local status=0 pid
    for pid in "${sweep_pids[@]}"; do
        wait "$pid" || status=1
    done
    python3 - "$sweep_root" "${EN_DE_VARIANTS[@]}" <<'PY' | tee "$out/en_de_sweep.md"
import json, pathlib, sys
from transformer.training.metrics import METRICS_FILE, read_metrics
root = pathlib.Path(sys.argv[1])
def score(path):
    return f"{json.loads(path.read_text())['scores']['bleu']['score']:.2f}" if path.exists() else "-"
def records(run, kind):
    return [r for r in read_metrics(run) if r["kind"] == kind] if (run / METRICS_FILE).exists() else []
def steps(run):  # the steps trained, and validation BLEU (greedy) during training: what a run cut short shows
    curve = ", ".join(f"{r['bleu']:.1f}" for r in records(run, "valid"))
    return f"{max((r['step'] for r in records(run, 'train')), default=0)} ({curve})"
print("| variant | overrides | steps (val BLEU in training) | val best / averaged / last (beam) | test2016 |\n"
      "|---|---|---|---|---|")
for variant in sys.argv[2:]:
    name, overrides = variant.split(":", 1)
    run = root / name
    members = sorted(path for path in run.glob("seed_*") if path.is_dir())  # not their logs
    for member in members or [run]:  # an ensemble's members, then the ensemble
        val = " / ".join(score(member / f"val.{kind}.json") for kind in ("best", "averaged", "last"))
        label = f"{name} {member.name}" if members else name
        print(f"| {label} | {overrides or '(the config)'} | {steps(member)} | {val} | {score(member / 'test2016.json')} |")
    if members:
        print(f"| {name} | the {len(members)} above | | ensemble {score(run / 'val.ensemble.json')} | "
              f"{score(run / 'test2016.json')} (the recipe's choice) |")
PY
    tar -czf "$out/en_de_sweep.tar.gz" -C "$sweep_root" --exclude='*.pt' --exclude=cache --exclude=tensorboard \
        --exclude='*.hyp' . 2>/dev/null
    return "$status"
}

failed=0
for stage in "${stages[@]}"; do
    start=$SECONDS
    case "$stage" in
        benchmark) benchmark ;;
        loss) loss ;;
        tests) tests ;;
        de-en) recipe de_en configs/multi30k_de_en_gpu.yaml ;;
        en-de)
            read -r -a overrides <<<"${EN_DE_OVERRIDES:-}"
            recipe en_de configs/multi30k_en_de_gpu.yaml "${overrides[@]}" ;;
        multilingual) multilingual ;;
        en-de-sweep) en_de_sweep ;;
    esac
    status=$?
    [ "$status" -eq 0 ] || failed=1
    echo "== $stage: exit $status, $((SECONDS - start)) s"
done
if [ ${#sweep_pids[@]} -gt 0 ]; then
    start=$SECONDS
    sweep_report || failed=1
    echo "== en-de-sweep: waited $((SECONDS - start)) s at the end"
fi
exit "$failed"

#!/usr/bin/env bash
# The GPU measurements of issue 32 in one call of a lent GPU (docs/gpu.md).
#
#   bash scripts/gpu_check.sh prepare   # here, once: wheels the GPU machine lacks + the corpus, into .gpu/
#   bash scripts/gpu_check.sh           # there: the GPU benchmark, then tests/test_cuda.py; results in $OUT
#
# The GPU machine has torch but not `datasets` (with dill and multiprocess), and cannot download: they
# travel as wheels, and Multi30k as a copy, in the git-ignored .gpu/ that the device call carries.
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=(datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)  # the versions tested here; the machine has Python 3.12

if [ "${1:-}" = prepare ]; then
    set -e
    mkdir -p .gpu/wheels .gpu/data
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/wheels "${wheels[@]}"
    cp -r "${TRANSFORMER_DATA:-../shared/data}/multi30k" .gpu/data/
    du -sh .gpu
    exit 0
fi

out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" TRANSFORMER_DATA="$PWD/.gpu/data" PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c "import torch, datasets, pyarrow; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/machine.txt"

start=$SECONDS
timeout "${BENCHMARK_TIMEOUT:-270}" python3 scripts/benchmark.py --parts gpu --device cuda \
    --output "$out/gpu_benchmark.json" 2>&1 | grep -v '^USDT' | tee "$out/gpu_benchmark.log"
echo "benchmark: exit ${PIPESTATUS[0]}, $((SECONDS - start)) s" | tee -a "$out/gpu_benchmark.log"

start=$SECONDS
timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -rs --durations=8 \
    2>&1 | tee "$out/test_cuda.log"
echo "tests: exit ${PIPESTATUS[0]}, $((SECONDS - start)) s" | tee -a "$out/test_cuda.log"

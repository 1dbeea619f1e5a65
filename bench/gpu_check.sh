#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and infercc installed with its tensorrt
# extra (pip install -e ".[tensorrt,test]"): the GPU tests (pytest -m gpu), then
# bench/tensorrt_models.py, then one JSON summary: versions, the GPU, the tests' outcome, and
# per model and precision the validation, the layer precisions, the build time cold and with
# the timing cache, and the engine's p50 latency against onnxruntime's (CPU). The fields are
# in bench/gpu_check.py's docstring.
#
#   bench/gpu_check.sh [SUMMARY.json]          (default bench/.cache/gpu_check.json)
#
# It finishes within 8 minutes on one GPU: the tests get at most GPU_CHECK_TEST_S seconds
# (180), the models what is left of GPU_CHECK_BUDGET_S (450) and start no row in its last 90
# seconds; a step cut off by its limit is reported (exit code 124). Models: GPU_CHECK_MODELS
# (default resnet50,squeezenet,shufflenet; the light_* models onnx ships), fp32 and fp16 each.
# PYTHON picks the interpreter (default python).
#
# Exit codes: 2 with the reason where TensorRT or a GPU is missing (nothing else runs),
# 1 when a GPU test or a model failed or a step ran out of time, 0 when all passed.
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/.cache/gpu_check.json}
py=${PYTHON:-python}
budget=${GPU_CHECK_BUDGET_S:-450}
test_limit=${GPU_CHECK_TEST_S:-180}
models=${GPU_CHECK_MODELS:-resnet50,squeezenet,shufflenet}
start=$SECONDS

if ! command -v "$py" >/dev/null 2>&1; then
    echo "gpu_check: cannot run here: no Python interpreter '$py' (set PYTHON)" >&2
    exit 2
fi
if ! command -v timeout >/dev/null 2>&1; then
    echo "gpu_check: cannot run here: the timeout command (coreutils) is missing" >&2
    exit 2
fi
"$py" bench/gpu_check.py probe || exit 2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "gpu_check: pytest -m gpu (at most ${test_limit} s)"
timeout "$test_limit" "$py" -m pytest -m gpu -q -p no:cacheprovider \
    --junitxml "$work/tests.xml" >"$work/tests.log" 2>&1
tests_rc=$?
tail -n 3 "$work/tests.log"

left=$((budget - (SECONDS - start)))
echo "gpu_check: bench/tensorrt_models.py --models $models (at most ${left} s)"
timeout "$left" "$py" bench/tensorrt_models.py --no-bert --models "$models" --iters 50 \
    --json "$work/models.json" --deadline $((left > 120 ? left - 90 : 30))
models_rc=$?

"$py" bench/gpu_check.py summarize "$out" "$work" "$tests_rc" "$models_rc" "$((SECONDS - start))"

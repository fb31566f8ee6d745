#!/usr/bin/env bash
# Ember's GPU checks in one call on a lent GPU machine: the GPU tests (marked `gpu`), bench/batching.py with the
# models on the GPU and bench/cold_start.py with GPU replicas, everything written under $OUT. Prepared here and run there by the `device` tool in one call:
#
#   bash bench/gpu/wheels.sh                      # here, once: .whl/, the packages the machine's image lacks
#   run(command="bash bench/gpu/check.sh", carry=[".whl"], timeout_s=560)
#
# The machine's image is bare of Ember's runtime but holds torch's CUDA build (its python3, 3.12), so the wheels are
# installed into that environment and this checkout's sources put on its path (a .pth file), as an editable
# install would. Nothing there reaches the internet, and Debian's passt is not installed: replicas run in their
# sandboxes on the node's network (the agent says so). Each step says when it began; a step that fails does not
# stop the next. Without a GPU (here) the GPU tests skip, saying why, and the benchmark runs on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ember-gpu}
PY=${PY:-python3}
TESTS_S=${TESTS_S:-150}
BENCH_S=${BENCH_S:-150}
STARTS_S=${STARTS_S:-150}
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

step "the machine"
uname -r
nproc
"$PY" --version
if nvidia-smi -L; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    DEVICE=cuda
else
    echo "no GPU: the GPU tests skip and the benchmark runs on the CPU"
    DEVICE=cpu
fi

step "Ember into $PY's environment"
if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
else
    echo "no .whl/: run bench/gpu/wheels.sh here first and carry .whl" && exit 1
fi
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$PWD/sdk" "$PWD/platform" "$PWD/runtime" > "$site/ember-checkout.pth"
"$PY" -m compileall -q sdk platform runtime  # sandboxed replicas cannot write the bytecode they read
"$PY" - <<'PY' || exit 1
import ember, ember_platform, ember_runtime, nats, msgspec, starlette
try:
    import torch
    print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "no cuda",
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except ImportError:
    print("no torch")
PY

step "the GPU tests (pytest -m gpu)"
# torch's and Ember's own; ONNX Runtime's, TensorRT's and vLLM's only where the machine has their GPU builds (the
# image's onnxruntime is the CPU one; onnxruntime-gpu, tensorrt and vllm are each far over what a call carries).
tests=(tests/unit/backends/test_backend_torch.py tests/integration/test_gpu_replicas.py)
"$PY" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
    2> /dev/null && tests+=(tests/unit/backends/test_backend_onnx.py) || echo "not run: ONNX Runtime's (no CUDA build)"
"$PY" -c 'import tensorrt' 2> /dev/null && tests+=(tests/unit/backends/test_backend_tensorrt.py) \
    || echo "not run: TensorRT's (no tensorrt)"
"$PY" -c 'import vllm' 2> /dev/null && tests+=(tests/unit/backends/test_backend_vllm.py) \
    || echo "not run: vLLM's (no vllm)"
# -W default: a warning of the machine's own library versions is shown, not turned into a failure.
timeout "$TESTS_S" "$PY" -m pytest -p no:cacheprovider -q -rs -W default -m gpu "${tests[@]}" 2>&1 \
    | tee "$OUT/gpu_tests.log"

step "bench/batching.py --quick --device $DEVICE"
timeout "$BENCH_S" "$PY" bench/batching.py --quick --device "$DEVICE" 2>&1 | tee "$OUT/batching.md"

if [ "$DEVICE" = cuda ]; then
    step "bench/cold_start.py --repeats 2 --burst 2 --gpu 8GB"
    timeout "$STARTS_S" "$PY" bench/cold_start.py --repeats 2 --burst 2 --gpu 8GB 2>&1 | tee "$OUT/cold_start.md"
fi

step "done"

#!/usr/bin/env bash
# Ember's GPU checks in one call on a lent GPU machine: the GPU tests (marked `gpu`), bench/batching.py with the
# models on the GPU and bench/cold_start.py with GPU replicas, everything written under $OUT. Prepared here and run
# there by the `device` tool in one call:
#
#   bash bench/gpu/wheels.sh                      # here, once: .whl/, the packages the machine's image lacks
#   run(command="bash bench/gpu/check.sh", carry=[".whl"], timeout_s=560)
#
# The machine's image is bare of Ember's runtime but holds torch's CUDA build (its python3, 3.12), so the wheels are
# installed into that environment and this checkout's sources put on its path (a .pth file), as an editable
# install would. Nothing there reaches the internet, and Debian's passt is not installed: replicas run in their
# sandboxes on the node's network (the agent says so). Each step says when it began and how it ended; a step that
# fails does not stop the next, and the script's status counts the steps that failed. A step over its time limit
# is interrupted as Ctrl-C would (pytest prints its summary, a benchmark what it measured) and killed 20 s later.
# Without a GPU (here) the GPU tests skip, saying why, and the benchmark runs on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ember-gpu}
PY=${PY:-python3}
TESTS_S=${TESTS_S:-150}
BENCH_S=${BENCH_S:-150}
STARTS_S=${STARTS_S:-150}
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
failed=0
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }
ended() {  # ended NAME STATUS: say how a step ended, count it if it failed
    if [ "$2" -eq 0 ]; then echo "-- $1: ok"; else echo "-- $1: FAILED (status $2)"; failed=$((failed + 1)); fi
}
finish() {
    step "done: $failed step(s) failed"
    exec >&- 2>&-
    wait  # tee has written all of check.log
    exit "$failed"
}

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
if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "no .whl/: run bench/gpu/wheels.sh here first and carry .whl"
    failed=1
    finish
fi
if "$PY" -m pip --version > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade .whl/*.whl
else  # an environment made without pip: the carried uv installs them
    "$PY" -m zipfile -e .whl/uv-*.whl /tmp/uv-wheel && chmod +x /tmp/uv-wheel/uv-*.data/scripts/uv &&
        /tmp/uv-wheel/uv-*.data/scripts/uv pip install -q --python "$PY" --no-index --no-deps .whl/*.whl
fi
status=$?
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$PWD/sdk" "$PWD/platform" "$PWD/runtime" > "$site/ember-checkout.pth"
"$PY" -m compileall -q sdk platform runtime  # sandboxed replicas cannot write the bytecode they read
"$PY" - <<'PY'
import importlib.metadata as md

import ember, ember_platform, ember_runtime, nats, msgspec, starlette  # noqa: F401
import ember_platform.gateway.oip_grpc  # noqa: F401  (refuses a grpcio older than its generated code)
print(", ".join(f"{name} {md.version(name)}" for name in ("nats-py", "msgspec", "grpcio", "protobuf", "pytest")))
try:
    import torch
    cuda = torch.cuda.is_available()
    print("torch", torch.__version__, torch.cuda.get_device_name(0) if cuda else "(no CUDA)")
except ImportError:
    print("no torch")
PY
status=$((status || $?))
ended install "$status"
if [ "$status" -ne 0 ]; then finish; fi

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
# -W default: a warning of the machine's own library versions is shown, not turned into a failure; a test that
# hangs is stopped by pytest-timeout (with its stack) before the step's own limit.
timeout -s INT -k 20 "$TESTS_S" "$PY" -m pytest -p no:cacheprovider -q -rs -W default -o timeout=100 -m gpu \
    "${tests[@]}" 2>&1 | tee "$OUT/gpu_tests.log"
ended "GPU tests" "${PIPESTATUS[0]}"

step "bench/batching.py --quick --device $DEVICE"
timeout -s INT -k 20 "$BENCH_S" "$PY" bench/batching.py --quick --device "$DEVICE" 2>&1 | tee "$OUT/batching.md"
ended batching.py "${PIPESTATUS[0]}"

if [ "$DEVICE" = cuda ]; then
    step "bench/cold_start.py --repeats 2 --burst 2 --gpu 8GB"
    timeout -s INT -k 20 "$STARTS_S" "$PY" bench/cold_start.py --repeats 2 --burst 2 --gpu 8GB 2>&1 \
        | tee "$OUT/cold_start.md"
    ended cold_start.py "${PIPESTATUS[0]}"
fi
finish

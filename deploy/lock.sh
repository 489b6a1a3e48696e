#!/usr/bin/env bash
# Regenerates deploy/requirements.lock (runtime) and deploy/build-requirements.lock (build
# backend) from pyproject.toml, with every distribution's sha256, for Python 3.11 on Linux (the
# image's). Needs pip-tools (`.venv/bin/pip install pip-tools`) and the package index.
# The machine's pip configuration is ignored so that only the public index is asked.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$(dirname "$here")"
compile=${PIP_COMPILE:-.venv/bin/pip-compile}
common=(--quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url
    --no-emit-find-links --newline=LF)
run() { env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    timeout 600 "$compile" "${common[@]}" "$@"; }
run --output-file=deploy/requirements.lock pyproject.toml
run --only-build-deps --all-build-deps --output-file=deploy/build-requirements.lock pyproject.toml

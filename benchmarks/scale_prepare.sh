#!/usr/bin/env bash
# What the device run of benchmarks/scale.py needs, into .whl/ (git-ignored): run it HERE, where
# PyPI and Debian's archive answer, from the repository root; the device has no network.
#
#   bash benchmarks/scale_prepare.sh      # then the device call: see benchmarks/scale_device.sh
#
# - wheels for the image's Python 3.12 of what the project needs and the image lacks (its
#   package list: httptools, setproctitle; aiohttp, uvloop, psutil, click... are there);
# - Debian bookworm's nginx-light and HAProxy .debs (unpacked there with dpkg -x, not installed);
# - Python 3.12's headers, so the guard's C modules are built there from the tree as it is then;
#   and, for a device without a C compiler, those modules and the upstream built here (used
#   only while their sources are unchanged: .whl/so/SOURCES.sha256).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
W=.whl
mkdir -p $W/debs $W/include $W/so $W/bin
git check-ignore -q $W || echo "/$W/" >> "$(git rev-parse --git-path info/exclude)"

rm -f $W/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $W \
    httptools==0.9.0 setproctitle==1.3.8

(cd $W/debs && rm -f ./*.deb && apt-get download -q nginx-light nginx-common nginx haproxy \
    liblua5.3-0 libopentracing-c-wrapper0 libopentracing1 >/dev/null)

# Python 3.12's headers: the image's python3 is 3.12 without them (docs/performance.md).
PY312=""
for p in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
    if [ -x "$p" ] && "$p" -c 'import tomllib' 2>/dev/null; then PY312=$p; break; fi
done
[ -n "$PY312" ] || { echo "scale_prepare: no Python 3.12 here for its headers (pyenv install 3.12)" >&2; exit 3; }
INC=$("$PY312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
rm -rf $W/include/python3.12 && cp -r "$INC" $W/include/python3.12

# The fallbacks: the guard's modules (as pyproject.toml lists them) and the upstream, built here.
"$PY312" benchmarks/scale_build.py --include $W/include/python3.12 --out $W/so
gcc -O2 -Wall -Wextra -Werror -static -o $W/bin/upstream benchmarks/upstream.c
sha256sum benchmarks/upstream.c > $W/bin/SOURCES.sha256
du -sh $W
ls $W $W/debs $W/so $W/bin

#!/usr/bin/env bash
# The device run of benchmarks/scale.py, in one call of at most about 9 minutes: from the
# repository root, with .whl/ made here first by benchmarks/scale_prepare.sh and carried:
#
#   run(command="bash benchmarks/scale_device.sh", carry=[".whl"], timeout_s=600)
#
# Everything comes from the tree and .whl/ (the device has no network): the wheels go to
# /tmp/site, nginx and HAProxy are unpacked into /tmp/peers, the guard's C modules are built
# from the tree with the carried headers (else the carried build, if its sources are the tree's;
# else the guard runs its Python path, and the log says so). Tables: $OUT/scale.md and
# scale.json, rewritten after every phase; also guard-rounds.txt, proxies.log and run.log.
# Knobs (environment): STEPS, SECONDS_PER_PHASE, PIN, PEER_WORKERS, WALL (seconds in all).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/scale-out}
W=$PWD/.whl
PY=${PYTHON:-python3}
WALL=${WALL:-530}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

[ -d "$W/debs" ] || { echo "scale_device: no .whl/ here: run benchmarks/scale_prepare.sh, carry .whl"; exit 3; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$W"/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/peers && for f in "$W"/debs/*.deb; do dpkg -x "$f" /tmp/peers; done
export PATH=/tmp/peers/usr/sbin:$PATH
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/peers/usr/lib/x86_64-linux-gnu

if command -v gcc >/dev/null && "$PY" benchmarks/scale_build.py --include "$W/include/python3.12" --inplace; then
    echo "guard C modules: built here from the tree"
elif "$PY" benchmarks/scale_build.py --check "$W/so"; then
    echo "guard C modules: the carried build (its sources are the tree's)"
else
    echo "WARNING: guard C modules neither built nor carried: the guard runs its Python path"
fi
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then
    if (cd "$(dirname "$W")" && sha256sum -c --quiet "$W/bin/SOURCES.sha256"); then
        export ENGINE_WATCHDOG_BENCH_UPSTREAM=$W/bin/upstream
        echo "upstream: the carried static build"
    else
        echo "scale_device: no C compiler, and the carried upstream is not the tree's"; exit 3
    fi
fi
"$PY" -m compileall -q engine_watchdog benchmarks /tmp/site >/dev/null  # not inside a window
# 4,096 streams hold over 8,000 sockets in one proxy: as root the hard limit rises too.
ulimit -Hn 1048576 2>/dev/null; ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null

CPUS=$(nproc)
PIN=${PIN:-$([ "$CPUS" -ge 16 ] && echo "0-2:3-8:9-15" || echo "")}
echo "cpus $CPUS ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); pin ${PIN:-none};" \
    "open files $(ulimit -n); setup took $(( $(date +%s) - T0 )) s"
LEFT=$(( WALL - ($(date +%s) - T0) ))
timeout --signal=INT $(( LEFT + 20 )) "$PY" -m benchmarks.scale \
    ${STEPS:+--steps "$STEPS"} --pin "$PIN" --upstream-procs 3 --client-procs 6 \
    --peer-workers "${PEER_WORKERS:-4}" --seconds "${SECONDS_PER_PHASE:-5}" \
    --budget $(( LEFT - 10 )) --out "$OUT"
echo "scale_device: exit $?, $(( $(date +%s) - T0 )) s in all"

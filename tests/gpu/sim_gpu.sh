#!/usr/bin/env bash
# On a machine with a CUDA GPU and PyTorch: the demo with `--gpu` (the simulated engine computes on
# the GPU, then spins in a GPU kernel; real NVML, py-spy, CUDA core dump) and the trace corpus's
# GPU scenarios (`record_corpus.py gpu`). Not run by CI (no GPU there); docs/gpu-verification.md
# says what it gave. Wheels in .whl/ (py-spy, setproctitle) are installed first where present.
#
#   bash tests/gpu/sim_gpu.sh OUT_DIR
#
# OUT_DIR gets machine.txt, demo.log, demo-bundle.tgz (the incident bundles, cores left out),
# record.log and traces/ (two traces with their expectations). Every step is bounded in time.
set -u
out=${1:?usage: sim_gpu.sh OUT_DIR}
mkdir -p "$out/traces"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=$PATH:/tmp/site/bin
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Shared hosts: never NVLink multicast (the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi -L
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  command -v py-spy cuda-gdb
} >"$out/machine.txt" 2>&1
rm -rf /tmp/demo-gpu
timeout -s INT 200 python3 -m engine_watchdog demo --gpu --incident-dir /tmp/demo-gpu \
  >"$out/demo.log" 2>&1
echo "demo exit $?" >>"$out/demo.log"
tar czf "$out/demo-bundle.tgz" --exclude='*.nvcudmp' -C /tmp demo-gpu
[ -n "${SKIP_RECORD:-}" ] && exit 0  # SKIP_RECORD=1: the demo only
timeout -s INT 330 python3 tests/tools/record_corpus.py gpu --out "$out/traces" \
  >"$out/record.log" 2>&1
echo "record exit $?" >>"$out/record.log"

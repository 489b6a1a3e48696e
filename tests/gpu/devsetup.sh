# Device set-up for benchmarks on the H200 host (docs/performance.md): source it from the
# repository root, with its wheels and debs beside it in .whl/ (copied there with this file):
#
#   mkdir -p .whl/debs && cp tests/gpu/devsetup.sh .whl/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 \
#     -d .whl httptools==0.9.0 setproctitle==1.3.8 py-spy==0.4.3 nvidia-ml-py==13.615.71
#   (cd .whl/debs && apt-get download nginx-light nginx-common nginx haproxy liblua5.3-0 \
#     libopentracing-c-wrapper0 libopentracing1 strace libunwind8)
#   . .whl/devsetup.sh            # on the device, with carry: [".whl"]
#   python3 -m compileall -q /tmp/site engine_watchdog benchmarks   # as a pip install would
#
# It installs the wheels into /tmp/site, makes a venv /tmp/ev whose .pth adds /tmp/site, the
# repository and the image's site-packages, an engine-watchdog console script beside its python
# (benchmarks/guard.py starts the guard through it), and unpacks nginx and HAProxy into /tmp/peers.
W=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/*.whl || return 1
IMG=$(python3 -c 'import site; print(site.getsitepackages()[0])')
python3 -m venv --without-pip /tmp/ev || return 1
SP=$(/tmp/ev/bin/python -c 'import site; print(site.getsitepackages()[0])')
printf '%s\n' /tmp/site "$PWD" "$IMG" > "$SP/ew.pth"
printf '#!/tmp/ev/bin/python\nimport sys\nfrom engine_watchdog.cli.main import main\nsys.exit(main())\n' > /tmp/ev/bin/engine-watchdog
chmod +x /tmp/ev/bin/engine-watchdog
export PATH=/tmp/ev/bin:/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/peers && for f in $W/debs/*.deb; do dpkg -x $f /tmp/peers; done
export PATH=$PATH:/tmp/peers/usr/sbin:/tmp/peers/usr/bin LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/peers/usr/lib/x86_64-linux-gnu

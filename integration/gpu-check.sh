#!/usr/bin/env bash
# The GPU check, from a fresh clone on a machine with a CUDA GPU: set up, then run the gpu nox
# session (every test marked gpu, `sc-demo --device cuda` for a few steps, the GPU benchmark,
# whose figures land in integration/benchmarks/results/gpu.json). Meant to finish in under 8
# minutes; each step is timed.
#
#   integration/gpu-check.sh            # online: installs uv if missing, then uv + nox
#   SC_INTEGRATION_GPU_CHECK_OFFLINE=1 integration/gpu-check.sh
#
# Offline (a machine that reaches no package index but has python3 with torch and pytest;
# SC_INTEGRATION_GPU_CHECK_PYTHON names another interpreter):
# wheels in .whl/ (if any) are installed into /tmp/sc-site, the sc packages (the trainer too)
# are used from their source folders, and the same tests, demo and benchmark run; parts
# whose dependencies are missing (Ray, tensordict) are reported as skipped, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
start=$(date +%s)
step() { echo "== gpu-check: $* ($(($(date +%s) - start)) s)"; }

if [[ "${SC_INTEGRATION_GPU_CHECK_OFFLINE:-0}" != "1" ]]; then
    if ! command -v uv >/dev/null 2>&1; then
        step "installing uv"
        python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv
        export PATH="$HOME/.local/bin:$PATH"
    fi
    step "uv run nox -s gpu"
    uv run nox -s gpu
    step "done"
    exit 0
fi

python=${SC_INTEGRATION_GPU_CHECK_PYTHON:-python3}
if ! "$python" -c "import torch" 2>/dev/null; then
    echo "gpu-check: $python cannot import torch; offline mode needs a Python with torch" \
        "(set SC_INTEGRATION_GPU_CHECK_PYTHON to one)" >&2
    exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    step "installing the carried wheels"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/sc-site .whl/*.whl
    export PYTHONPATH="/tmp/sc-site${PYTHONPATH:+:$PYTHONPATH}"
fi
src=""
for dir in packages/*/src integration/src; do src="$src:$PWD/$dir"; done
export PYTHONPATH="${src#:}${PYTHONPATH:+:$PYTHONPATH}"
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: no CUDA device is visible (torch.cuda.is_available() is False)" >&2
    exit 2
fi
"$python" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"

status=0
# each GPU test module and the module it cannot run without
for entry in packages/sc-protocol/tests/test_protocol_gpu.py:tensordict \
    packages/sc-workers/tests/test_workers_gpu.py:tensordict \
    packages/sc-ray/tests/test_ray_gpu.py:ray \
    packages/sc-trainer/tests/test_trainer_gpu.py:tensordict; do
    file=${entry%%:*}
    needs=${entry##*:}
    if ! "$python" -c "import $needs" 2>/dev/null; then
        step "$file skipped: $needs is not importable here"
        continue
    fi
    step "pytest $file"
    "$python" -m pytest "$file" -p no:cacheprovider -q || status=$?
done
step "sc-demo --device cuda --backend local"
"$python" -m sc_trainer.cli --device cuda --backend local --steps 30 --val-every 10 \
    --no-progress --output-dir /tmp/sc-demo-cuda || status=$?
if "$python" -c "import ray" 2>/dev/null; then
    step "bench_gpu.py"
    "$python" integration/benchmarks/bench_gpu.py --out integration/benchmarks/results/gpu.json \
        || status=$?
else
    step "bench_gpu.py skipped: ray is not importable here"
fi
step "done (exit status $status)"
exit "$status"

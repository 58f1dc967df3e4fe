#!/usr/bin/env bash
# The CPU kernels' checks and figures on a lent machine with an AVX-512 CPU (run from
# the repository root there, with that machine's python3 and torch; see benchmarks/README.md).
#
#   bash benchmarks/device_cpu.sh info test ab bench16 ...   # stages, in the order given
#
# info: CPU, compiler, torch, packages. test: build every variant this CPU runs, then the kernel
# and model test suites (every variant is a parameter of them) and RADIXSERVE_CPU_ISA=avx2.
# ab: the skinny GEMM of each variant side by side, 2 pinned cores. bench: model_throughput on 2
# pinned cores with the native variant; bench_avx2: the same with the AVX2 variant forced;
# bench16: the native variant on every core. Logs go to $OUT (or ./device_out).
set -uo pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
MODEL=${MODEL:-/tmp/qwen25_05b_shaped}
PY=${PY:-python3}
BENCH=(benchmarks/model_throughput.py --model-dir "$MODEL" --configs bfloat16 bfloat16+int8
  --hf-dtypes float32 --batch-sizes ${BATCHES:-1 8 32} --prompt-len 64 --decode-steps 8
  --reps ${REPS:-2})

stage_info() {
  lscpu
  nproc
  grep -m1 -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo
  g++ --version | head -1
  $PY -c 'import torch; print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())'
  $PY -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|safetensors|numpy|tqdm|pytest|pytest-timeout|pytest-xdist|hypothesis|ninja|flashinfer-python) '
}

stage_test() {
  $PY - <<'EOF'
import logging, time
logging.basicConfig(level=logging.DEBUG, format="%(message)s")
from radixserve.models.kernels import _ext
for name in _ext.VARIANT_NAMES:
    t = time.time()
    ok = _ext.load_variant(name) is not None
    print(f"{name}: can_execute={_ext.can_execute(name)} built={ok} {time.time() - t:.0f}s")
EOF
  # one torch thread per xdist worker: 12 workers x 16 threads on 16 cores crawl
  OMP_NUM_THREADS=1 timeout ${TEST_TIMEOUT:-300} $PY -m pytest -q -p no:cacheprovider \
    -p no:benchmark -n ${WORKERS:-14} tests/models tests/runtime/test_model_parity.py -rfEs
  RADIXSERVE_CPU_ISA=avx2 OMP_NUM_THREADS=1 timeout 120 $PY -m pytest -q -p no:cacheprovider \
    -p no:benchmark -n 14 tests/models/test_cpu_kernels_model.py tests/runtime/test_model_parity.py
}

stage_ab() {
  timeout ${AB_TIMEOUT:-150} taskset -c 0,1 $PY benchmarks/gemv_bench.py --rounds 5 \
    --ms ${AB_MS:-1,8,32,64,128} --no-compile --no-fp32 --no-decode --int8 --variants ${AB_VARIANTS:-avx2 avx512 avx512_vnni avx512_bf16}
}

stage_bench() {
  timeout ${BENCH_TIMEOUT:-300} taskset -c 0,1 $PY "${BENCH[@]}" --threads 2
}

stage_bench_avx2() {
  RADIXSERVE_CPU_ISA=avx2 timeout ${BENCH_TIMEOUT:-300} taskset -c 0,1 $PY "${BENCH[@]}" --threads 2
}

stage_bench16() {
  timeout ${BENCH_TIMEOUT:-300} $PY "${BENCH[@]}" --threads "$(nproc)"
}

for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  "stage_$stage" 2>&1 | tee "$OUT/$stage.log"
done
echo "=== done $(date +%T)"

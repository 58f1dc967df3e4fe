#!/usr/bin/env bash
# The GPU checks and figures on a lent GPU machine, in one call of under 10 minutes, from the
# repository root (see benchmarks/README.md, "The CUDA path"):
#
#   bash benchmarks/device_gpu.sh                  # all: install info jit tests split idle bench
#   bash benchmarks/device_gpu.sh bench            # benchmarks only: install info jit split bench
#   bash benchmarks/device_gpu.sh --device cpu     # the dry run here: the same stages and files
#   bash benchmarks/device_gpu.sh tests idle       # any stages, in the order given
#
# install: the wheels `make gpu-wheels` put in .whl/ (name .whl in the call's carry) into
#   /tmp/site, which goes first on PYTHONPATH (skipped with --device cpu: the venv has them).
# info: the GPU, driver, torch, FlashInfer and the packages radixserve imports.
# jit: FlashInfer compiles a kernel per (kind, head size, window) on first use; this builds every
#   one the tests and benchmarks meet, timed, before anything else is (benchmarks/gpu/
#   warm_flashinfer.py; on the CPU the same calls through the torch reference wrappers).
# tests: `pytest -m gpu --device D`: FlashInfer's kernels against the torch reference, bf16
#   parity with Hugging Face on four families (three ways of feeding), the KV stress test with
#   overlap on, seeded sampling on the device, the KV tier's load-back (junit.xml).
# split: the prefill split (ragged new tokens + the paged prefix, merged) against one paged pass,
#   whole forwards of both bench shapes, before and after in one run (benchmarks/gpu/
#   prefill_split.py -> split-<shape>.json; with --device cpu a tiny model, small lengths).
# idle: benchmarks/scheduler_idle.py, the share of time a modelled H100 waits for the scheduler;
#   then benchmarks/gpu/overlap_launch.py, the same loop over the real model: ms per decode step
#   with overlap off, launched from the worker thread, or on the stream (overlap-<shape>.json).
# profile: where a decode step's time goes (torch profiler, benchmarks/gpu/profile_decode.py):
#   the default step, then with FlashInfer's full plan at each replay, also with the indptrs
#   built on the device (each plan then copies them back: a sync), and with no CUDA graphs.
# profile8b: the same for the Llama-3-8B shape at batch 1, 8 and 64, also with tensor-core
#   decode and FlashInfer's fused ops (profile-llama3-8b.txt).
# aot: the kernels the jit stage built, packed into $OUT/flashinfer-aot.tar.xz.NN: carried back
#   in .jit/, install puts them where FlashInfer loads them without compiling (saves the jit
#   stage's minutes on the next machine).
# bench: decode tokens/s at batch 1, 8, 64, 256 and prefill tokens/s beside HF transformers on
#   the Qwen2.5-0.5B- and Llama-3-8B-shaped random models in bf16, as a share of the HBM bound
#   (benchmarks/model_throughput.py; also with FlashInfer's fused norm and activation, +fused,
#   and on the 8B shape with tensor-core decode, +tc), then the multi-turn shape (a) with the
#   cache on and off.
#   With --device cpu: a tiny model, batches 1 and 8, and `bench multiturn --quick`.
#
# spec: speculative decoding against plain decoding on the Qwen2.5-0.5B shape (benchmarks/
#   spec_decode.py: the text forced by a logit bias), workloads a, c and d at batch 1, 8 and 32
#   (spec.txt); with --device cpu the tiny model, batch 1. Not in `all`: name it.
# specgraph: the same with the verifies replayed from CUDA graphs (--cuda-graph-verify;
#   spec-graph.txt). Not in `all`.
#
# bench05, bench8b, multiturn: bench's three parts alone. LIMIT_<stage>=SECONDS caps a stage.
#
# Logs and JSON go to $OUT (or ./device_out): run.log (everything), junit.xml, idle.json,
# split-<shape>.json, overlap-<shape>.json, throughput-<shape>.json, bench/multiturn.json and
# .png. A stage that fails is reported and the next one runs; the exit status is that of the
# first failure.
set -uo pipefail
DEVICE=cuda
STAGES=()
while (($#)); do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --device=*) DEVICE=${1#--device=}; shift ;;
    all) STAGES+=(install info jit tests split idle bench); shift ;;
    bench) STAGES+=(install info jit split bench); shift ;;
    stage_*) STAGES+=("$1"); shift ;;
    *) STAGES+=("stage_$1"); shift ;;
  esac
done
((${#STAGES[@]})) || STAGES=(install info jit tests split idle bench)
OUT=${OUT:-device_out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ON_GPU=0
[[ $DEVICE == cuda* ]] && ON_GPU=1
BENCH_DIR=${BENCH_DIR:-/tmp/radixserve-gpu-models}
# FlashInfer's just-in-time builds land here; the aot stage packs them for the next machine
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
export DEVICE ON_GPU OUT PY BENCH_DIR

stage_install() {
  if ((!ON_GPU)); then echo "dry run: the venv's packages"; return 0; fi
  ls .whl/*.whl >/dev/null || { echo "no .whl/: run make gpu-wheels here, carry .whl"; return 1; }
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
  # kernels an earlier machine built (the aot stage's flashinfer-aot.tar.xz*, carried in .jit/):
  # FlashInfer loads data/aot/<name>/<name>.so without compiling
  if ls .jit/flashinfer-aot.tar.xz* >/dev/null 2>&1; then
    mkdir -p /tmp/site/flashinfer/data/aot
    cat .jit/flashinfer-aot.tar.xz* | tar -xJ -C /tmp/site/flashinfer/data/aot || return 1
    echo "prebuilt kernels: $(ls /tmp/site/flashinfer/data/aot | tr '\n' ' ')"
  fi
}

stage_aot() {  # the kernels this machine built, as FlashInfer's AOT layout, in parts of <16 MB
  local ops=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
  local stage=/tmp/aot-pack
  rm -rf "$stage" && mkdir -p "$stage"
  [[ -d $ops ]] || { echo "no kernels were built (a dry run uses the reference wrappers)"; return 0; }
  find "$ops" -path '*cached_ops*' -name '*.so' | while read -r so; do
    name=$(basename "$so" .so)
    mkdir -p "$stage/$name" && cp "$so" "$stage/$name/"
  done
  ls "$stage"
  tar -C "$stage" -cf - . | xz -6 -T0 | split -b 15M -d - "$OUT/flashinfer-aot.tar.xz."
  ls -la "$OUT"/flashinfer-aot.tar.xz.*
}

stage_profile() {  # where a decode step's time goes on the device (torch profiler)
  local configs=(bfloat16)
  # the baselines of the fast graph plan and of the host-built indptrs, and no graphs at all
  ((ON_GPU)) && configs+=(bfloat16+fullplan bfloat16+fullplan+devindptr bfloat16+eager)
  $PY benchmarks/gpu/profile_decode.py --device "$DEVICE" --model-dir "$BENCH_DIR/qwen25_05b" \
    --configs "${configs[@]}" --out "$OUT/profile.txt"
}

stage_profile8b() {  # the Llama-3-8B shape's decode step: which kernels hold it off the HBM bound
  local args=(--batches 1 8 64 --configs bfloat16 bfloat16+tc+fused)
  ((ON_GPU)) || { tiny_model || return 1; args=(--batches 1 8 --ctx 32 --steps 4); }
  local dir=$BENCH_DIR/llama3_8b
  ((ON_GPU)) || dir=$BENCH_DIR/tiny
  $PY benchmarks/gpu/profile_decode.py --device "$DEVICE" --model-shape llama3-8b --model-dir "$dir" \
    --ctx 256 "${args[@]}" --out "$OUT/profile-llama3-8b.txt"
}

stage_info() {
  if ((ON_GPU)); then nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv; fi
  nproc
  $PY - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("flashinfer", "transformers", "tokenizers", "zmq", "fastapi", "pydantic", "llguidance"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # noqa: BLE001: report and go on
        print(name, "MISSING", exc)
EOF
}

stage_jit() {  # on the CPU: the same calls through the torch reference wrappers
  $PY benchmarks/gpu/warm_flashinfer.py --device "$DEVICE" --parallel
}

stage_tests() {
  local timeout=120
  ((ON_GPU)) && timeout=600  # a kernel the jit stage missed compiles inside its first test
  # only the modules that hold `gpu` tests: the image lacks packages other test modules import
  # (openai, sglang-router, jsonschema...), and one collection error would stop the whole run
  local files
  mapfile -t files < <(grep -rlE 'mark\.gpu|pytestmark = pytest\.mark\.gpu' tests --include='test_*.py')
  $PY -m pytest -q -p no:cacheprovider -m gpu --device "$DEVICE" --timeout "$timeout" -rfEs \
    --junitxml "$OUT/junit.xml" "${files[@]}"
}

tiny_model() {  # the dry run's model: $BENCH_DIR/tiny, written once
  local tiny="$BENCH_DIR/tiny"
  [[ -f $tiny/config.json ]] || $PY -c "import sys, torch; from radixserve.models.tiny import \
write_tiny_model as w; w(sys.argv[1], 'qwen2', num_layers=2, hidden_size=256, num_heads=4, \
intermediate_size=512, dtype=torch.bfloat16)" "$tiny"
}

stage_split() {
  local split=benchmarks/gpu/prefill_split.py
  if ((ON_GPU)); then
    local status=0
    $PY $split --device "$DEVICE" --model-shape qwen25-0.5b --model-dir "$BENCH_DIR/qwen25_05b" \
      --json "$OUT/split-qwen25-0.5b.json" || status=1
    $PY $split --device "$DEVICE" --model-shape llama3-8b --model-dir "$BENCH_DIR/llama3_8b" \
      --reps 3 --json "$OUT/split-llama3-8b.json" || status=1
    return $status
  fi
  tiny_model || return 1
  $PY $split --device "$DEVICE" --model-dir "$BENCH_DIR/tiny" --scratch 64 --prefix 48 \
    --extend 16 --batch 4 --reps 2 --json "$OUT/split-tiny.json"
}

stage_idle() {  # the modelled GPU, then the real model: overlap off, from a thread, on the stream
  local args=(--json "$OUT/idle.json") status=0
  ((ON_GPU)) || args+=(--steps 20 --batches 1 64)
  $PY benchmarks/scheduler_idle.py "${args[@]}" || status=1
  local overlap=benchmarks/gpu/overlap_launch.py
  if ((ON_GPU)); then
    $PY $overlap --device "$DEVICE" --model-shape qwen25-0.5b --model-dir "$BENCH_DIR/qwen25_05b" \
      --json "$OUT/overlap-qwen25-0.5b.json" || status=1
    $PY $overlap --device "$DEVICE" --model-shape llama3-8b --model-dir "$BENCH_DIR/llama3_8b" \
      --steps 50 --json "$OUT/overlap-llama3-8b.json" || status=1
  else
    tiny_model || return 1
    $PY $overlap --device "$DEVICE" --model-dir "$BENCH_DIR/tiny" --batches 1 8 --context 32 \
      --warmup 3 --steps 20 --json "$OUT/overlap-tiny.json" || status=1
  fi
  return $status
}

throughput() {  # name shape model_dir extra args...: writes throughput-<name>.json
  local name=$1 shape=$2 dir=$3
  shift 3
  local configs=(bfloat16)
  # CUDA graphs, then none; GPU_BASELINES: more configs (each side holds its own weights)
  ((ON_GPU)) && configs+=(${GPU_BASELINES:-} bfloat16+eager)
  $PY benchmarks/model_throughput.py --device "$DEVICE" --model-shape "$shape" --model-dir "$dir" \
    --configs "${configs[@]}" --hf-dtypes bfloat16 --json "$OUT/throughput-$name.json" "$@"
}

stage_bench05() {  # also FlashInfer's fused norm and activation
  GPU_BASELINES=bfloat16+fused throughput qwen25-0.5b qwen25-0.5b "$BENCH_DIR/qwen25_05b" \
    --batch-sizes 1 8 64 256 --prompt-len 1024 --context-len 512 --decode-steps 32 --reps 5
}

stage_bench8b() {  # also decode on tensor cores (SGLang's choice for this GQA group of 4), fused
  GPU_BASELINES="bfloat16+tc bfloat16+fused bfloat16+tc+fused" throughput llama3-8b llama3-8b "$BENCH_DIR/llama3_8b" --batch-sizes 1 8 64 256 --prompt-len 1024 \
    --context-len 256 --decode-steps 16 --reps 3
}

stage_multiturn() {
  $PY -m radixserve bench multiturn --shape a --device "$DEVICE" --baselines no-cache \
    --out "$OUT/bench" --name multiturn
}

# $1: the output's name; then spec_decode.py's extra flags
spec_run() {
  local name=$1
  shift
  if ((ON_GPU)); then
    $PY benchmarks/spec_decode.py --device "$DEVICE" --model-dir "$BENCH_DIR/qwen25_05b" \
      --workloads a,c,d --batch-sizes 1,8,32 --max-new-tokens 96 "$@" | tee "$OUT/$name.txt"
    return "${PIPESTATUS[0]}"  # a stage runs in its own bash, without the caller's pipefail
  else
    $PY benchmarks/spec_decode.py --device "$DEVICE" --tiny --model-dir "$BENCH_DIR/spec-tiny" \
      --workloads c,d --batch-sizes 1 --max-new-tokens 16 "$@" | tee "$OUT/$name.txt"
    return "${PIPESTATUS[0]}"
  fi
}

stage_spec() { spec_run spec; }

stage_specgraph() { spec_run spec-graph --cuda-graph-verify; }

stage_bench() {
  local status=0
  if ((ON_GPU)); then
    stage_bench05 || status=1
    stage_bench8b || status=1
    stage_multiturn || status=1
  else
    local tiny="$BENCH_DIR/tiny"
    tiny_model || status=1
    throughput tiny qwen25-0.5b "$tiny" --batch-sizes 1 8 --prompt-len 64 --context-len 64 \
      --decode-steps 4 --reps 2 --bandwidth-mib 64 || status=1
    $PY -m radixserve bench multiturn --quick --device "$DEVICE" --baselines no-cache \
      --out "$OUT/bench" --name multiturn || status=1
  fi
  return $status
}

export -f $(declare -F | awk '{print $3}')  # for the stages run under timeout
FIRST_FAILURE=0
SUMMARY=()
{
  for stage in "${STAGES[@]}"; do
    stage=${stage#stage_}
    echo "=== $stage $(date +%T) (device $DEVICE)"
    start=$SECONDS
    limit_var=LIMIT_$stage
    if [[ $stage == install || -z ${!limit_var:-} ]]; then
      "stage_$stage"  # install exports PYTHONPATH for the stages after it
    else  # LIMIT_<stage>=SECONDS: a stage that hangs or overruns leaves time for the next
      timeout -k 5 "${!limit_var}" bash -c "stage_$stage"
    fi
    rc=$?
    SUMMARY+=("$stage: exit $rc, $((SECONDS - start)) s")
    ((rc != 0 && FIRST_FAILURE == 0)) && FIRST_FAILURE=$rc
  done
  echo "=== done $(date +%T)"
  printf '%s\n' "${SUMMARY[@]}"
  exit "$FIRST_FAILURE"
} 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"

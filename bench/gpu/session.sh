#!/usr/bin/env bash
# Everything a GPU machine is needed for, in one call, each phase logged on its own:
#
#   bash bench/gpu/session.sh variants check rates bench big prof
#
#   variants  bench/gpu/variants.py: the sliced scan's tuning switches compared on $GIB GiB;
#          the winner (written to $OUT/best.env) is the tuning of every later phase unless
#          MORPHOGEN_GPU_TUNING is set
#   check  nvidia-smi, versions, nvcc register report, tests/gpu, compute-sanitizer
#          (memcheck, racecheck, synccheck) on bench/gpu/sanitize.py
#   rates  bench/gpu/mma_rate.py: LOP3, 1-bit and int8 MMA, ChaCha8 rates of this card
#   bench  bench/scan_gpu.py on a synthetic snapshot of $GIB GiB (default 16), for the
#          kernel $KERNEL names (default: the engine's)
#   big    bench/gpu/reference_scale.py (2^24 pages, 64 GiB in host memory)
#   prof   Nsight Compute on bench/gpu/profile.py: HBM bytes read and pipe utilisation
#   tables bench/gpu/chain_tables.py: the mainnet-shaped matrix (accounts, storage, code and
#          their tree levels) at $TABLES_GIB GiB (default 32 on an H100, 64 on an H200); table
#          queries against the whole-matrix kernel, lookups with and without blocks of 3,000
#          pages written into device memory; every answer checked; at most $TABLES_TIMEOUT s
#          (default 300)
#   tables-dry  the same script on the CuPy fakes at 4 MiB (no device needed: its logic)
#   formats bench/gpu/key_formats.py: v1 and packed keys on one 2^24-page shard (64 GiB), Q = 1,
#          8, 32, every answer checked, for the layout $KERNEL names (default the engine's);
#          new measurements stop $FORMATS_BUDGET s (default 100) after the load and the whole
#          phase at $FORMATS_TIMEOUT s (default 180); results key_formats_<device>_<layout>_<fmt>
#   formats-check  nvcc register report, tests/gpu/test_gpu_packed.py, memcheck and racecheck
#          on the packed kernels (bench/gpu/sanitize.py --packed-only), each bounded
#   formats-dry  the formats script on the CuPy fakes at 2^11 pages (its logic, no device)
#   tables-check  nvcc register report, tests/gpu/test_gpu_tables.py, memcheck and racecheck
#          on the table and patch kernels (bench/gpu/sanitize.py --tables-only), each bounded
#
# Issue 41 in one call of under 8 minutes (figures first): bash bench/gpu/session.sh tables tables-check
# Issue 45 (figures first, about 3 minutes, then the checks): bash bench/gpu/session.sh formats formats-check
#
# Logs and results go to $OUT (default /tmp/morphogen-gpu-session). Runs without Ray or
# pydantic: the engines import neither, and pytest gets an empty warning filter list. The
# bench phase also needs blake3, which the image lacks: carry .whl from bench/gpu/wheels.sh.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/morphogen-gpu-session}
GIB=${GIB:-16}
mkdir -p "$OUT"
phase() { echo "== $1 ($(date +%T))"; }

# wheels carried from the development machine (bench/gpu/wheels.sh): the image has no registry
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/morphogen-site .whl/*.whl && export PYTHONPATH=/tmp/morphogen-site:$PWD
fi

check() {
  local rc=0
  phase check
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import cupy, numpy, numba, pytest; print('cupy', cupy.__version__, 'cuda',
cupy.cuda.runtime.runtimeGetVersion(), 'numpy', numpy.__version__, 'numba', numba.__version__,
'pytest', pytest.__version__)"
  python3 -m morphogen.engine.nvcc_check || rc=1
  python3 -m pytest -q -o filterwarnings= -p no:cacheprovider tests/gpu || rc=1
  for tool in memcheck racecheck synccheck; do
    echo "-- compute-sanitizer --tool $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 python3 bench/gpu/sanitize.py \
      2>&1 | tail -n 8 || rc=1
  done
  return $rc
}

variants() {
  phase "variants ${GIB} GiB"
  python3 bench/gpu/variants.py --gib "$GIB" --out "$OUT"
}

rates() {
  phase rates
  python3 bench/gpu/mma_rate.py --out "$OUT"
}

bench() {
  phase "bench ${GIB} GiB"
  python3 -c "import blake3" 2>/dev/null || {
    echo "blake3 is missing (snapshots hash their chunks): run bash bench/gpu/wheels.sh on the"
    echo "development machine and carry .whl"; return 2; }
  python3 bench/scan_gpu.py --gib "$GIB" --runs 7 --seconds 4 --out "$OUT" ${KERNEL:+--kernel "$KERNEL"}
}

big() {
  phase big
  python3 bench/gpu/reference_scale.py --out "$OUT" ${KERNEL:+--kernel "$KERNEL"}
}

prof() {
  phase prof
  # the load warms each kernel variant once: 8 fused (key groups), 3 sliced (n-tiles, prefetch)
  # (each phase runs in its own subshell: the export stays here)
  if [ -n "${KERNEL:-}" ]; then export MORPHOGEN_GPU_KERNEL=$KERNEL; fi
  local skip=3
  [ "${MORPHOGEN_GPU_KERNEL:-sliced}" = fused ] && skip=8
  local metrics=dram__bytes_read.sum,gpu__time_duration.sum
  metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active
  metrics+=,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
  metrics+=,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
  metrics+=,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum
  ncu --kernel-name regex:"morphogen_(sliced_)?scan" --launch-skip "$skip" --launch-count 3 --metrics "$metrics" \
    python3 bench/gpu/profile.py "${PROF_GIB:-4}" && return 0
  echo "-- metrics run failed; the standard sections instead"
  ncu --kernel-name regex:"morphogen_(sliced_)?scan" --launch-skip "$skip" --launch-count 3 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 bench/gpu/profile.py "${PROF_GIB:-4}"
}

tables() {
  phase "tables ${TABLES_GIB:-auto} GiB"
  timeout "${TABLES_TIMEOUT:-300}" python3 bench/gpu/chain_tables.py --out "$OUT" \
    ${TABLES_GIB:+--gib "$TABLES_GIB"} --seconds "${TABLES_SECONDS:-15}"
}

tables-check() {
  local rc=0
  phase tables-check
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  timeout 120 python3 -m morphogen.engine.nvcc_check || rc=1
  timeout 120 python3 -m pytest -q -o filterwarnings= -p no:cacheprovider \
    tests/gpu/test_gpu_tables.py || rc=1
  for tool in memcheck racecheck; do
    echo "-- compute-sanitizer --tool $tool (tables and writes)"
    timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 bench/gpu/sanitize.py --tables-only 2>&1 | tail -n 8 || rc=1
  done
  return $rc
}

tables-dry() {
  phase "tables dry run"
  timeout "${TABLES_TIMEOUT:-900}" python3 bench/gpu/chain_tables.py --dry-run model \
    --gib 0.004 --seconds 3 --runs 2 --block-pages 20 --interval 1 --readers 1 --out "$OUT"
}

formats() {
  phase "formats ${KERNEL:-default layout}"
  timeout "${FORMATS_TIMEOUT:-180}" python3 bench/gpu/key_formats.py --out "$OUT" \
    --budget-s "${FORMATS_BUDGET:-100}" ${KERNEL:+--kernel "$KERNEL"}
}

formats-check() {
  local rc=0
  phase formats-check
  timeout 120 python3 -m morphogen.engine.nvcc_check || rc=1
  timeout 150 python3 -m pytest -q -o filterwarnings= -p no:cacheprovider \
    tests/gpu/test_gpu_packed.py || rc=1
  for tool in memcheck racecheck; do
    echo "-- compute-sanitizer --tool $tool (packed keys)"
    timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 bench/gpu/sanitize.py --packed-only 2>&1 | tail -n 8 || rc=1
  done
  return $rc
}

formats-dry() {
  phase "formats dry run"
  timeout "${FORMATS_TIMEOUT:-600}" python3 bench/gpu/key_formats.py --dry-run model \
    --log2-pages 11 --runs 1 --out "$OUT"
}

status=0
tuning_set=${MORPHOGEN_GPU_TUNING+set}
for p in "$@"; do
  if [ -z "$tuning_set" ] && [ -f "$OUT/best.env" ]; then export "$(cat "$OUT/best.env")"; fi
  echo "== tuning: ${MORPHOGEN_GPU_TUNING:-the defaults}"
  "$p" 2>&1 | tee "$OUT/$p.log" || status=1
done
echo "== session done, status $status"
exit $status

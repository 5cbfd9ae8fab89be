#!/usr/bin/env bash
# Wheels for what a device image lacks and the GPU benchmarks need: blake3, for the snapshot
# files' chunk hashes (bench/scan_gpu.py writes and opens snapshots). The engines and
# tests/gpu need nothing from here. Run this on the development machine, which reaches PyPI,
# then name .whl in the device call's carry; session.sh installs what it finds there first.
#
#   bash bench/gpu/wheels.sh            # for the device's Python (3.12 unless PY says other)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-3.12}
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" \
  --implementation cp "${platforms[@]}" -d .whl "blake3>=0.4"
ls -l .whl

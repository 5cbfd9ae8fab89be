"""Compile the GPU kernels with nvcc for Hopper and hold them to a clean register report.

    python -m morphogen.engine.nvcc_check [--arch sm_90] [--nvcc PATH] [--quiet]
                                          [--tuning NAME=VALUE,...]

nvcc compiles device code without a GPU, so CI runs this on every change: it builds a cubin of
the program the engine compiles (gpu_kernels.kernel_source(): the generated geometry #defines,
then the .cu files) with `-arch=sm_90 -cubin -Xptxas -v` plus the options the runtime gives
NVRTC (gpu_kernels.COMPILE_OPTIONS), prints registers, shared memory and stack per kernel, and
exits non-zero on a compile error, a missing kernel, any spill store or load, or any
local-memory stack frame (a register array indexed at run time). Where nvcc is absent it fails
too, unless MORPHOGEN_SKIP_NVCC_CHECK=1 says a machine without the CUDA toolkit may skip it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from morphogen.engine import gpu_kernels

SKIP_ENV = "MORPHOGEN_SKIP_NVCC_CHECK"
DEFAULT_ARCH = "sm_90"
_FALLBACK_NVCC = ("/usr/local/cuda/bin/nvcc",)

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


@dataclass
class KernelReport:
    name: str
    arch: str
    registers: int = -1
    barriers: int = 0
    static_smem: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def clean(self) -> bool:
        return self.stack_frame == 0 and self.spill_stores == 0 and self.spill_loads == 0


def find_nvcc(explicit: str | None = None) -> str | None:
    for candidate in (explicit, os.environ.get("NVCC"), shutil.which("nvcc"), *_FALLBACK_NVCC):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_command(nvcc: str, source: Path, output: Path, arch: str) -> list[str]:
    return [
        nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", *gpu_kernels.COMPILE_OPTIONS,
        "-o", str(output), str(source),
    ]


def parse_ptxas(log: str) -> dict[str, KernelReport]:
    """Per-kernel figures from ptxas -v output."""
    reports: dict[str, KernelReport] = {}
    current: KernelReport | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = reports.setdefault(m.group(1), KernelReport(m.group(1), m.group(2)))
        elif current is not None and (m := _FRAME.search(line)):
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _USED.search(line)):
            current.registers = int(m.group(1))
            current.barriers = int(m.group(2) or 0)
            current.static_smem = int(m.group(3) or 0)
    return reports


def check(reports: dict[str, KernelReport], expected: tuple[str, ...]) -> list[str]:
    """The problems that fail the build."""
    problems = [f"kernel {name} missing from the cubin" for name in expected if name not in reports]
    for r in reports.values():
        if r.spill_stores or r.spill_loads:
            problems.append(
                f"{r.name}: {r.spill_stores} bytes spill stores, {r.spill_loads} bytes spill loads"
            )
        if r.stack_frame:
            problems.append(f"{r.name}: {r.stack_frame} bytes stack frame (local memory)")
        if r.registers < 0:
            problems.append(f"{r.name}: no register count in the ptxas report")
    return problems


def run(nvcc: str, arch: str = DEFAULT_ARCH, source: str | None = None) -> tuple[
    int, str, dict[str, KernelReport]
]:
    """(nvcc exit status, its output, parsed reports) for `source` (default: the program the
    engine compiles, gpu_kernels.kernel_source())."""
    text = gpu_kernels.kernel_source() if source is None else source
    with tempfile.TemporaryDirectory(prefix="morphogen-nvcc-") as tmp:
        path = Path(tmp) / "morphogen_kernels.cu"
        path.write_text(text)
        cmd = nvcc_command(nvcc, path, Path(tmp) / "morphogen_kernels.cubin", arch)
        proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    return proc.returncode, log, parse_ptxas(log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=DEFAULT_ARCH, help="nvcc -arch target (default sm_90)")
    ap.add_argument("--nvcc", default=None, help="nvcc to use (default: $NVCC, PATH, CUDA)")
    ap.add_argument("--quiet", action="store_true", help="print only problems")
    ap.add_argument("--tuning", default="", help="tuning switches to build with, as "
                    f"{gpu_kernels.TUNING_ENV} takes them (default: the engine's)")
    args = ap.parse_args(argv)
    try:
        tuning = gpu_kernels.parse_tuning(args.tuning)
    except ValueError as exc:
        print(f"nvcc_check: {exc}", file=sys.stderr)
        return 2

    nvcc = find_nvcc(args.nvcc)
    if nvcc is None:
        if os.environ.get(SKIP_ENV) == "1":
            print(f"nvcc_check: SKIPPED, nvcc not found and {SKIP_ENV}=1")
            return 0
        print(
            f"nvcc_check: nvcc not found (set NVCC, put it on PATH, or set {SKIP_ENV}=1 "
            "where the CUDA toolkit is deliberately absent)",
            file=sys.stderr,
        )
        return 2

    status, log, reports = run(nvcc, args.arch, gpu_kernels.kernel_source(tuning=tuning))
    if status != 0:
        print(f"nvcc_check: nvcc failed (exit {status}):\n{log}", file=sys.stderr)
        return 1
    if not args.quiet:
        names = " + ".join(p.name for p in gpu_kernels.KERNEL_SOURCES)
        built = ",".join(f"{k}={v}" for k, v in gpu_kernels.kernel_tuning(tuning).items())
        print(f"nvcc_check: {names} with {nvcc} -arch={args.arch}, {built}")
        print(f"{'kernel':<36}{'regs':>6}{'smem':>7}{'stack':>7}{'spill st/ld':>13}")
        for r in sorted(reports.values(), key=lambda r: r.name):
            print(
                f"{r.name:<36}{r.registers:>6}{r.static_smem:>7}{r.stack_frame:>7}"
                f"{f'{r.spill_stores}/{r.spill_loads}':>13}"
            )
    for line in log.splitlines():
        if "warning" in line.lower():
            print(f"nvcc_check: {line.strip()}", file=sys.stderr)
    problems = check(reports, gpu_kernels.KERNEL_NAMES)
    if problems:
        for p in problems:
            print(f"nvcc_check: FAIL {p}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"nvcc_check: OK, {len(reports)} kernels, no spills, no local memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CUDA program's numbers have one source, Python: the generated #defines carry the values
the host plans with, the .cu files define none of them and refuse to compile without them, and
nvcc_check builds exactly the program the engine compiles. No GPU or nvcc needed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _gpu_fakes import EMU_DIR, emulator_compiler

from morphogen.constants import MAX_DOMAIN_BITS, PAGE_SIZE
from morphogen.engine import gpu_kernels, gpu_keys, gpu_plan, nvcc_check, sliced

_DEFINE = re.compile(r"^#define\s+(\w+)\s+(\S+)\s*$", re.M)

# Where each generated name's value lives in Python.
OWNERS = {
    "SCAN_THREADS": gpu_plan, "LANES_PER_PAGE": gpu_plan, "LANES_PER_THREAD": gpu_plan,
    "MAX_TILE_BITS": gpu_plan, "PATH_SLOTS": gpu_plan, "REDUCE_LANES": gpu_plan,
    "REDUCE_SLICES": gpu_plan, "KEY_HEADER_WORDS": gpu_keys,
    "READ_BW_THREADS": gpu_kernels, "SLICE_PAGES": sliced, "SLICE_U4": sliced,
    "SLICE_THREADS": sliced, "SLICED_THREADS": sliced, "SLICED_TILE_BITS": sliced,
    "SLICED_TREE_SLOTS": sliced, "MT_STRIDE": sliced,
}


def generated_defines(source: str) -> dict[str, str]:
    """The #define lines before the first .cu file's text."""
    head = source.split(gpu_kernels.KERNEL_SOURCE.read_text(), 1)[0]
    return dict(_DEFINE.findall(head))


def test_generated_source_defines_each_number_with_the_python_value():
    source = gpu_kernels.kernel_source()
    defines = generated_defines(source)
    assert defines == {name: str(value) for name, value in gpu_kernels.KERNEL_DEFINES.items()}
    assert set(defines) == set(OWNERS)
    for name, module in OWNERS.items():
        assert defines[name] == str(getattr(module, name)), name
    # then both .cu files, whole and in order
    texts = [p.read_text() for p in gpu_kernels.KERNEL_SOURCES]
    assert source.endswith("\n".join(texts))
    assert source.index(texts[0]) < source.index(texts[1])


def test_the_numbers_derive_from_the_protocol_constants():
    assert gpu_plan.LANES_PER_PAGE == PAGE_SIZE // 16
    assert gpu_plan.LANES_PER_THREAD * gpu_plan.SCAN_THREADS == gpu_plan.LANES_PER_PAGE
    assert gpu_plan.PATH_SLOTS == MAX_DOMAIN_BITS + 1
    assert sliced.PATH_SLOTS is gpu_plan.PATH_SLOTS
    assert sliced.SLICE_U4 * 16 == sliced.SLICE_BYTES == sliced.SLICE_PAGES * PAGE_SIZE
    assert 1 << sliced.SLICED_TILE_BITS == sliced.SLICE_PAGES
    assert sliced.SLICED_TREE_SLOTS * 2 == sliced.SLICE_PAGES
    assert sliced.MT_STRIDE % 2 == 1 and sliced.MT_STRIDE > sliced.LANE_BITS == 8 * 16
    assert gpu_kernels.KERNEL_DEFINES["LANES_PER_PAGE"] == PAGE_SIZE // 16


@pytest.mark.parametrize("path", gpu_kernels.KERNEL_SOURCES, ids=lambda p: p.name)
def test_cu_files_define_none_of_the_generated_numbers(path):
    text = path.read_text()
    defined = {name for name, _ in _DEFINE.findall(text)}
    defined |= set(re.findall(r"^#define\s+(\w+)\(", text, re.M))  # code macros
    assert not defined & set(gpu_kernels.KERNEL_DEFINES), path.name
    # and say so before any use: an #error guard on one of them
    guard = re.search(r"#ifndef (\w+)\n#error \"[^\"]*kernel_source\(\)[^\"]*\"\n#endif", text)
    assert guard and guard.group(1) in gpu_kernels.KERNEL_DEFINES
    code = re.sub(r"//[^\n]*", "", text[: guard.start()])
    assert not any(re.search(rf"\b{name}\b", code) for name in gpu_kernels.KERNEL_DEFINES)


@pytest.mark.skipif(emulator_compiler() is None, reason="no C++ compiler")
@pytest.mark.parametrize("path", gpu_kernels.KERNEL_SOURCES, ids=lambda p: p.name)
def test_a_cu_file_alone_fails_naming_kernel_source(path):
    proc = subprocess.run([emulator_compiler(), "-E", "-x", "c++", str(path), "-o", "/dev/null"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "kernel_source()" in proc.stderr


def test_nvcc_check_compiles_the_engines_program(monkeypatch):
    seen: dict[str, object] = {}

    def fake_run(cmd, capture_output, text):
        source = Path(cmd[-1])
        seen["source"] = source.read_text()
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(nvcc_check.subprocess, "run", fake_run)
    status, _, _ = nvcc_check.run("/fake/nvcc")
    assert status == 0
    assert seen["source"] == gpu_kernels.kernel_source()
    cmd = seen["cmd"]
    assert cmd[0] == "/fake/nvcc" and "-arch=sm_90" in cmd
    assert all(opt in cmd for opt in gpu_kernels.COMPILE_OPTIONS)


def test_kernel_variants_match_the_python_tables():
    fused = gpu_kernels.KERNEL_SOURCE.read_text()
    variants = [int(kg) for kg in re.findall(r"^MG_SCAN_KERNEL\((\d+),", fused, re.M)]
    assert tuple(variants) == gpu_plan.KEY_GROUP_SIZES
    tiles = re.findall(r"^MG_SLICED_KERNEL\((\d+),", gpu_kernels.SLICED_KERNEL_SOURCE.read_text(),
                       re.M)
    assert tuple(int(t) for t in tiles) == sliced.N_TILES
    harness = (EMU_DIR / "emu_harness.cpp").read_text()
    cases = [int(kg) for kg in re.findall(r"^\s+MG_CASE\((\d+)\)", harness, re.M)]
    assert tuple(cases) == gpu_plan.KEY_GROUP_SIZES
    source = gpu_kernels.kernel_source()
    for name in gpu_kernels.KERNEL_NAMES:
        kg = name.removeprefix("morphogen_scan_k")
        nt = name.removeprefix("morphogen_sliced_scan_n")
        stamped = (f"MG_SCAN_KERNEL({kg}," if kg != name else
                   f"MG_SLICED_KERNEL({nt}," if nt != name else f"{name}(")
        assert stamped in source, name


def test_gpu_modules_import_without_cupy_ray_or_pydantic():
    code = (
        "import sys\n"
        "for name in ('cupy', 'ray', 'pydantic'):\n"
        "    sys.modules[name] = None\n"
        "import morphogen.engine.gpu, morphogen.engine.nvcc_check\n"
        "from morphogen.engine import gpu_backend, gpu_bench, gpu_errors, gpu_kernels, gpu_keys\n"
        "from morphogen.engine import gpu_plan, gpu_pool, gpu_timings, gpu_upload, sliced\n"
        "print(morphogen.engine.gpu.GpuEngine.__name__, morphogen.engine.gpu.GpuError.__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["GpuEngine", "GpuError"]

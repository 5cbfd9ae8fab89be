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
from _gpu_fakes import EMU_DIR, FakeBackend, emulator_compiler, make_engine

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
    "SLICED_TREE_SLOTS": sliced, "MT_STRIDE": sliced, "SLICED_FOLD_IMAD": sliced,
    "SLICED_PREFETCH_ROUNDS": sliced, "SLICED_PREFETCH_BULK": sliced,
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
    stamped_sliced = re.findall(r"^MG_SLICED_KERNEL\((\d+), \d+, (true|false), (\w+)\)$",
                                gpu_kernels.SLICED_KERNEL_SOURCE.read_text(), re.M)
    assert [(int(nt), pf == "true") for nt, pf, _ in stamped_sliced] == list(sliced.SLICED_VARIANTS)
    assert tuple(name for *_, name in stamped_sliced) == sliced.SLICED_KERNELS
    assert {nt for nt, _ in sliced.SLICED_VARIANTS} == set(sliced.N_TILES)
    stamped_table = re.findall(r"^MG_SLICED_TABLE_KERNEL\((\d+), \d+, (true|false), (\w+)\)$",
                               gpu_kernels.TABLE_KERNEL_SOURCE.read_text(), re.M)
    assert [(int(nt), pf == "true") for nt, pf, _ in stamped_table] == list(sliced.SLICED_VARIANTS)
    assert tuple(name for *_, name in stamped_table) == sliced.TABLE_KERNELS
    stamped_packed = re.findall(
        r"^MG_SLICED_PACKED_KERNEL\((\d+), \d+, (true|false), (\w+)\)$",
        gpu_kernels.SLICED_PACKED_KERNEL_SOURCE.read_text(), re.M)
    assert [(int(nt), pf == "true") for nt, pf, _ in stamped_packed] == list(sliced.SLICED_VARIANTS)
    assert tuple(name for *_, name in stamped_packed) == sliced.SLICED_PACKED_KERNELS
    packed = gpu_kernels.PACKED_KERNEL_SOURCE.read_text()
    variants = [int(kg) for kg in re.findall(r"^MG_PACKED_KERNEL\((\d+),", packed, re.M)]
    assert tuple(variants) == gpu_plan.KEY_GROUP_SIZES
    assert gpu_plan.PACKED_KERNELS == tuple(f"morphogen_packed_k{kg}" for kg in variants)
    harness = (EMU_DIR / "emu_harness.cpp").read_text()
    cases = [int(kg) for kg in re.findall(r"^\s+MG_CASE\((\d+)\)", harness, re.M)]
    assert tuple(cases) == gpu_plan.KEY_GROUP_SIZES
    cases = [int(kg) for kg in re.findall(r"^\s+MG_PACKED_CASE\((\d+)\)", harness, re.M)]
    assert tuple(cases) == gpu_plan.KEY_GROUP_SIZES
    source = gpu_kernels.kernel_source()
    for name in gpu_kernels.KERNEL_NAMES:
        kg = name.removeprefix("morphogen_scan_k")
        packed_kg = name.removeprefix("morphogen_packed_k")
        stamped = (f"MG_SCAN_KERNEL({kg}," if kg != name else
                   f"MG_PACKED_KERNEL({packed_kg}," if packed_kg != name else
                   f", {name})" if name in gpu_kernels.SLICED_BLOCK_KERNELS
                   else f"{name}(")
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


def test_tuning_switches_parse_and_override_in_order(monkeypatch):
    monkeypatch.delenv(gpu_kernels.TUNING_ENV, raising=False)
    defaults = gpu_kernels.kernel_tuning()
    assert defaults == {name: getattr(sliced, name) for name in sliced.SLICED_TUNING}
    assert gpu_kernels.parse_tuning(" SLICED_FOLD_IMAD=0 , SLICED_PREFETCH_ROUNDS=4,") == {
        "SLICED_FOLD_IMAD": 0, "SLICED_PREFETCH_ROUNDS": 4}
    monkeypatch.setenv(gpu_kernels.TUNING_ENV, "SLICED_FOLD_IMAD=0,SLICED_PREFETCH_BULK=0")
    got = gpu_kernels.kernel_tuning({"SLICED_PREFETCH_BULK": 1})  # the argument wins
    assert got == {**defaults, "SLICED_FOLD_IMAD": 0, "SLICED_PREFETCH_BULK": 1}
    defines = generated_defines(gpu_kernels.kernel_source())
    assert (defines["SLICED_FOLD_IMAD"], defines["SLICED_PREFETCH_BULK"]) == ("0", "0")


@pytest.mark.parametrize("text, says", [
    ("SLICED_FOLD_IMAD", "NAME=VALUE"),
    ("MT_STRIDE=3", "NAME=VALUE"),  # geometry is not a tuning switch
    ("SLICED_FOLD_IMAD=yes", "needs an integer"),
    ("SLICED_FOLD_IMAD=2", "must be in 0..1"),
    ("SLICED_PREFETCH_ROUNDS=0", "must be in 1..16"),
])
def test_bad_tuning_is_refused_naming_the_variable(monkeypatch, text, says):
    with pytest.raises(ValueError, match=says) as info:
        gpu_kernels.parse_tuning(text)
    assert gpu_kernels.TUNING_ENV in str(info.value)
    monkeypatch.setenv(gpu_kernels.TUNING_ENV, text)
    with pytest.raises(ValueError, match=says):
        gpu_kernels.kernel_source()


def test_an_engine_compiles_the_tuning_of_its_environment(monkeypatch):
    monkeypatch.setenv(gpu_kernels.TUNING_ENV, "SLICED_PREFETCH_ROUNDS=3")
    backend = FakeBackend()
    make_engine(backend, kernel="sliced")
    assert generated_defines(backend.sources[-1])["SLICED_PREFETCH_ROUNDS"] == "3"
    monkeypatch.delenv(gpu_kernels.TUNING_ENV)
    compiled = gpu_kernels.compile_kernels(backend, {"SLICED_FOLD_IMAD": 0})
    assert compiled.tuning["SLICED_FOLD_IMAD"] == 0
    assert generated_defines(backend.sources[-1])["SLICED_FOLD_IMAD"] == "0"

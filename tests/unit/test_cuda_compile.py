"""scan_kernel.cu compiles for sm_90 with no spill and no local memory (nvcc needs no GPU).

Without nvcc this fails, unless MORPHOGEN_SKIP_NVCC_CHECK=1 marks a machine that may skip it.
"""

from __future__ import annotations

import os

import pytest

from morphogen.engine import gpu_kernels, nvcc_check, sliced

SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'morphogen_scan_k3' for 'sm_90'
ptxas info    : Function properties for morphogen_scan_k3
    16 bytes stack frame, 24 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function 'morphogen_xor_reduce' for 'sm_90'
ptxas info    : Function properties for morphogen_xor_reduce
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 34 registers, used 1 barriers, 4096 bytes smem
"""


def test_parser_reads_ptxas_and_flags_spills():
    reports = nvcc_check.parse_ptxas(SAMPLE)
    k3, red = reports["morphogen_scan_k3"], reports["morphogen_xor_reduce"]
    assert (k3.registers, k3.spill_stores, k3.spill_loads, k3.stack_frame) == (128, 24, 36, 16)
    assert (red.registers, red.static_smem, red.barriers) == (34, 4096, 1) and red.clean
    problems = nvcc_check.check(reports, ("morphogen_scan_k3", "morphogen_xor_reduce", "gone"))
    assert any("spill" in p and "k3" in p for p in problems)
    assert any("stack frame" in p for p in problems)
    assert any("gone" in p for p in problems)
    assert not nvcc_check.check({"morphogen_xor_reduce": red}, ("morphogen_xor_reduce",))


# The engine's program, and every tuning switch away from its default at once (the variants
# bench/gpu/variants.py builds must compile as cleanly as the one the engine does).
OTHER_TUNING = {"SLICED_FOLD_IMAD": 1 - sliced.SLICED_FOLD_IMAD,
                "SLICED_PREFETCH_BULK": 1 - sliced.SLICED_PREFETCH_BULK,
                "SLICED_PREFETCH_ROUNDS": 16}


@pytest.mark.parametrize("tuning", [None, OTHER_TUNING], ids=["defaults", "other-tuning"])
def test_kernels_compile_without_spills(tuning):
    nvcc = nvcc_check.find_nvcc()
    if nvcc is None:
        if os.environ.get(nvcc_check.SKIP_ENV) == "1":
            pytest.skip(f"nvcc not found and {nvcc_check.SKIP_ENV}=1")
        pytest.fail(f"nvcc not found; set {nvcc_check.SKIP_ENV}=1 only where that is expected")
    status, log, reports = nvcc_check.run(nvcc, source=gpu_kernels.kernel_source(tuning=tuning))
    assert status == 0, log
    assert set(gpu_kernels.KERNEL_NAMES) <= set(reports), log
    problems = nvcc_check.check(reports, gpu_kernels.KERNEL_NAMES)
    assert not problems, "\n".join(problems) + "\n" + log
    for r in reports.values():
        assert r.arch == "sm_90"
        assert r.registers <= 255


def test_missing_nvcc_fails_unless_allowed(monkeypatch, capsys):
    monkeypatch.setattr(nvcc_check, "find_nvcc", lambda explicit=None: None)
    monkeypatch.delenv(nvcc_check.SKIP_ENV, raising=False)
    assert nvcc_check.main([]) == 2
    monkeypatch.setenv(nvcc_check.SKIP_ENV, "1")
    assert nvcc_check.main([]) == 0
    assert "SKIPPED" in capsys.readouterr().out

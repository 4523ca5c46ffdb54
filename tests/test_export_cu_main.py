"""The `cu` export's -DPORTER_MAIN program for the GEMM variants beside bf16 (CPU only; nvcc
builds, NVRTC compiles): gemm_fp8 and gemm_fp8_e5m2 (random fp8 codes and scales, the
reference over the decoded codes) and gemm_f16. Its decoders are checked against porter's own
fp8 tables and numpy's float16 over every code, its random codes for their range."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from porter.export.export import export
from porter.export.fmt_cu_main import _COMMON
from porter.measure.ops.gemm_fp8 import E4M3, E5M2
from porter.store.base import open_store

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine: the program "
                                "is not built")

PROBE = r"""
#define PORTER_MAIN
""" + _COMMON + r"""
int main() {
  for (int c = 0; c < 256; ++c)
    printf("%a %a\n", porter_fp8_float((unsigned char)c, false),
           porter_fp8_float((unsigned char)c, true));
  for (int h = 0; h < 65536; ++h) printf("%a\n", porter_half_float((unsigned short)h));
  for (int i = 0; i < 20000; ++i)
    printf("%d %d %d\n", porter_fp8_code(false), porter_fp8_code(true), porter_half_code());
  return 0;
}
#endif
"""


@needs_nvcc
def test_the_programs_decoders_and_random_codes(tmp_path):
    (tmp_path / "probe.cu").write_text(PROBE)
    r = subprocess.run([NVCC, "-std=c++17", str(tmp_path / "probe.cu"), "-o",
                        str(tmp_path / "probe")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                           timeout=120, check=True).stdout.splitlines()
    fp8 = np.array([[float.fromhex(x) for x in ln.split()] for ln in lines[:256]])
    e4m3_finite = np.isfinite(E4M3)
    assert np.array_equal(fp8[e4m3_finite, 0], E4M3[e4m3_finite])
    e5m2_finite = np.isfinite(E5M2)
    assert np.array_equal(fp8[e5m2_finite, 1], E5M2[e5m2_finite])
    half = np.array([float.fromhex(x) for x in lines[256:256 + 65536]])
    ref = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(half[fin], ref[fin])
    assert np.array_equal(np.isnan(half), np.isnan(ref))
    assert np.array_equal(np.isinf(half) & (half > 0), np.isinf(ref) & (ref > 0))
    codes = np.array([[int(x) for x in ln.split()] for ln in lines[256 + 65536:]])
    for vals, lo, hi in ((E4M3[codes[:, 0]], 0.125, 15.0), (E5M2[codes[:, 1]], 0.125, 7.0),
                         (codes[:, 2].astype(np.uint16).view(np.float16).astype(np.float64),
                          0.125, 4.0)):
        mag = np.abs(vals)
        assert np.isfinite(vals).all() and mag.min() == lo and mag.max() <= hi
        assert 0.4 < (vals < 0).mean() < 0.6


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """The cu exports of compile-only jobs: gemm_fp8 promoted with per-row scales, the e5m2
    variant at a ragged size, gemm_wgmma_f16."""
    from conftest import replay_job
    tmp = tmp_path_factory.mktemp("main")
    store = open_store(f"sqlite:///{tmp / 'm.db'}")
    out = {}
    for name, size in (("gemm_fp8", "4096x4096x4096x2x2"), ("gemm_fp8_e5m2", "1000x776x2064x1x1"),
                       ("gemm_wgmma_f16", "1000x1032x1040")):
        job = replay_job(store, name, None, arch="sm_90a", trials=1, sizes=[size],
                         backend="compile-only", workers=1)
        out[name] = next(p for p in export(store, job, "cu", tmp / name) if p.suffix == ".cu")
    return out


def test_each_program_checks_its_own_operand_types(programs):
    fp8, e5m2, f16 = (programs[n].read_text() for n in ("gemm_fp8", "gemm_fp8_e5m2",
                                                         "gemm_wgmma_f16"))
    assert "long long dims[5] = {4096, 4096, 4096, 2, 2};" in fp8
    assert "porter_fp8_float(A[(size_t)m * K + k], false)" in fp8
    assert "porter_fp8_float(A[(size_t)m * K + k], true)" in e5m2
    assert "porter_random_fp8((size_t)M * K, true)" in e5m2
    assert "sa[m] * sb[n] : sa[0] * sb[0]" in fp8
    assert "(const f16_t*)A" in f16 and "porter_rel_error(C, R, (size_t)M * N, " \
        "porter_half_float)" in f16 and "porter_random_half" in f16


@needs_nvcc
@pytest.mark.parametrize("name", ["gemm_fp8", "gemm_fp8_e5m2", "gemm_wgmma_f16"])
def test_the_program_builds_with_nvcc(programs, name, tmp_path):
    r = subprocess.run([NVCC, "-arch=sm_90a", "-std=c++17", "-DPORTER_MAIN", str(programs[name]),
                        "-o", str(tmp_path / "prog")], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "porter_" not in r.stderr, r.stderr[-3000:]
    assert (tmp_path / "prog").stat().st_size > 100_000

"""Resource figures come from the cubin, whatever the NVRTC build prints (NVRTC 13.0 on the
H200's image prints no ptxas report that parse_resources can read)."""
from __future__ import annotations

import pytest

from porter.build.compile import _nvrtc_compile, binary_resources, parse_resources
from porter.build.cubin import read_resources

SOURCE = r"""
extern "C" __global__ void plain(float* out, int n) {
  __shared__ float buf[200];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x % 200] = i;
  __syncthreads();
  if (i < n) out[i] = buf[(threadIdx.x + 1) % 200] * 2.0f;
}
// a local array indexed at run time lives in local memory: a stack frame
extern "C" __global__ void framed(float* out, const int* idx, int n) {
  float local[64];
  float s = 0.0f;
  for (int k = 0; k < 64; ++k) { s = s * 1.5f + out[k * n + threadIdx.x]; local[k] = s; }
  out[threadIdx.x] = local[idx[threadIdx.x] & 63];
}
// many live values under a register cap: spills
extern "C" __global__ void __launch_bounds__(1024, 1) spilly(float* out, const float* in) {
  float acc[96];
#pragma unroll
  for (int k = 0; k < 96; ++k) acc[k] = in[k * 1024 + threadIdx.x];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int k = 0; k < 96; ++k) acc[k] = acc[k] * acc[(k + r) % 96] + 1.0f;
  float s = 0;
#pragma unroll
  for (int k = 0; k < 96; ++k) s += acc[k];
  out[threadIdx.x] = s;
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a", "sm_120"])
def test_cubin_agrees_with_ptxas(arch):
    opts = ["-std=c++17", "--ptxas-options=-v", f"--gpu-architecture={arch}", "-maxrregcount=32"]
    ok, log, cubin = _nvrtc_compile(SOURCE, "t.cu", opts)
    assert ok, log
    for kernel in ("plain", "framed", "spilly"):
        logged = parse_resources(log, kernel)
        elf = read_resources(cubin, kernel)
        assert elf is not None and logged.registers > 0
        assert (elf.registers, elf.smem_static, elf.stack_frame) == (
            logged.registers, logged.smem_static, logged.stack_frame), (arch, kernel, log)
    assert read_resources(cubin, "plain").smem_static == 800
    if arch == "sm_90a":     # elsewhere the compiler may keep the array out of local memory
        assert read_resources(cubin, "framed").stack_frame >= 256
    assert read_resources(cubin, "no_such_kernel") is None
    assert read_resources(b"not an elf", "plain") is None


def test_silent_log_still_gives_resources():
    """What a trial records when the compiler's log has no ptxas report (NVRTC 13.0)."""
    opts = ["-std=c++17", "--ptxas-options=-v", "--gpu-architecture=sm_90a", "-maxrregcount=32"]
    ok, log, cubin = _nvrtc_compile(SOURCE, "t.cu", opts)
    assert ok
    reported = binary_resources(cubin, log, "spilly")
    silent = binary_resources(cubin, "", "spilly")
    assert silent.registers == reported.registers > 0
    assert reported.spill_stores > 0 and silent.spill_stores == silent.stack_frame > 0
    clean = binary_resources(cubin, "", "plain")
    assert clean.registers > 0 and clean.spill_stores == 0 and clean.smem_static == 800


def test_empty_log_leaves_the_process_bytes_alone():
    """A compile with nothing to log hands NVRTC a one-byte buffer for the log's terminating
    zero; that buffer must be the compiler's own, not CPython's shared b" " (which would read
    b"\\0" everywhere afterwards). Run in a child so that a regression cannot reach this
    process."""
    import subprocess
    import sys
    code = (
        "from porter.build.compile import _nvrtc_compile\n"
        "ok, log, cubin = _nvrtc_compile('extern \"C\" __global__ void k(int* p) { p[0] = 1; }',"
        " 'k.cu', ['--gpu-architecture=sm_90a'])\n"
        "assert ok and log == '' and cubin[:4] == b'\\x7fELF', (ok, log)\n"
        "print(list(b' '), list(b' ' * 1), list(bytes([32])))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[32]", "[32]", "[32]"], out.stdout

"""The `cu` export's -DPORTER_MAIN program: allocates random inputs at the tuned size (or one
given as `prog 4096x4096x4096`), launches through the exported launcher, checks the output
against a plain reference kernel (fp32, one thread per output) and prints one JSON line with
the median time over repeats, L2 flushed before each, as porter measures. Exit status 1 when
the output is wrong. The ops with one: gemm (bf16) and gemm_f16, gemm_fp8 and gemm_fp8_e5m2
(random codes of a bounded exponent range, random scales; size MxNxKxSCALINGxACCUM, where
SCALING picks the scales at run time and ACCUM only names the accumulation the kernel was built
for), rmsnorm, and imported Kernel Tuner kernels."""
from __future__ import annotations

import json

from porter.export.cexpr import to_c
from porter.export.opargs import OpArgs
from porter.spec.arch import Arch
from porter.spec.template import Template

_COMMON = r"""
#ifdef PORTER_MAIN
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <vector>
#include <algorithm>
#define PORTER_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  exit(2); } } while (0)
static unsigned long long porter_rng = 0x9E3779B97F4A7C15ULL;
[[maybe_unused]] static float porter_uniform() {          // in [-1, 1)
  porter_rng = porter_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)(porter_rng >> 40) / (float)(1 << 24) * 2.f - 1.f;
}
[[maybe_unused]] static unsigned short porter_host_bf16(float f) {   // round to nearest even
  unsigned u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);
}
[[maybe_unused]] static float porter_host_float(unsigned short h) {
  unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f;
}
[[maybe_unused]] __device__ __forceinline__ float porter_ref_float(unsigned short h) {
  return __uint_as_float(((unsigned)h) << 16);
}
// fp16 bits -> float, every class (subnormals, infinities and NaN included)
[[maybe_unused]] __host__ __device__ static float porter_half_float(unsigned short h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                  : ldexpf((float)(1024 + m), e - 25);
  return (h & 0x8000) ? -v : v;
}
// an fp8 code (e5m2 where e5m2, else e4m3) -> float; finite codes (e4m3's 0x7F and e5m2's
// exponent 31 are NaN / infinity: porter_fp8_code never makes them)
[[maybe_unused]] __host__ __device__ static float porter_fp8_float(unsigned char b, bool e5m2) {
  const int eb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int e = (b >> eb) & (e5m2 ? 31 : 15), m = b & ((1 << eb) - 1);
  const float v = e == 0 ? ldexpf((float)m, 1 - bias - eb) : ldexpf((float)((1 << eb) + m),
                                                                     e - bias - eb);
  return (b & 0x80) ? -v : v;
}
[[maybe_unused]] static unsigned short* porter_random_bf16(size_t n, float scale, float offset) {
  std::vector<unsigned short> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = porter_host_bf16(offset + scale * porter_uniform());
  unsigned short* d = 0;
  PORTER_CHECK(cudaMalloc(&d, n * 2));
  PORTER_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}
// random codes: normal fp16 of magnitude 1/8 to 4; fp8 of 1/8 to 15 (e4m3) or 1/8 to 7 (e5m2),
// never NaN or infinity; both signs
[[maybe_unused]] static unsigned short porter_half_code() {
  porter_uniform();
  const unsigned r = (unsigned)(porter_rng >> 33);
  return (unsigned short)(((r & 1u) << 15) | ((12u + (r >> 1) % 5u) << 10) | ((r >> 4) & 1023u));
}
[[maybe_unused]] static unsigned char porter_fp8_code(bool e5m2) {
  porter_uniform();
  const unsigned r = (unsigned)(porter_rng >> 33);
  return (unsigned char)(e5m2 ? ((r & 1u) << 7) | ((12u + (r >> 1) % 6u) << 2) | ((r >> 4) & 3u)
                              : ((r & 1u) << 7) | ((4u + (r >> 1) % 7u) << 3) | ((r >> 4) & 7u));
}
// (scale and offset: as porter_random_bf16's, unused)
[[maybe_unused]] static unsigned short* porter_random_half(size_t n, float, float) {
  std::vector<unsigned short> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = porter_half_code();
  unsigned short* d = 0;
  PORTER_CHECK(cudaMalloc(&d, n * 2));
  PORTER_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}
[[maybe_unused]] static unsigned char* porter_random_fp8(size_t n, bool e5m2) {
  std::vector<unsigned char> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = porter_fp8_code(e5m2);
  unsigned char* d = 0;
  PORTER_CHECK(cudaMalloc(&d, n));
  PORTER_CHECK(cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice));
  return d;
}
// ||out - ref|| / ||ref|| of n 16-bit outputs (decoded by `decode`: bf16 by default) against
// an fp32 reference, both on the device
[[maybe_unused]] static double porter_rel_error(const unsigned short* out, const float* ref,
                                                size_t n,
                                                float (*decode)(unsigned short) = porter_host_float) {
  std::vector<unsigned short> ho(n);
  std::vector<float> hr(n);
  PORTER_CHECK(cudaMemcpy(ho.data(), out, n * 2, cudaMemcpyDeviceToHost));
  PORTER_CHECK(cudaMemcpy(hr.data(), ref, n * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = decode(ho[i]) - hr[i];
    num += d * d; den += (double)hr[i] * hr[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}
// median milliseconds of f() over `reps` repeats, 256 MB written before each to flush L2
template <class F> static double porter_median_ms(F f, int reps) {
  const size_t flush_bytes = 256u << 20;
  void* flush = 0;
  PORTER_CHECK(cudaMalloc(&flush, flush_bytes));
  f();
  PORTER_CHECK(cudaDeviceSynchronize());
  if (reps <= 0) {                        // about 80 ms of kernel time, 10..300 repeats
    cudaEvent_t a, b; float ms = 0.f;
    cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    reps = (int)std::min(300.0, std::max(10.0, 80.0 / std::max(ms, 1e-3f)));
  }
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) PORTER_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    PORTER_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, 0));
    cudaEventRecord(ev[2 * i], 0);
    f();
    cudaEventRecord(ev[2 * i + 1], 0);
  }
  PORTER_CHECK(cudaDeviceSynchronize());
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]);
  std::sort(t.begin(), t.end());
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFree(flush);
  return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}
[[maybe_unused]] static void porter_parse_size(int argc, char** argv, long long* dims, int n) {
  if (argc < 2) return;
  const char* s = argv[1];
  for (int i = 0; i < n; ++i) {
    char* end = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || v <= 0) { fprintf(stderr, "size: write %d positive integers as AxBx...\n", n); exit(2); }
    dims[i] = v;
    s = (*end == 'x' || *end == ',') ? end + 1 : end;
  }
}
"""

_GEMM = r"""
__global__ void porter_reference(const unsigned short* A, const unsigned short* B, float* R,
                                 int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += @REF@(A[(size_t)m * K + k]) * @REF@(B[(size_t)n * K + k]);
  R[(size_t)m * N + n] = acc;
}
int main(int argc, char** argv) {
  long long dims[3] = {@SIZE@};
  porter_parse_size(argc, argv, dims, 3);
  int reps = argc > 2 ? atoi(argv[2]) : 0;
  const int M = (int)dims[0], N = (int)dims[1], K = (int)dims[2];
  unsigned short* A = @RANDOM@((size_t)M * K, 1.f, 0.f);
  unsigned short* B = @RANDOM@((size_t)N * K, 1.f, 0.f);
  unsigned short* C = 0; float* R = 0; void* ws = 0;
  size_t ws_bytes = @KERNEL@_workspace_bytes(M, N, K);
  PORTER_CHECK(cudaMalloc(&C, (size_t)M * N * 2));
  PORTER_CHECK(cudaMemset(C, 0xff, (size_t)M * N * 2));   // NaN: unwritten elements fail
  PORTER_CHECK(cudaMalloc(&R, (size_t)M * N * 4));
  PORTER_CHECK(cudaMalloc(&ws, ws_bytes > 16 ? ws_bytes : 16));
  PORTER_CHECK(cudaMemset(ws, 0, ws_bytes > 16 ? ws_bytes : 16));
  auto run = [&]() { PORTER_CHECK(launch_@KERNEL@((const @ELEM@*)A, (const @ELEM@*)B,
                                                  (@ELEM@*)C, M, N, K, ws, 0)); };
  run();
  PORTER_CHECK(cudaDeviceSynchronize());
  porter_reference<<<dim3((N + 127) / 128, M), 128>>>(A, B, R, M, N, K);
  PORTER_CHECK(cudaDeviceSynchronize());
  double err = porter_rel_error(C, R, (size_t)M * N, @DECODE@);
  bool ok = err <= @RTOL@;   // NaN fails too
  double ms = porter_median_ms(run, reps);
  printf("{\"kernel\": \"@KERNEL@\", \"size\": [%d, %d, %d], \"correct\": %s, \"error\": %.3g, "
         "\"time_ms\": %.6f, \"tflops\": %.1f}\n", M, N, K, ok ? "true" : "false", err, ms,
         2.0 * M * N * K / ms / 1e9);
  return ok ? 0 : 1;
}
#endif  // PORTER_MAIN
"""

_GEMM_FP8 = r"""
__global__ void porter_reference(const unsigned char* A, const unsigned char* B, const float* sa,
                                 const float* sb, float* R, int M, int N, int K, int scaling) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += porter_fp8_float(A[(size_t)m * K + k], @E5M2_A@) *
           porter_fp8_float(B[(size_t)n * K + k], false);
  R[(size_t)m * N + n] = acc * (scaling == 2 ? sa[m] * sb[n] : sa[0] * sb[0]);
}
static float* porter_scales(int n, bool random) {   // per row / column: 0.5 to 1.5
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = random ? 1.f + 0.5f * porter_uniform() : 0.5f;
  float* d = 0;
  PORTER_CHECK(cudaMalloc(&d, n * 4));
  PORTER_CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  return d;
}
int main(int argc, char** argv) {
  long long dims[5] = {@SIZE@};
  porter_parse_size(argc, argv, dims, 5);
  int reps = argc > 2 ? atoi(argv[2]) : 0;
  const int M = (int)dims[0], N = (int)dims[1], K = (int)dims[2], scaling = (int)dims[3];
  if (scaling != 1 && scaling != 2) {
    fprintf(stderr, "size: SCALING (the fourth number) is 1 (per tensor) or 2 (per row and "
            "column)\n");
    exit(2);
  }
  unsigned char* A = porter_random_fp8((size_t)M * K, @E5M2_A@);
  unsigned char* B = porter_random_fp8((size_t)N * K, false);
  float* sa = porter_scales(scaling == 2 ? M : 1, scaling == 2);
  float* sb = porter_scales(scaling == 2 ? N : 1, scaling == 2);
  unsigned short* C = 0; float* R = 0; void* ws = 0;
  size_t ws_bytes = @KERNEL@_workspace_bytes(M, N, K, scaling, dims[4]);
  PORTER_CHECK(cudaMalloc(&C, (size_t)M * N * 2));
  PORTER_CHECK(cudaMemset(C, 0xff, (size_t)M * N * 2));   // NaN: unwritten elements fail
  PORTER_CHECK(cudaMalloc(&R, (size_t)M * N * 4));
  PORTER_CHECK(cudaMalloc(&ws, ws_bytes > 16 ? ws_bytes : 16));
  PORTER_CHECK(cudaMemset(ws, 0, ws_bytes > 16 ? ws_bytes : 16));
  auto run = [&]() { PORTER_CHECK(launch_@KERNEL@(A, B, (bf16_t*)C, sa, sb, M, N, K, scaling,
                                                  ws, 0)); };
  run();
  PORTER_CHECK(cudaDeviceSynchronize());
  porter_reference<<<dim3((N + 127) / 128, M), 128>>>(A, B, sa, sb, R, M, N, K, scaling);
  PORTER_CHECK(cudaDeviceSynchronize());
  double err = porter_rel_error(C, R, (size_t)M * N);
  bool ok = err <= @RTOL@;   // NaN fails too
  double ms = porter_median_ms(run, reps);
  printf("{\"kernel\": \"@KERNEL@\", \"size\": [%d, %d, %d, %d, %lld], \"correct\": %s, "
         "\"error\": %.3g, \"time_ms\": %.6f, \"tflops\": %.1f}\n", M, N, K, scaling, dims[4],
         ok ? "true" : "false", err, ms, 2.0 * M * N * K / ms / 1e9);
  return ok ? 0 : 1;
}
#endif  // PORTER_MAIN
"""

_RMSNORM = r"""
__global__ void porter_reference(const unsigned short* x, const unsigned short* w, float* r,
                                 int rows, int cols, float eps) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const unsigned short* xr = x + (size_t)row * cols;
  float ss = 0.f;
  for (int c = 0; c < cols; ++c) { float v = porter_ref_float(xr[c]); ss += v * v; }
  float inv = rsqrtf(ss / cols + eps);
  for (int c = 0; c < cols; ++c)
    r[(size_t)row * cols + c] = porter_ref_float(xr[c]) * inv * porter_ref_float(w[c]);
}
int main(int argc, char** argv) {
  long long dims[2] = {@SIZE@};
  porter_parse_size(argc, argv, dims, 2);
  int reps = argc > 2 ? atoi(argv[2]) : 0;
  const int rows = (int)dims[0], cols = (int)dims[1];
  const float eps = 1e-6f;
  unsigned short* x = porter_random_bf16((size_t)rows * cols, 1.f, 0.f);
  unsigned short* w = porter_random_bf16((size_t)cols, 0.1f, 1.f);
  unsigned short* y = 0; float* r = 0;
  PORTER_CHECK(cudaMalloc(&y, (size_t)rows * cols * 2));
  PORTER_CHECK(cudaMemset(y, 0xff, (size_t)rows * cols * 2));
  PORTER_CHECK(cudaMalloc(&r, (size_t)rows * cols * 4));
  auto run = [&]() { PORTER_CHECK(launch_@KERNEL@((const bf16_t*)x, (const bf16_t*)w,
                                                  (bf16_t*)y, rows, cols, eps, 0)); };
  run();
  PORTER_CHECK(cudaDeviceSynchronize());
  porter_reference<<<(rows + 127) / 128, 128>>>(x, w, r, rows, cols, eps);
  PORTER_CHECK(cudaDeviceSynchronize());
  double err = porter_rel_error(y, r, (size_t)rows * cols);
  bool ok = err <= @RTOL@;
  double ms = porter_median_ms(run, reps);
  printf("{\"kernel\": \"@KERNEL@\", \"size\": [%d, %d], \"correct\": %s, \"error\": %.3g, "
         "\"time_ms\": %.6f, \"gbps\": %.1f}\n", rows, cols, ok ? "true" : "false", err, ms,
         (2.0 * rows * cols + cols) * 2 / ms / 1e6);
  return ok ? 0 : 1;
}
#endif  // PORTER_MAIN
"""

_KT_C = {"float": "float", "double": "double", "int": "int", "int32": "int",
         "unsigned int": "unsigned int", "char": "char", "long": "long long"}


def _kt_main(tpl: Template, ops: OpArgs, size, sizes: dict) -> str:
    """An imported Kernel Tuner kernel: arguments as its T1 file fills them. T1 files carry
    no reference, so the program checks only that the outputs are finite."""
    from porter.measure.ops.kt import t1_expr
    t1 = json.loads((tpl.folder / "t1.json").read_text())
    declared = {a["Name"]: a for a in t1["KernelSpecification"]["Arguments"]}
    dim_vars = {f"ProblemSize_{i}": f"dims[{i}]" for i in range(len(tpl.size_names))}
    env_params = {p["Name"] for p in t1["ConfigurationSpace"]["TuningParameters"]}
    lines, call, outputs = [], [], []
    for x in ops.args:
        a = declared.get(x.name, {})
        ctype = _KT_C.get(a.get("Type", "int"), "int")
        fill = float(a.get("FillValue", 0))
        if x.kind != "ptr":
            lines.append(f"  {ctype} {x.name} = ({ctype}){fill!r};")
            call.append(x.name)
            continue
        n = to_c(t1_expr(a.get("Size", "1")), {}, {**dim_vars, **{p: p for p in env_params}})
        rnd = a.get("FillType") == "Random"
        lines.append(f"  size_t n_{x.name} = (size_t)({n});\n"
                     f"  std::vector<{ctype}> h_{x.name}(n_{x.name});\n"
                     f"  for (size_t i = 0; i < n_{x.name}; ++i) h_{x.name}[i] = ({ctype})("
                     + (f"{fill!r} * (porter_uniform() * 0.5f + 0.5f)" if rnd else f"{fill!r}")
                     + f");\n  {ctype}* {x.name} = 0;\n"
                     f"  PORTER_CHECK(cudaMalloc(&{x.name}, n_{x.name} * sizeof({ctype})));\n"
                     f"  PORTER_CHECK(cudaMemcpy({x.name}, h_{x.name}.data(), n_{x.name} * "
                     f"sizeof({ctype}), cudaMemcpyHostToDevice));")
        call.append(f"({x.ctype}){x.name}")
        if a.get("Output") and ctype in ("float", "double"):
            outputs.append((x.name, ctype))
    check = "".join(
        f"  PORTER_CHECK(cudaMemcpy(h_{o}.data(), {o}, n_{o} * sizeof({t}), "
        f"cudaMemcpyDeviceToHost));\n  for (size_t i = 0; i < n_{o}; ++i) ok = ok && "
        f"isfinite((double)h_{o}[i]);\n" for o, t in outputs)
    nd = len(tpl.size_names)
    call += [f"dims[{i}]" for i in range(nd)]
    return f"""
int main(int argc, char** argv) {{
  long long dims[{nd}] = {{{", ".join(map(str, size))}}};
  porter_parse_size(argc, argv, dims, {nd});
  int reps = argc > 2 ? atoi(argv[2]) : 0;
{chr(10).join(lines)}
  auto run = [&]() {{ PORTER_CHECK(launch_{tpl.kernel}({", ".join(call)}, 0)); }};
  run();
  PORTER_CHECK(cudaDeviceSynchronize());
  bool ok = true;   // no reference in a T1 file: the outputs must be finite
{check}  double ms = porter_median_ms(run, reps);
  printf("{{\\"kernel\\": \\"{tpl.kernel}\\", \\"correct\\": %s, \\"time_ms\\": %.6f}}\\n",
         ok ? "true" : "false", ms);
  return ok ? 0 : 1;
}}
#endif  // PORTER_MAIN
"""


def main_program(tpl: Template, a: Arch, ops: OpArgs, size, sizes: dict) -> str:
    """The PORTER_MAIN section for this template's op ('' for an op without one)."""
    size = tuple(size) if size else tpl.default_sizes[0]
    rtol = tpl.rtol or 1e-2
    if tpl.op in ("gemm", "gemm_f16"):
        half = tpl.op == "gemm_f16"
        body = (_GEMM.replace("@REF@", "porter_half_float" if half else "porter_ref_float")
                .replace("@RANDOM@", "porter_random_half" if half else "porter_random_bf16")
                .replace("@ELEM@", "f16_t" if half else "bf16_t")
                .replace("@DECODE@", "porter_half_float" if half else "porter_host_float"))
    elif tpl.op in ("gemm_fp8", "gemm_fp8_e5m2"):
        body = _GEMM_FP8.replace("@E5M2_A@", "true" if tpl.op == "gemm_fp8_e5m2" else "false")
    elif tpl.op == "rmsnorm":
        body = _RMSNORM
    elif tpl.op == "kt":
        return _COMMON + _kt_main(tpl, ops, size, sizes)
    else:
        return ""
    return _COMMON + (body.replace("@SIZE@", ", ".join(map(str, size)))
                      .replace("@KERNEL@", tpl.kernel).replace("@RTOL@", repr(float(rtol))))

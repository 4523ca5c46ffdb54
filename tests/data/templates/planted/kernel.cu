// A deliberately faulty rmsnorm: MODE 0 is correct, 1 computes the wrong result, 2 writes to an
// illegal address, 3 never finishes. Used to check that each fault ends in its own status.
#include "porter.cuh"

extern "C" __global__ void planted(const bf16_t* x, const bf16_t* w, bf16_t* y, int rows,
                                   int cols, float eps) {
  int row = blockIdx.x;
  if (row >= rows) return;
  __shared__ float partial[THREADS / 32];
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += THREADS) {
    float v = bf16_to_float(x[(size_t)row * cols + c]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < THREADS / 32; ++i) total += partial[i];
  float scale = rsqrtf(total / cols + eps);
#if MODE == 1
  scale *= 2.0f;
#endif
#if MODE == 3
  // an empty endless loop may legally be removed; one with a side effect may not
  for (;;) asm volatile("nanosleep.u32 1000;");
#endif
  for (int c = threadIdx.x; c < cols; c += THREADS) {
    size_t i = (size_t)row * cols + c;
#if MODE == 2
    i += (size_t)1 << 40;
#endif
    y[i] = float_to_bf16(bf16_to_float(x[(size_t)row * cols + c]) * scale * bf16_to_float(w[c]));
  }
}

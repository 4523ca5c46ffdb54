// hopper/trace.cuh: a development timeline of a kernel's phases, compiled out unless the kernel
// is built with DEV_TRACE=1 (benchmarks/gemm_trace.py does that; no search space has it).
//
// TRACE(cond, slot) has the threads for which cond holds stamp %globaltimer (ns) into slot of a
// small shared-memory table, TRACE_VAL(cond, slot, v) puts v there; TRACE_START(cond) (one
// thread, at entry) clears the table and stamps slot 0, and TRACE_FLUSH(cond) (each stamping
// thread as its last act) copies the filled slots to porter_trace[blockIdx.x][slot], which the
// host reads back with the module's get_global. Stamps are shared-memory stores so that a fence
// or barrier after them (a cluster barrier's release) does not wait for global stores, which
// an earlier version showed adding ~0.6 us to every cluster barrier.
#pragma once
#ifndef DEV_TRACE
#define DEV_TRACE 0
#endif

#if DEV_TRACE
#define PORTER_TRACE_SLOTS 32
#define PORTER_TRACE_CTAS 1024
__device__ unsigned long long porter_trace[PORTER_TRACE_CTAS * PORTER_TRACE_SLOTS];
__shared__ unsigned long long porter_trace_smem[PORTER_TRACE_SLOTS];

__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned trace_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

#define TRACE_START(cond)                                                                \
  do {                                                                                   \
    if (cond) {                                                                          \
      for (int i_ = 1; i_ < PORTER_TRACE_SLOTS; ++i_) porter_trace_smem[i_] = 0;         \
      porter_trace_smem[0] = trace_now();                                                \
    }                                                                                    \
  } while (0)
#define TRACE(cond, slot)                                                                \
  do {                                                                                   \
    if (cond) porter_trace_smem[(slot)] = trace_now();                                   \
  } while (0)
#define TRACE_VAL(cond, slot, v)                                                         \
  do {                                                                                   \
    if (cond) porter_trace_smem[(slot)] = (unsigned long long)(v);                       \
  } while (0)
#define TRACE_FLUSH(cond)                                                                \
  do {                                                                                   \
    if ((cond) && blockIdx.x < PORTER_TRACE_CTAS)                                        \
      for (int i_ = 0; i_ < PORTER_TRACE_SLOTS; ++i_)                                    \
        if (porter_trace_smem[i_])                                                       \
          porter_trace[blockIdx.x * PORTER_TRACE_SLOTS + i_] = porter_trace_smem[i_];    \
  } while (0)
#else
#define TRACE_START(cond) do {} while (0)
#define TRACE(cond, slot) do {} while (0)
#define TRACE_VAL(cond, slot, v) do {} while (0)
#define TRACE_FLUSH(cond) do {} while (0)
#endif

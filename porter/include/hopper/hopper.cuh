// hopper/hopper.cuh: Kernel Porter's tile primitives for Hopper (sm_90a), all in one include.
//
//   sync.cuh       mbarriers, named barriers, proxy fences, cluster helpers
//   tma.cuh        TMA tile loads (2-D / 3-D, multicast) and stores, CUtensorMap
//   pipeline.cuh   Ring / Cursor: producer-consumer stages over mbarriers
//   wgmma.cuh      shared-memory descriptors (128B swizzle, K- and MN-major), MMA batches
//   wgmma_bf16.cuh the m64nNk16 bf16 instructions, SS and RS (generated)
//   fragment.cuh   accumulator / A-operand register layouts, quad reductions
//   warpgroup.cuh  warpgroup indices, setmaxnreg
//   epilogue.cuh   accumulators to a row-major bf16 matrix: direct, staged, stmatrix + TMA store
//   tile_scheduler.cuh  a GEMM's work items: grouped raster, persistent, split-K, stream-K
//   tile_reduce.cuh     tiles computed in parts summed through a workspace (split-K, stream-K)
//   trace.cuh      a development timeline of a kernel's phases (DEV_TRACE=1 only)
// A Blackwell (tcgen05 / TMEM) set would sit beside this folder as blackwell/, sharing the
// TMA and barrier parts.
#pragma once
#include "hopper/sync.cuh"
#include "hopper/tma.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/wgmma.cuh"
#include "hopper/fragment.cuh"
#include "hopper/warpgroup.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/tile_reduce.cuh"
#include "hopper/trace.cuh"

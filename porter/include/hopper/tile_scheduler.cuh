// hopper/tile_scheduler.cuh: which output tiles, and which k-tiles of them, a CTA computes.
//
// Work is counted in units of kCluster tiles stacked along M (a cluster shares its B tile);
// gridDim.x / kCluster clusters take them. A work item is k-tiles [kb, ke) of one unit:
//   plain grid (kPersist = 0): one item per cluster;
//   persistent (kPersist = 1): items i, i + G, i + 2G, ... round robin over the G clusters;
//   split-K (kSplitK > 1): every unit's K cut into kSplitK equal ranges, each an item;
//   stream-K (kStreamK = 1): whole units for all but the last one to two waves, whose k-tiles
//     are dealt out as equal runs over every cluster; kStreamK = 2: only the ragged last wave.
// A unit computed in parts is summed through tile_reduce.cuh; parts / first / me / slot say
// how (recomputed after the main loop rather than kept in registers through it).
// at() is a pure function of the count of k-tiles a CTA has been given, which its producer and
// consumers keep anyway: a stateful "next item" made ptxas move the accumulators to the stack.
#pragma once
#include "porter.cuh"

namespace hopper {

struct Work { int tile, kb, ke; };

// Grouped raster: tiles run down kGroupM rows of tiles at a time, column by column, so the CTAs
// in flight share rows of A and columns of B in L2.
template <int kGroupM>
__device__ __forceinline__ void raster_grouped(int tile, int tiles_m, int tiles_n, int& tm,
                                               int& tn) {
  const int group = kGroupM * tiles_n;
  const int first_m = (tile / group) * kGroupM;
  const int gm = min(tiles_m - first_m, kGroupM);
  const int r = tile % group;
  tm = first_m + r % gm;
  tn = r / gm;
}

template <int kCluster, int kPersist, int kSplitK, int kStreamK>
struct TileScheduler {
  static_assert(!kStreamK || (kPersist && kSplitK == 1), "stream-K: persistent, no split-K");
  static __device__ __forceinline__ int ncl() { return gridDim.x / kCluster; }
  static __device__ __forceinline__ int cid() { return blockIdx.x / kCluster; }
  // units (split-K: their parts) below dp_end are whole items dealt out round robin; stream-K
  // keeps all but the last one to two waves so
  static __device__ __forceinline__ int dp_end(int ntiles) {
    if (!kStreamK) return ntiles * kSplitK;
    const int waves = ntiles / ncl();
    if (kStreamK == 2) return waves * ncl();     // only the ragged last wave is shared out
    return (ntiles % ncl() == 0) ? ntiles : (waves >= 2 ? (waves - 1) * ncl() : 0);
  }
  // stream-K: the k-tiles of the remaining units, in runs of sk_len per cluster
  static __device__ __forceinline__ int sk_len(int ntiles, int kt_n) {
    return ((ntiles - dp_end(ntiles)) * kt_n + ncl() - 1) / ncl();
  }

  // The item that starts at this cluster's k-tile count `it`; false past the last one.
  static __device__ __forceinline__ bool at(int it, Work& w, int ntiles, int kt_n) {
    const int dp = dp_end(ntiles);
    const int n_dp = kPersist ? (cid() < dp ? (dp - cid() + ncl() - 1) / ncl() : 0)
                              : (cid() < dp ? 1 : 0);
    const int per = kt_n / kSplitK;      // K % (BK * kSplitK) == 0
    const int i = it / per;
    if (i < n_dp) {
      const int u = cid() + i * ncl();
      w.tile = u / kSplitK;
      w.kb = (u % kSplitK) * per;
      w.ke = w.kb + per;
      return true;
    }
    if (!kStreamK) return false;
    // This cluster's run is [b, e) of the shared k-tiles (unit-major). The head of its last
    // unit [ls, e) goes first, then [b, ls) in order: every cluster then starts at k = 0 and
    // later runs at a k offset that is the same for all (kt_n - len), so clusters that share A
    // rows or B columns read the same k slices at about the same time and L2 serves them.
    const int total = (ntiles - dp) * kt_n, len = sk_len(ntiles, kt_n);
    const int b = min(total, cid() * len), e = min(total, b + len);
    const int s = it - n_dp * per;
    if (b + s >= e) return false;
    const int ls = max(b, (e - 1) / kt_n * kt_n);
    int start, stop;
    if (s < e - ls) {
      start = ls + s;
      stop = e;
    } else {
      start = b + (s - (e - ls));
      stop = ls;
    }
    w.tile = dp + start / kt_n;
    w.kb = start % kt_n;
    w.ke = min(kt_n, w.kb + (stop - start));
    return true;
  }

  // w's unit among the split ones (stream-K: counted from dp_end)
  static __device__ __forceinline__ int t(const Work& w, int ntiles) {
    return kStreamK ? w.tile - dp_end(ntiles) : w.tile;
  }
  // w's unit is computed in parts first .. first + parts - 1
  static __device__ __forceinline__ int first(const Work& w, int ntiles, int kt_n) {
    return kStreamK ? t(w, ntiles) * kt_n / sk_len(ntiles, kt_n) : 0;
  }
  static __device__ __forceinline__ int parts(const Work& w, int ntiles, int kt_n) {
    if constexpr (kStreamK) {
      if (w.tile < dp_end(ntiles)) return 1;
      return (t(w, ntiles) * kt_n + kt_n - 1) / sk_len(ntiles, kt_n) - first(w, ntiles, kt_n) + 1;
    } else {
      return kSplitK;
    }
  }
  // This cluster's part number of w's unit: stream-K, its cluster index; split-K, its K range.
  static __device__ __forceinline__ int me(const Work& w, int kt_n) {
    if constexpr (kStreamK) return cid();
    else return w.kb / (kt_n / kSplitK);
  }
  // Workspace slot (partial tile) of part `who` of w's unit. Stream-K: a cluster has at most
  // two split items, the one holding the start of its run (slot 2 * who) and the one holding
  // its end (2 * who + 1).
  static __device__ __forceinline__ int slot(const Work& w, int who, int ntiles, int kt_n) {
    if constexpr (kStreamK) return 2 * who + ((who * sk_len(ntiles, kt_n)) / kt_n == t(w, ntiles) ? 0 : 1);
    else return w.tile * kSplitK + who;
  }
};

}  // namespace hopper

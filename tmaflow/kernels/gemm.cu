// bf16 (or fp8 e4m3) GEMM with fp32 accumulation and bf16 out, written with tmaflow's
// Pipeline, SharedLayout, multicast and wgmma wrappers.
//   "nt" (B_N_MAJOR 0): C = A * B^T, A is M x K and B is N x K, both K-contiguous.
//   "nn" (B_N_MAJOR 1): C = A * B,   A is M x K and B is K x N, B N-contiguous.
//   FP8: A and B are e4m3, "nt" only, C = scale * A * B^T. A k-block is 128 elements (128 B
//   rows, as bf16's 64). With PROMOTE, every PROMOTE k-blocks the wgmma accumulators are added
//   into fp32 registers and restarted (fp8 tensor-core accumulation keeps fewer bits).
//   BLOCK_SCALES (DeepSeek-style): every k-block is promoted with its scales, 1 x 128 for A
//   (scale_a[m][kb]) and 128 x 128 for B (scales_b[n / 128][kb], fp32 row-major). Row-major
//   scale_a: a producer warp gathers each stage's A scales and B's with cp.async. SCALES_TMA
//   (scale_a M-major, k-block by k-block): the TMA loads A's 128 with A (map tsa) and the
//   consumers read B's from global memory. Each warpgroup alternates two accumulator sets, so
//   the next k-block's wgmmas run while the last one is promoted.
//
// One CTA computes a BM x BN tile (BN a multiple of 16, 64 to 256; fp8 and B N-major: a multiple
// of 64) with three warpgroups: warpgroup 0 produces (one thread
// issues TMA, with row-major block scales warp 1 gathers them; registers given away with
// setmaxnreg),
// warpgroups 1 and 2 each own 64 rows and issue wgmma m64nBNk16. CLUSTER_M CTAs of a cluster
// work on consecutive M tiles of one N tile and share B: each CTA loads its slice of the B
// boxes and multicasts it to the whole cluster.
// Tiles are dealt to clusters persistently, grouped along M for L2 reuse. The epilogue writes
// each warpgroup's rows into 128B-swizzled 64 x 64 boxes in shared memory (bank-conflict
// free) and TMA-stores them; the hardware clips rows and columns past the edges, and loads
// past the edges read zeros, so ragged M, N and K need no padding. With SPLIT_K, work items
// also split K (for shapes with too few tiles to fill the GPU): each split stores its fp32
// partial, and the last one to finish a tile (a per-tile counter) sums them and stores C.
// With SPLIT_TAIL, the tiles of a last, partly idle wave are split along K instead, in `splits`
// parts dealt part by part after the whole tiles, so that CTAs working at once read the same
// k-range of A and B, as whole tiles' waves do (laying the tail's k-blocks end to end, stream-K
// style, ran 11% slower on H200); a tile's parts meet in tile-sized fp32 slots, summed by the last.
// With CLUSTER_K, the CLUSTER_K CTAs of a cluster compute one tile together, rank r over split r
// of K, and each owns BM / CLUSTER_K rows of it: a consumer warp whose rows another rank owns
// pushes its fp32 sums into that rank's shared memory (st.async), and the owning warps add them
// to their own, always in the same order, and store C. The partials never leave the cluster, and
// no counter or fence to global memory is needed: a cluster's CTAs run at the same time.
#include <cuda_bf16.h>
#include <tmaflow.cuh>
#include "tmaflow_layout.cuh"
using namespace tmaflow;
namespace L = tmaflow_layout;

#ifndef BN
#define BN 256
#endif
#ifndef EPI_COLS
#define EPI_COLS 128
#endif
#ifndef B_N_MAJOR
#define B_N_MAJOR 0
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2
#endif
#ifndef GROUP_M
#define GROUP_M 16
#endif
#ifndef SPLIT_K
#define SPLIT_K 0  // 1: K is split among work items whose fp32 partials meet in `partial`
#endif
#ifndef FP8
#define FP8 0
#endif
#ifndef BLOCK_SCALES
#define BLOCK_SCALES 0
#endif
#ifndef PROMOTE
#define PROMOTE 0
#endif
#ifndef SCALES_TMA
#define SCALES_TMA 0  // block scales of A: M-major, loaded by the TMA (above)
#endif
#ifndef SPLIT_TAIL
#define SPLIT_TAIL 0  // 1: the last wave's tiles are split along K in `splits` parts (above)
#endif
#ifndef CLUSTER_K
#define CLUSTER_K 1  // CTAs of a cluster splitting each tile's K, their partials summed in shared memory
#endif
#ifndef EPI_REM_MAP
#define EPI_REM_MAP 0  // 1: BN is no multiple of 64 (the kernel takes tcr; the host defines it)
#endif
// How the consumers release a stage of gathered (row-major) block scales, which their lanes read
// with ld.shared after warp 1's cp.async: 1 every lane arrives on this CTA's empty barrier
// (Pipeline::consumer_release_lanes: compute-sanitizer's racecheck credits each lane's release
// of its own reads); 0 one lane per CTA after __syncwarp (consumer_release_warp, the release
// before: racecheck reports the next cp.async into the stage as a hazard); 2 one lane per quad
// reads the quad's scales, hands them on with shuffles and arrives (8 arrivals a warp). The plan
// counts release 1's arrivals; 0 and 2 are A/B twins that init the empty barriers for their own.
#ifndef SCALE_RELEASE
#define SCALE_RELEASE (BLOCK_SCALES && !SCALES_TMA)
#endif
#ifndef GROUPED
#define GROUPED 0  // 1: M-grouped (MoE): rows offsets[g] .. offsets[g + 1] of A and C use B[g];
#endif             // offsets, groups and c_slots (2 tensor-map slots per CTA) are read only then
// 1: the k-loop's descriptors from a warpgroup index the compiler knows is warp-uniform (a
// shuffle), as the block-scale loop's: they live in uniform registers, without the per-wgmma
// R2UR moves and vector copies of their arithmetic (the plain loop's 61 instructions a k-block;
// 2304x4608x1024 executed 1.85x cuBLAS's instructions; H200, session 17 call 4, 0's time over
// 1's at nine latency-bound shapes: 1.00-1.07 cold, 1.00-1.07 back to back).
#ifndef UNIFORM_DESC
#define UNIFORM_DESC 1
#endif
#ifndef PROMOTE_SETS
#define PROMOTE_SETS 1  // per-tensor fp8, BN <= 128: 2 promotes every k-block, alternating two accumulator sets
#endif
#ifndef K_TAIL
// 1: K's last k-block, when partial, issues only the k-steps that reach into K; 2: the same, that
// k-block after the k-loop in straight-line code per count (no test between its wgmmas)
#define K_TAIL 0
#endif
// 1: a tile's first wgmma overwrites the accumulators (scale-d 0) instead of 32-128 zeroings a
// thread before the k-loop (1000x3000x520: 48 of a consumer warp's ~810 instructions). The plain
// k-loop only, and not with cluster K-splits (a rank may have no k-blocks; zeroing only those
// made ptxas serialize the wgmmas, C7514) nor tail splits (ptxas then grew four loops 62-69 ->
// 101 instructions; NVRTC 13.5)
#ifndef ACC_OVERWRITE
#define ACC_OVERWRITE 0  // opt-in: H100, session 19, 1000x3000x520, time with it over without 1.012 / 1.007
#endif
// 1: tile_of's divisions unsigned and fewer (below): 78 -> 45 instructions a warp at
// 1000x3000x520, on the producer's path from the launch to its first TMA load. NVRTC 13 only:
// under 12.x the fp8 row-major block-scale loop then took 12 R2UR moves and 12 instructions
// more (ptxas scheduled it otherwise; measured on the GPU with 13.0 only)
#ifndef UDIV_TILE
#if __CUDACC_VER_MAJOR__ >= 13
#define UDIV_TILE 1
#else
#define UDIV_TILE 0
#endif
#endif
// 1: before the CTA exits, wait only until the last TMA stores have read shared memory (CUTLASS's
// store tail), not until their global writes completed
#ifndef EXIT_WAIT_READ
#define EXIT_WAIT_READ 0
#endif
// 1: the epilogue writes C's swizzled boxes with stmatrix, two 8-column blocks (four 8 x 8
// matrices) an instruction, where it took four 32-bit st.shared
#ifndef EPI_STMATRIX
#define EPI_STMATRIX 0
#endif
// 1: the prologue's cluster barrier arrives relaxed (the barrier init's fence publishes the barriers)
#ifndef CLUSTER_ARRIVE_RELAXED
#define CLUSTER_ARRIVE_RELAXED 1
#endif
#ifndef PATCH_ALL
#define PATCH_ALL 0  // grouped: every warpgroup's rows leave through its group's patched C map, not
#endif               // only rows that cross the group's end (GemmConfig.patch_full_tiles, kept to compare)
constexpr int BM = 128, BK = FP8 ? 128 : 64;  // BK elements: 128-byte rows either way
constexpr int kAcc = BN / 2;                    // fp32 accumulators per thread: 64 x BN / 128
constexpr int kScaleStride = BM + 4;            // fp32 block scales per stage: A's rows, then B's (SCALE_STRIDE)
// setmaxnreg split of the 64K registers: 128 x producer + 256 x consumer <= 65536. The warp
// gathering block scales spilled at 40 registers (its loop keeps the work item's state), and
// block scales run faster with 224 consumer registers than with 232, TMA-loaded ones too (H200,
// 4096x7168x16384: 1022 against 992-1017 TFLOP/s; 216 no faster, 208 slower).
constexpr uint32_t kProducerRegs = BLOCK_SCALES ? 56 : 40, kConsumerRegs = BLOCK_SCALES ? 224 : 232;
// A launch gives each of the 384 threads 168 registers (65536 / 384, rounded down to 8); the
// consumers' setmaxnreg.inc waits forever unless the producer's decrease frees enough.
static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "setmaxnreg split would hang");
// C leaves in 64-column boxes, EPI_COLS columns a round; a BN that is no multiple of 64 ends with
// one round of its last EPI_REM columns through a map of EPI_REM-column boxes (tcr).
constexpr int EPI_REM = BN % 64, EPI_FULL = BN - EPI_REM;
static_assert(EPI_REM_MAP == (EPI_REM > 0), "EPI_REM_MAP: 1 exactly when BN is no multiple of 64");
static_assert(BN % 16 == 0 && BN >= 64 && BN <= 256, "BN is a multiple of 16 from 64 to 256");
static_assert(!FP8 || (BN % 64 == 0 && EPI_REM == 0), "fp8 tiles are 64, 128, 192 or 256 columns");
static_assert(!(B_N_MAJOR || GROUPED) || EPI_REM == 0, "B N-major and grouped tiles: a multiple of 64 columns");
static_assert(EPI_COLS % 64 == 0 && EPI_FULL % EPI_COLS == 0, "EPI_COLS: a multiple of 64 dividing BN's whole boxes");
static_assert(L::ab::a_bytes == BM * 128 && L::ab::b_bytes == BN * 128, "plan does not match BM/BN/BK");
static_assert(!FP8 || !B_N_MAJOR, "fp8 wgmma reads both operands K-major: layout nt");
static_assert(!(FP8 && PROMOTE) || BN <= 192, "promotion doubles the accumulators: BN 128 or 192");
static_assert(!(SPLIT_TAIL && (SPLIT_K || GROUPED)), "tail splits are for ungrouped products not split-K");
static_assert(!BLOCK_SCALES || (FP8 && PROMOTE == 1 && BN == 128), "block scales: fp8, promoted every k-block, BN 128");
static_assert(CLUSTER_K == 1 || CLUSTER_K == 2 || CLUSTER_K == 4, "CLUSTER_K is 1, 2 or 4");
static_assert(PROMOTE_SETS == 1 || (PROMOTE_SETS == 2 && FP8 && PROMOTE == 1 && !BLOCK_SCALES && BN <= 128),
              "two promotion sets: per-tensor fp8, promoted every k-block, BN 64 or 128 (three sets of accumulators)");
static_assert(CLUSTER_K == 1 || (CLUSTER_M == 1 && !SPLIT_K && !SPLIT_TAIL && !GROUPED),
              "cluster K-splits: one tile per cluster, no other split");
// Epilogue groups: the consumer warps that store rows of C together, kEpiRows rows (a warp holds
// 16). Each warpgroup is one; with CLUSTER_K, the rows a rank owns (32 of them when it owns a
// quarter of the tile).
constexpr int kEpiRows = CLUSTER_K == 4 ? BM / 4 : 64;
constexpr int kEpiWarps = kEpiRows / 16, kEpiThreads = 32 * kEpiWarps;
constexpr int kEpiBoxBytes = kEpiRows * 128;  // a kEpiRows-row box of 128-byte (64 x bf16) rows
// A consumer warp's arrivals on its own CTA's empty barrier per release: the plan counts every
// lane's (consumer_lanes) where the scales are gathered, one elsewhere; the twins arrive less.
constexpr bool kGatheredScales = BLOCK_SCALES && !SCALES_TMA;
static_assert(L::ab::consumer_lanes == (kGatheredScales ? 32 : 1), "plan: consumer_lanes 32 with gathered scales, else 1");
static_assert(SCALE_RELEASE == 0 || (kGatheredScales && (SCALE_RELEASE == 1 || SCALE_RELEASE == 2)),
              "SCALE_RELEASE 1 or 2 takes gathered (row-major) block scales");
constexpr uint32_t kOwnArrivals = SCALE_RELEASE == 1   ? L::ab::consumer_lanes
                                  : SCALE_RELEASE == 2 ? L::ab::consumer_lanes / 4  // one lane of each quad
                                                       : 1;

// Work item w -> (group of CLUSTER_M M tiles, N tile); GROUP_M M tiles share a band of N tiles.
TMAFLOW_DEVICE void tile_of(int w, int groups_m, int tiles_n, int& gm, int& tn) {
  constexpr int band = GROUP_M / CLUSTER_M;
#if UDIV_TILE
  // Unsigned (every operand is >= 0), the first band's items without a division, and each
  // remainder from its quotient: ptxas had computed r % rows and r / rows as two divisions.
  const uint32_t per_band = band * uint32_t(tiles_n), uw = uint32_t(w);
  const uint32_t q = uw < per_band ? 0 : uw / per_band, r = uw - q * per_band;
  const uint32_t first = q * band, rows = min(uint32_t(groups_m) - first, uint32_t(band));  // first < groups_m
  if (rows == band) {  // every band but the last: a compile-time divisor, no division
    gm = int(first + r % band);
    tn = int(r / band);
  } else {
    const uint32_t t = r / rows;
    gm = int(first + r - t * rows);
    tn = int(t);
  }
#else
  const int per_band = band * tiles_n;
  const int q = w / per_band, r = w - q * per_band;
  const int first = q * band;
  const int rows = min(groups_m - first, band);
  if (rows == band) {  // every band but the last: a compile-time divisor, no division
    gm = first + int(uint32_t(r) % band);
    tn = int(uint32_t(r) / band);
  } else {
    gm = first + r % rows;
    tn = r / rows;
  }
#endif
}

// Work items of a group of `rows` rows (GROUPED): CLUSTER_M-tile groups of M tiles x N tiles.
TMAFLOW_DEVICE int cluster_rows(int rows) { return ((rows + BM - 1) / BM + CLUSTER_M - 1) / CLUSTER_M; }

// One work item: the tile (tm, tn) of group g (g = 0 without GROUPED) over k-blocks [kb0, kb1).
struct Item {
  int g, tm, tn, kb0, kb1, split;
  int a_row, b_row, c_row;  // first row of the tile in A, B and C (their 2-D maps)
  int b_k0;                 // first k-row of the group's B (B_N_MAJOR: B is (G x K) x N)
  int tile;                 // this CTA's tile, numbered uniquely (split-K counters); a tail
                            // tile's part: numbered among the tail's tiles (their partial slots)
  int row_end;              // rows of C from here on belong to someone else (M, or the group's end)
};

// The work items of one CTA, in order (producer and consumers walk the same sequence).
struct Schedule {
  int w, step, work, tiles_n, groups_m, k_blocks, kb_per_split, splits, M, N, K;
  uint32_t rank;
#if CLUSTER_K > 1
  uint32_t krank;  // this CTA's K split of the cluster's tile
#endif
#if SPLIT_TAIL
  int tail;  // items from `work` on: the tail's tiles, split in `splits` parts
#endif
#if GROUPED
  const int* offsets;
  int groups, g, base;  // the group of item w and the first item of that group
#endif
  TMAFLOW_DEVICE bool next(Item& it) {
#if SPLIT_TAIL
    if (w >= work) return tail_part(it);
#else
    if (w >= work) return false;
#endif
#if GROUPED
    const int wt = w / splits;  // the tile's item; w % splits its K split
    for (;;) {  // items come group by group: CLUSTER_M-tile groups of M tiles x N tiles each
      const int rows = offsets[g + 1] - offsets[g];
      const int items = cluster_rows(rows) * tiles_n;
      if (wt < base + items) break;
      base += items;
      ++g;
    }
    const int rows = offsets[g + 1] - offsets[g];
    int gm, tn;
    tile_of(wt - base, cluster_rows(rows), tiles_n, gm, tn);
    it.g = g;
    it.tm = CLUSTER_M * gm + int(rank);
    it.tn = tn;
    it.split = w % splits;
    it.kb0 = it.split * kb_per_split;
    it.kb1 = min(k_blocks, it.kb0 + kb_per_split);
    it.tile = wt * CLUSTER_M + int(rank);
    it.row_end = offsets[g + 1];
    it.a_row = offsets[g] + it.tm * BM;
    it.c_row = it.a_row;
    it.b_row = g * N + tn * BN;
    it.b_k0 = g * K;
#elif CLUSTER_K > 1
    place(it, w, int(krank), false);  // every rank of the cluster on tile w, each on its K split
    it.tile = it.tm * tiles_n + it.tn;
#else
    const int whole = SPLIT_TAIL ? 1 : splits;  // with tail splits, items before the tail are whole
    place(it, w / whole, w % whole, SPLIT_TAIL);
    it.tile = it.tm * tiles_n + it.tn;
#endif
    w += step;
    return true;
  }

  // Item it: tile `wt` of the ungrouped product (tile_of's order), K split `split` of
  // split-K's parts, or all of K when `whole`.
  TMAFLOW_DEVICE void place(Item& it, int wt, int split, bool whole) const {
    int gm, tn;
    tile_of(wt, groups_m, tiles_n, gm, tn);
    it.g = 0;
    it.tm = CLUSTER_M * gm + int(rank);
    it.tn = tn;
    it.split = split;
    it.kb0 = split * kb_per_split;
    it.kb1 = whole ? k_blocks : min(k_blocks, it.kb0 + kb_per_split);
    it.a_row = it.c_row = it.tm * BM;
    it.b_row = tn * BN;
    it.b_k0 = 0;
    it.row_end = M;
  }

#if SPLIT_TAIL
  // Part p / tail of tail item p % tail, p = w - work: every tail tile's first part, then every
  // second part, ...; k-blocks split as split-K's.
  TMAFLOW_DEVICE bool tail_part(Item& it) {
    const int p = w - work;
    if (p >= tail * splits) return false;
    const int i = p % tail;
    place(it, work + i, p / tail, false);
    it.tile = i * CLUSTER_M + int(rank);
    w += step;
    return true;
  }
#endif
};

TMAFLOW_DEVICE void mma(float (&acc)[kAcc], uint64_t da, uint64_t db, uint32_t scale_d = 1) {
#if FP8 && BN == 256
  wgmma::mma_m64n256k32_e4m3(acc, da, db, scale_d);
#elif FP8 && BN == 192
  wgmma::mma_m64n192k32_e4m3(acc, da, db, scale_d);
#elif FP8 && BN == 64
  wgmma::mma_m64n64k32_e4m3(acc, da, db, scale_d);
#elif FP8
  wgmma::mma_m64n128k32_e4m3(acc, da, db, scale_d);
#else
  wgmma::mma_k16_bf16<B_N_MAJOR>(acc, da, db, scale_d);  // m64n<BN>k16: the accumulator count picks it
#endif
}

#if SPLIT_K || SPLIT_TAIL
// Where the fp32 partial sums of one tile's pieces meet: piece p's element (r, c) of the tile
// at base[p * plane + r * pitch + c], for r < rows and c < cols (the rest is not stored).
struct Partials {
  float* base;
  size_t plane;
  int pitch, rows, cols;
  uint32_t* counter;  // pieces done, back to zero once the last has counted
  int piece, pieces;
};

// Consumer warpgroups of one CTA (256 threads): store this piece's in-bounds partial sums,
// count the piece done, and if it was the tile's last, reload every piece's partial (in piece
// order, so the sum does not depend on which finished last) into acc. True in every consumer
// thread of the CTA that finishes the tile.
TMAFLOW_DEVICE bool partials_last(const Partials& p, float (&acc)[kAcc], int row, int lane) {
  const int cw = threadIdx.x / 128 - 1;
  const int r0 = cw * 64 + row, col0 = 2 * (lane % 4);  // rows r0 and r0 + 8 from column col0
  // Columns come in pairs 8 apart and cols is even (16-byte rows of C), so an in-bounds column
  // has its neighbour in bounds too.
  const bool row_ok[2] = {r0 < p.rows, r0 + 8 < p.rows};
  const size_t at = size_t(r0) * p.pitch + col0, next_rows = size_t(8) * p.pitch;
  float* mine = p.base + p.piece * p.plane + at;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (row_ok[h] && col0 + 8 * j < p.cols)
        *reinterpret_cast<float2*>(mine + h * next_rows + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  }
  __threadfence();                        // this thread's partial is visible GPU-wide ...
  named_barrier::sync(3, 256);            // ... for every consumer thread, before the count
  bool last = false;
  if (threadIdx.x == 128) last = atomicAdd(p.counter, 1u) == uint32_t(p.pieces - 1);
  if (!named_barrier::sync_or(3, 256, last)) return false;  // every consumer thread learns it
  __threadfence();
  if (threadIdx.x == 128) *p.counter = 0;  // every piece has counted: ready for the next launch
  // Two pieces: a + b == b + a exactly, so adding the other's partial to ours is deterministic.
  // More: every partial is reloaded in piece order.
  const bool pair = p.pieces == 2;
  if (!pair) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  }
  // Chunks of 8 column blocks (16 loads in flight) keep the registers beside the accumulators
  // bounded; the empty asm with a memory clobber stops the compiler hoisting the next chunk.
  constexpr int kChunk = 8;
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += kChunk) {
    for (int s = pair ? 1 - p.piece : 0; s < (pair ? 2 - p.piece : p.pieces); ++s) {
      const float* src = p.base + s * p.plane + at;
#pragma unroll
      for (int j = j0; j < j0 + kChunk && j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row_ok[h] && col0 + 8 * j < p.cols) {
            const float2 v = __ldcg(reinterpret_cast<const float2*>(src + h * next_rows + 8 * j));
            acc[4 * j + 2 * h] += v.x;
            acc[4 * j + 2 * h + 1] += v.y;
          }
        }
      }
      asm volatile("" ::: "memory");
    }
  }
  return true;
}
#endif

#if CLUSTER_K > 1
// Cluster K-splits: rank r owns epilogue group r's rows of every tile. The other ranks' partials
// of them land in (CLUSTER_K - 1) slots of its `red` buffer, laid out as the warps hold them: a
// warp's i-th 16 bytes a lane fill 512 contiguous bytes, so neither side has bank conflicts.
constexpr uint32_t kWarpSlotBytes = kAcc * 4 * 32;           // one warp's partial
constexpr uint32_t kSlotBytes = kEpiWarps * kWarpSlotBytes;  // one other rank's partial of the owned rows
constexpr int kReduceChunk = 8;  // float4 loads in flight per thread while adding (registers beside acc)

struct ClusterReduce {
  uint8_t* slots;   // this CTA's (CLUSTER_K - 1) slots, for the other ranks in rank order
  Barrier full;     // this CTA's: the other ranks' partials landed (st.async bytes)
  Barrier freed;    // this CTA's: every owner this CTA sends to has read its slot
  uint32_t krank;
  uint32_t items;   // items this warp sent or received: the barriers' phases it is at

  // A warp holding rows rank `owner` owns: once the owner has read what this CTA sent for the
  // previous item, push the warp's sums into the owner's slot for this rank; they complete on
  // the owner's `full` barrier.
  TMAFLOW_DEVICE void send(const float (&acc)[kAcc], uint32_t owner, int warp_in_group, int lane) {
    if (items > 0) mbarrier::wait(freed.bar, (items - 1) & 1u, debug::Site{freed.name, -1, 0});
    const uint32_t slot = krank < owner ? krank : krank - 1;
    const uint32_t dst = cluster::map_shared(slots, owner) + slot * kSlotBytes + warp_in_group * kWarpSlotBytes + lane * 16;
    const uint32_t bar = cluster::map_shared(full.bar, owner);
#pragma unroll
    for (int i = 0; i < kAcc / 4; ++i)
      cluster::store_async_v4(dst + i * 512, make_uint4(__float_as_uint(acc[4 * i]), __float_as_uint(acc[4 * i + 1]),
                                                         __float_as_uint(acc[4 * i + 2]), __float_as_uint(acc[4 * i + 3])), bar);
    ++items;
  }

  // The owning warps: one thread announces the other ranks' bytes; all wait for them, add them
  // to acc slot by slot (the same order for every tile and run: deterministic), and each warp
  // hands the slots back with one arrival on every other rank's `freed`.
  TMAFLOW_DEVICE void receive(float (&acc)[kAcc], int warp_in_group, int lane, bool announce) {
    if (announce) full.arrive_expect_tx();
    mbarrier::wait_cluster(full.bar, items & 1u, debug::Site{full.name, -1, full.tx_bytes});
    const uint8_t* mine = slots + warp_in_group * kWarpSlotBytes + lane * 16;
#pragma unroll
    for (int s = 0; s < CLUSTER_K - 1; ++s) {
#pragma unroll
      for (int i0 = 0; i0 < kAcc / 4; i0 += kReduceChunk) {
#pragma unroll
        for (int i = i0; i < i0 + kReduceChunk && i < kAcc / 4; ++i) {
          const float4 v = *reinterpret_cast<const float4*>(mine + s * kSlotBytes + i * 512);
          acc[4 * i] += v.x;
          acc[4 * i + 1] += v.y;
          acc[4 * i + 2] += v.z;
          acc[4 * i + 3] += v.w;
        }
        asm volatile("" ::: "memory");  // bounds the loads in flight (registers beside acc)
      }
    }
    __syncwarp();  // every lane's reads, before lane r hands the slots back to rank r
    if (uint32_t(lane) < CLUSTER_K && uint32_t(lane) != krank) mbarrier::arrive_cluster(freed.bar, uint32_t(lane));
    ++items;
  }

  // A warp that sent partials, before its CTA exits: the owners' releases of its last item have
  // arrived (no remote arrival may reach a CTA that has left).
  TMAFLOW_DEVICE void drain() const {
    if (items > 0) mbarrier::wait(freed.bar, (items - 1) & 1u, debug::Site{freed.name, -1, 0});
  }
};
#endif

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_bf16(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
          const __grid_constant__ CUtensorMap tc, float* partial, uint32_t* counters, int M, int N,
          int K, int k_splits, const int* offsets, int groups, CUtensorMap* c_slots, float scale,
          const float* scales_a, const float* scales_b
#if SCALES_TMA
          , const __grid_constant__ CUtensorMap tsa
#endif
#if EPI_REM_MAP
          , const __grid_constant__ CUtensorMap tcr  // C in 64 x EPI_REM boxes: each tile's last columns
#endif
          ) {
  extern __shared__ __align__(1024) uint8_t smem[];
  L::Smem S(smem);
  auto pipe = S.ab();
  pipe.empty_arrivals -= L::ab::consumers * (L::ab::consumer_lanes - kOwnArrivals);  // 0 unless an A/B twin
  using Cursor = decltype(pipe)::Cursor;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  // Which M tile of the cluster's group. Unclustered, a constant: the compiler then drops the
  // producer's slice arithmetic (H200, CUPTI: 1024^3 5% faster, 2048^3 0.4%).
  const uint32_t rank = CLUSTER_M > 1 ? cluster::rank() : 0;
  const uint32_t krank = CLUSTER_K > 1 ? cluster::rank() : 0;  // this CTA's K split of the tile
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, k_blocks = (K + BK - 1) / BK;
  [[maybe_unused]] const int k_tail_steps = (K - (k_blocks - 1) * BK + BK / 4 - 1) / (BK / 4);  // of the last k-block
  const int groups_m = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  // K splits; else known to the compiler: no divisions
  const int splits = SPLIT_K || SPLIT_TAIL ? k_splits : CLUSTER_K;
  const int kb_per_split = (k_blocks + splits - 1) / splits;
  constexpr int kCluster = CLUSTER_M * CLUSTER_K;
  const int first = blockIdx.x / kCluster, step = gridDim.x / kCluster;
#if GROUPED
  // Every warp counts the items of all groups, its lanes reading the offsets side by side (one
  // thread reading them in turn waited an L2 round trip per group: tens of us at G = 128).
  int work = 0;
  for (int g = lane; g < groups; g += 32) work += cluster_rows(offsets[g + 1] - offsets[g]) * tiles_n * splits;
  work = __reduce_add_sync(0xffffffffu, work);
  const Schedule plan{first, step, work, tiles_n, groups_m, k_blocks, kb_per_split, splits, M, N, K,
                      rank, offsets, groups, 0, 0};
#elif SPLIT_TAIL
  // The items past the last whole wave are split (matmul/heuristics.py tail_splits mirrors this); with one
  // split (the host found no split that pays) there is no tail.
  const int items = groups_m * tiles_n, tail = splits > 1 && items > step ? items % step : 0;
  const Schedule plan{first, step, items - tail, tiles_n, groups_m, k_blocks, kb_per_split, splits, M, N, K,
                      rank, tail};
#elif CLUSTER_K > 1
  const Schedule plan{first, step, groups_m * tiles_n, tiles_n, groups_m, k_blocks, kb_per_split, splits, M, N, K,
                      rank, krank};
#else
  const int work = groups_m * tiles_n * splits;
  const Schedule plan{first, step, work, tiles_n, groups_m, k_blocks, kb_per_split, splits, M, N, K, rank};
#endif
  if (threadIdx.x == 0) {
    tma::prefetch_descriptor(&ta);
    tma::prefetch_descriptor(&tb);
    tma::prefetch_descriptor(&tc);
#if EPI_REM_MAP
    tma::prefetch_descriptor(&tcr);
#endif
#if SCALES_TMA
    tma::prefetch_descriptor(&tsa);
#endif
#if CLUSTER_K > 1
    S.red_full().init();
    S.red_freed().init();
#endif
    pipe.init();  // its fences publish the barriers above too
  }
  griddep::wait();  // under PDL: A, B and the split-K state of the previous kernel are visible
  griddep::launch_dependents();
#if CLUSTER_M == 1 && CLUSTER_K == 1
  __syncthreads();  // the barriers exist for every thread
#elif CLUSTER_ARRIVE_RELAXED
  // every CTA's barriers exist before any multicast or st.async signals them: pipe.init's
  // fence.mbarrier_init.release.cluster publishes them, so the arrival need not release
  cluster::sync_after_init();
#else
  cluster::sync();  // every CTA's barriers exist before any multicast or st.async signals them
#endif

  if (wg == 0) {
    warp::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      const uint16_t b_mask = L::ab::b_mask(rank);
      const uint32_t slice = L::ab::b_slice(rank), slices = L::ab::b_group_size(rank);
      Cursor c;
      Schedule items = plan;
      for (Item it; items.next(it);) {
        const int tn = it.tn;
        for (int kb = it.kb0; kb < it.kb1; ++kb, c.advance()) {
          pipe.producer_acquire(c);
          pipe.producer_commit(c);
          tma::load(S.ab_a(c.stage), &ta, pipe.barrier(c), kb * BK, it.a_row);
#if SCALES_TMA
          tma::load(S.ab_s(c.stage), &tsa, pipe.barrier(c), it.a_row, kb);  // row kb of tsa: (KB, M)
#endif
          for (int box = int(slice); box < L::ab::b_boxes; box += int(slices)) {
#if B_N_MAJOR
            const int x = tn * BN + box * 64, y = it.b_k0 + kb * BK;           // (n, k) of a 64 x 64 box
#else
            const int x = kb * BK, y = it.b_row + box * (BN / L::ab::b_boxes);  // (k, n) of a row slice
#endif
#if CLUSTER_M == 1
            tma::load(S.ab_b(c.stage, box), &tb, pipe.barrier(c), x, y);
#else
            tma::load_multicast(S.ab_b(c.stage, box), &tb, pipe.barrier(c), b_mask, x, y);
#endif
          }
        }
      }
#if CLUSTER_M > 1
      // The partner's consumers release our stages remotely, possibly after ours are done: this
      // CTA may leave once every stage is free again, all releases arrived (CUTLASS's producer
      // tail). The partner's multicasts into us are over by then: we waited for each of them.
      // A cluster barrier here instead cost 0.8 us a launch (H200, 2048^3).
      for (int s = 0; s < L::ab::stages; ++s, c.advance()) pipe.producer_acquire(c);
#endif
    }
#if BLOCK_SCALES && !SCALES_TMA
    else if (threadIdx.x / 32 == 1) {  // warp 1 gathers each stage's block scales (strided: no TMA)
      const int l = threadIdx.x % 32;
      Cursor c;
      Schedule items = plan;
      for (Item it; items.next(it);) {
        for (int kb = it.kb0; kb < it.kb1; ++kb, c.advance()) {
          pipe.producer_acquire(c);
          // A's BM row scales and B's one; rows past the tile's end read as zero scales.
          float* dst = static_cast<float*>(S.scales()) + c.stage * kScaleStride;
#pragma unroll
          for (int i = l; i < BM; i += 32) {
            const int row = it.a_row + i;
            cp_async::copy4_or_zero(dst + i, scales_a + size_t(min(row, it.row_end - 1)) * k_blocks + kb, row < it.row_end);
          }
          if (l == 0) cp_async::copy4(dst + BM, scales_b + size_t(it.tn) * k_blocks + kb);
          cp_async::arrive_on(pipe.barrier(c));
        }
      }
    }
#endif
  } else {
    warp::setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1;                       // this warpgroup's 64 rows of the tile
    const int t = threadIdx.x % 128, wq = t / 32;  // warp wq holds rows 16 wq .. 16 wq + 15
    // This warp's epilogue group (the warps whose rows of C are stored together) and its place
    // there: gw's rows of the tile are 16 gw .. 16 gw + 15.
    // With cluster K-splits, warps take different paths by group: through a shuffle, ptxas knows
    // the group is warp-uniform and keeps the k-loop's cursor and descriptors in uniform registers
    // (from threadIdx.x alone: 70 instructions a k-block against 63 unsplit; now 66).
    const int gw = cw * 4 + wq;
    const int group = CLUSTER_K > 1 ? __shfl_sync(0xffffffffu, gw / kEpiWarps, 0) : cw, gt = t % kEpiThreads;
    // with cluster K-splits, only the group this rank owns stores
    uint8_t* cbuf = static_cast<uint8_t*>(S.c()) + (CLUSTER_K > 1 ? 0 : group) * (kEpiRows * EPI_COLS * 2);
    Cursor c, prev;
    Schedule items = plan;
#if CLUSTER_K > 1
    ClusterReduce red{static_cast<uint8_t*>(S.red()), S.red_full(), S.red_freed(), krank, 0};
#endif
#if GROUPED
    // This warpgroup's C map: the template with its rows ending where the group ends (so the
    // TMA store clips a group's last tile there), patched on the device per group.
    __shared__ alignas(128) CUtensorMap cmap[2];
    CUtensorMap* const slot = c_slots + 2 * blockIdx.x + cw;
    int patched = -1;
#else
    const CUtensorMap* const out_map = &tc;
#endif
    for (Item it; items.next(it);) {
      const int tm = it.tm, tn = it.tn, kb0 = it.kb0, kb1 = it.kb1;
#if CLUSTER_K == 1
      if (kb0 >= kb1) continue;  // an empty split (the host never plans one)
#endif
#if SPLIT_TAIL
      const bool part = kb1 - kb0 < k_blocks;  // a tail tile's part
#endif
      float acc[kAcc];
      // 0 after a promotion: the next wgmma overwrites acc (scale-d 0), which spares the 64
      // zeroings a thread that would sit between the promotion's wait and the next issue.
      uint32_t acc_live = 1;
#if ACC_OVERWRITE && !PROMOTE && !BLOCK_SCALES && CLUSTER_K == 1 && !SPLIT_TAIL
      acc_live = 0;  // the tile's first wgmma overwrites acc
#else
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#endif
#if PROMOTE
      float total[kAcc];  // the fp32 sum of the promoted k-blocks
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] = 0.f;
#endif
#if BLOCK_SCALES || PROMOTE_SETS == 2
      if ((BLOCK_SCALES && CLUSTER_K == 1) || kb0 < kb1) {  // (a cluster K-split rank may have no k-blocks)
        // k-block j of the item runs on acc (j even) or acc2 (j odd): while one set is promoted
        // (with block scales, with its k-block's scales), the next k-block's wgmmas already run
        // on the other.
        float acc2[kAcc];
        float a0, a1, ab, b0, b1, bb;  // each set's scales: A's rows r and r + 8, B's
        Cursor pa, pb;                 // each set's stage
        [[maybe_unused]] const int r = cw * 64 + wq * 16 + lane / 4;
        // Stage 0's descriptors (a stage's differ only in the start address, in 16-byte units),
        // from a warpgroup index the compiler knows is warp-uniform: the descriptors then live
        // in uniform registers, without per-wgmma moves (H200: M-major scales 4% faster).
        const int cwu = __shfl_sync(0xffffffffu, cw, 0);
        const uint64_t da0 = wgmma::desc_k_major_sw128(static_cast<uint8_t*>(S.ab_a(0)) + cwu * 64 * 128);
        const uint64_t db0 = wgmma::desc_k_major_sw128(S.ab_b(0));
        // Wait for the k-block's stage and issue its wgmmas, then read its scales (used once the
        // wgmmas are done).
        auto issue = [&](float (&d)[kAcc], int kb, float& s0, float& s1, float& sb, Cursor& at) {
          pipe.consumer_wait(c);
          const uint64_t da = da0 + c.stage * (L::ab::a_stride >> 4);
          const uint64_t db = db0 + c.stage * (L::ab::b_stride >> 4);
          wgmma::fence_operands(d);
          wgmma::fence();
#pragma unroll
          for (int k = 0; k < 4; ++k) mma(d, da + 2 * k, db + 2 * k, k > 0);  // k-step 0 overwrites d
          wgmma::commit_group();
#if !BLOCK_SCALES
          s0 = s1 = sb = 1.f;  // per-tensor: the scale comes with the epilogue
          (void)kb;
#elif SCALES_TMA
          const float* sa = static_cast<const float*>(S.ab_s(c.stage));
          sb = __ldg(scales_b + size_t(tn) * k_blocks + kb);
          s0 = sa[r];
          s1 = sa[r + 8];
#else
          const float* sa = static_cast<const float*>(S.scales()) + c.stage * kScaleStride;
#if SCALE_RELEASE == 2
          // lane 4q reads row q's scales (and B's) for its quad: only readers release
          float q0 = 0.f, q1 = 0.f, qb = 0.f;
          if (lane % 4 == 0) {
            q0 = sa[r];
            q1 = sa[r + 8];
            qb = sa[BM];
          }
          s0 = __shfl_sync(0xffffffffu, q0, lane & ~3);
          s1 = __shfl_sync(0xffffffffu, q1, lane & ~3);
          sb = __shfl_sync(0xffffffffu, qb, lane & ~3);
#else
          sb = sa[BM];
          s0 = sa[r];
          s1 = sa[r + 8];
#endif
#endif
          at = c;
          c.advance();
        };
        // After the wait for its wgmmas: release the stage, add the scaled k-block to total.
        auto retire = [&](float (&d)[kAcc], float s0, float s1, float sb, const Cursor& at) {
          wgmma::fence_operands(d);
#if SCALE_RELEASE == 1
          pipe.consumer_release_lanes(at);  // each lane releases its reads of the scales
#elif SCALE_RELEASE == 2
          pipe.consumer_release_lanes(at, lane % 4 == 0);  // the quads' readers
#else
          pipe.consumer_release_warp(at);  // one arrival per consumer warp and CTA
#endif
#if BLOCK_SCALES
          s0 *= sb;
          s1 *= sb;
#pragma unroll
          for (int i = 0; i < kAcc; ++i) total[i] += d[i] * ((i & 2) ? s1 : s0);  // rows r, r + 8
#else
          (void)s0, (void)s1, (void)sb;
#pragma unroll
          for (int i = 0; i < kAcc; ++i) total[i] += d[i];
#endif
        };
        const int n = kb1 - kb0;
        issue(acc, kb0, a0, a1, ab, pa);  // the loop's head always has acc's k-block in flight
        for (int j = 1; j + 1 < n; j += 2) {
          issue(acc2, kb0 + j, b0, b1, bb, pb);
          wgmma::wait_group<1>();
          retire(acc, a0, a1, ab, pa);
          issue(acc, kb0 + j + 1, a0, a1, ab, pa);
          wgmma::wait_group<1>();
          retire(acc2, b0, b1, bb, pb);
        }
        if (n % 2 == 0) {
          issue(acc2, kb1 - 1, b0, b1, bb, pb);
          wgmma::wait_group<1>();
          retire(acc, a0, a1, ab, pa);
          wgmma::wait_group<0>();
          retire(acc2, b0, b1, bb, pb);
        } else {
          wgmma::wait_group<0>();
          retire(acc, a0, a1, ab, pa);
        }
        acc_live = 0;
      }
#else
#if UNIFORM_DESC
      const int cwd = __shfl_sync(0xffffffffu, cw, 0);
#else
      const int cwd = cw;
#endif
      // One k-block: its wgmmas (`steps` of its 4 k-steps: a constant at every call, so each
      // inlined copy issues a fixed sequence), then the previous k-block's stage released. (A
      // generic lambda is a host function to NVRTC 13.0.)
      auto k_block = [&](int kb, int steps) {
        pipe.consumer_wait(c);
        const uint64_t da = wgmma::desc_k_major_sw128(static_cast<uint8_t*>(S.ab_a(c.stage)) + cwd * 64 * 128);
#if B_N_MAJOR
        const uint64_t db = wgmma::desc_mn_major_sw128(S.ab_b(c.stage), L::ab::b_box_stride);
        constexpr uint64_t kStepB = 2048 >> 4;   // 16 k-rows of 128 B
#else
        const uint64_t db = wgmma::desc_k_major_sw128(S.ab_b(c.stage));
        constexpr uint64_t kStepB = 32 >> 4;     // 16 bf16 along the row
#endif
        wgmma::fence_operands(acc);
        wgmma::fence();
#if K_TAIL == 1
        // K's last, partial k-block: only the k-steps that reach into K (the rest multiply the
        // TMA's zero fill)
        const int live_steps = kb == k_blocks - 1 ? k_tail_steps : 4;
        (void)steps;  // always 4 here
#pragma unroll
        for (int k = 0; k < 4; ++k)  // 4 k-steps of 32 B
          if (k == 0 || k < live_steps) mma(acc, da + 2 * k, db + kStepB * k, k > 0 || acc_live);
#else
#pragma unroll
        for (int k = 0; k < 4; ++k)  // 4 k-steps of 32 B
          if (k < steps) mma(acc, da + 2 * k, db + kStepB * k, k > 0 || acc_live);
#endif
        acc_live = 1;
        wgmma::commit_group();
        // Keep this k-block's group in flight; the previous one is done with its stage.
        wgmma::wait_group<1>();
        wgmma::fence_operands(acc);
        if (kb > kb0) pipe.consumer_release_warp(prev);  // one arrival per consumer warp and CTA
        prev = c;
        c.advance();
#if PROMOTE
        if ((kb - kb0) % PROMOTE == PROMOTE - 1) {  // promote; the next k-block restarts acc
          wgmma::wait_group<0>();
          wgmma::fence_operands(acc);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            total[i] += acc[i];
          }
          acc_live = 0;
        }
#endif
      };
#if K_TAIL == 2
      // K's last, partial k-block after the loop, in straight-line code for its count of k-steps
      // (K_TAIL 1's test inside the loop: NVRTC 13.0's ptxas serialized the wgmmas, C7519)
      const int tail = kb1 == k_blocks && kb0 < kb1 && k_tail_steps < 4 ? k_tail_steps : 0;
      for (int kb = kb0; kb < kb1 - (tail > 0); ++kb) k_block(kb, 4);
      if (tail == 1) k_block(kb1 - 1, 1);
      else if (tail == 2) k_block(kb1 - 1, 2);
      else if (tail == 3) k_block(kb1 - 1, 3);
#else
      for (int kb = kb0; kb < kb1; ++kb) k_block(kb, 4);
#endif
      wgmma::wait_group<0>();
      wgmma::fence_operands(acc);
      // A cluster's rank may have no k-blocks (K shorter than the cluster): a zero partial, no
      // stage to release. (The wait stays unconditional: ptxas serializes every wgmma of a loop
      // whose wait it cannot prove is reached.)
      if (CLUSTER_K == 1 || kb0 < kb1) pipe.consumer_release_warp(prev);
#endif  // BLOCK_SCALES
#if PROMOTE
      // After a promotion acc still holds the promoted k-blocks (nothing has overwritten them).
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = total[i] + (acc_live ? acc[i] : 0.f);
#endif

      trace::mark(1);  // the tile's k-blocks are summed (trace builds only)
      const int row = wq * 16 + lane / 4;   // and row + 8; the swizzle depends on row % 8
      const int erow = kEpiWarps == 4 ? row : (wq % kEpiWarps) * 16 + lane / 4;  // and erow + 8, in the group
#if CLUSTER_K > 1
      // This rank's K split is summed. Warps holding rows another rank owns send them there and
      // go on; the owning warps add the other ranks' partials and store the rows.
      if (group != int(krank)) {
        red.send(acc, uint32_t(group), wq % kEpiWarps, lane);
        continue;
      }
      red.receive(acc, wq % kEpiWarps, lane, gt == 0);
#endif
#if SPLIT_K
      // Publish this split's fp32 partial; the last split of the tile to finish sums every
      // split's partial in split order (deterministic) and runs the bf16 epilogue below.
      const Partials parts{partial + size_t(it.c_row) * N + tn * BN, size_t(M) * N, N,
                           it.row_end - it.c_row, N - tn * BN, counters + it.tile, it.split, splits};
      if (!partials_last(parts, acc, row, lane)) continue;
#elif SPLIT_TAIL
      // A tail tile's part: the parts meet in the CTA's `splits` tile-sized slots.
      if (part) {
        const Partials parts{partial + size_t(it.tile) * splits * BM * BN, size_t(BM) * BN, BN, BM, BN,
                             counters + it.tile, it.split, splits};
        if (!partials_last(parts, acc, row, lane)) continue;
      }
#endif
#if GROUPED
      // Rows wholly inside the group leave through the full C map; a warpgroup whose rows cross
      // the group's end (or lie past it) through the map clipped there, patched once per group.
      const bool clipped = PATCH_ALL || it.c_row + (group + 1) * kEpiRows > it.row_end;
      const CUtensorMap* const out_map = clipped ? slot : &tc;
      if (clipped && it.g != patched) {  // once per group and warpgroup
        if (t == 0) tma::wait_group<0>();  // the stores through the old map are done with it
        named_barrier::sync(1 + cw, 128);
        if (t < 32) {
          tensormap::load_warp(&cmap[cw], &tc);
          if (t == 0) tensormap::replace_dim<1>(&cmap[cw], uint32_t(offsets[it.g + 1]));
          __syncwarp();
          tensormap::publish_warp(slot, &cmap[cw]);
          if (t == 0) tensormap::acquire(slot);
        }
        patched = it.g;
      }
#endif
      // Epilogue, EPI_COLS columns a round: registers -> swizzled boxes -> TMA store.
#if FP8
      const float f = scale;  // the operands' scales, applied once to the fp32 sum
#else
      constexpr float f = 1.f;
#endif
#pragma unroll
      for (int r = 0; r < EPI_FULL / EPI_COLS + (EPI_REM > 0); ++r) {
        const bool rem = r == EPI_FULL / EPI_COLS;  // the last EPI_REM columns (a compile-time test)
        if (gt == 0) tma::wait_group_read<0>();  // the previous store has read the buffer
        named_barrier::sync(1 + group, kEpiThreads);
#if EPI_STMATRIX
        // Two 8-column blocks a stmatrix (every width is a multiple of 16 columns): lane l
        // addresses row l % 8 (+ 8 for l / 8 odd) of the warp's 16, in block jj + l / 16.
        const int srow = erow - lane / 4 + lane % 8 + 8 * (lane / 8 % 2);
#pragma unroll
        for (int jj = 0; jj < (rem ? EPI_REM : EPI_COLS) / 8; jj += 2) {
          const int j = r * (EPI_COLS / 8) + jj;
          const uint32_t at = (jj / 8) * kEpiBoxBytes + srow * 128 + ((jj % 8 + lane / 16) ^ (srow % 8)) * 16;
          const uint32_t v[4] = {wgmma::bf16x2(f * acc[4 * j], f * acc[4 * j + 1]),
                                 wgmma::bf16x2(f * acc[4 * j + 2], f * acc[4 * j + 3]),
                                 wgmma::bf16x2(f * acc[4 * j + 4], f * acc[4 * j + 5]),
                                 wgmma::bf16x2(f * acc[4 * j + 6], f * acc[4 * j + 7])};
          warp::stmatrix_x4(cbuf + at, v);
        }
#else
#pragma unroll
        for (int jj = 0; jj < (rem ? EPI_REM : EPI_COLS) / 8; ++jj) {  // 8-column blocks, fragment as mma.m16n8
          const int j = r * (EPI_COLS / 8) + jj;
          // an EPI_REM-column box lies in shared memory as the first columns of a 64-column one
          // (TMA pads rows narrower than the 128-byte swizzle span to it)
          const uint32_t at = (jj / 8) * kEpiBoxBytes + ((jj % 8) ^ (erow % 8)) * 16 + (lane % 4) * 4;
          *reinterpret_cast<uint32_t*>(cbuf + at + erow * 128) = wgmma::bf16x2(f * acc[4 * j], f * acc[4 * j + 1]);
          *reinterpret_cast<uint32_t*>(cbuf + at + (erow + 8) * 128) = wgmma::bf16x2(f * acc[4 * j + 2], f * acc[4 * j + 3]);
        }
#endif
        fence::proxy_async_shared_cta();  // generic-proxy writes visible to the TMA store
        named_barrier::sync(1 + group, kEpiThreads);
        if (gt == 0) {
          if (!rem) {
#pragma unroll
            for (int box = 0; box < EPI_COLS / 64; ++box)
              tma::store(out_map, cbuf + box * kEpiBoxBytes, tn * BN + r * EPI_COLS + box * 64, it.c_row + group * kEpiRows);
          }
#if EPI_REM_MAP
          else {
            tma::store(&tcr, cbuf, tn * BN + EPI_FULL, it.c_row + group * kEpiRows);
          }
#endif
          tma::commit_group();
        }
      }
      trace::mark(2);  // the tile's stores are issued
    }
#if EXIT_WAIT_READ
    if (gt == 0) tma::wait_group_read<0>();  // the global writes complete after the CTA left
#else
    if (gt == 0) tma::wait_group<0>();
#endif
#if CLUSTER_K > 1
    if (group != int(krank)) red.drain();
#endif
  }
}

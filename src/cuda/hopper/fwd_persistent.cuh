/* hopper/fwd_persistent.cuh — cuda-hopper's persistent forward (hopper/fwd.cu's fc_hp_fwd_plan: the default at D = 64,
 * at D = 128 but with a causal-like mask from seqlen_k 8192, at D = 256 without a mask): the ping-pong kernel of
 * hopper/fwd.cu, run by one CTA per SM over a tile schedule (hopper/sched.cuh), with O staged in its own buffer sO so
 * that the producer loads the next tile's Q_i, K_j, V_j while the consumers finish this tile's last P·V and its
 * epilogue. It writes O with a TMA store (TMA_STORE: a dense o that TMA can address) or with direct stores (any o:
 * varlen, odd strides). At D = 64 it runs NC = 3 consumer warpgroups (Br = 192, 512 threads, consumers at 160
 * registers, round-robin turns; the name tmastore3 in docs and results), above 2 (tmastore). The consumers' turns
 * chain across tiles (see the consumers). At D = 256 (Bc = 80, 2 stages) sQ and the K/V ring fill 224 KB: no sO and one
 * Q slot (the next tile's Q_i lands during this tile's last P·V), and each thread stores its rows of O / l from
 * registers right after that P·V (fc_hp_store_o_regs), still overlapping the other warpgroup's GEMMs and the producer's
 * loads of the next tile, where the one-tile kernel's CTAs stop and start.
 *
 * Included by hopper/fwd.cu after its device helpers (fc_hp_pv, fc_hp_softmax, fc_hp_rescale,
 * fc_hp_row_keys) and fc_hopper_fwd_args: it is a part of that file kept apart, not a header of its own.
 *
 * Shared memory: sQ [D/64][Br][64], sK, sV [STAGES][D/64][Bc][64] as in hopper/fwd.cu, then sO [D/64][Br][64], then
 * Q's second slot sQ1 (D = 128: 32 + 128 + 32 + 32 = 224 KB, 230,656 bytes with barriers, ring and alignment slack
 * of the 232,448 a block may have; D = 64: 16 + 96 + 16 + 16 = 144 KB; NC = 3: 24 + 96 + 24 + 24 = 168 KB; D = 256:
 * 64 + 160 = 224 KB, no sO or sQ1), then the
 * mbarriers: q_full (1) [2], q_empty (4·NC: one arrival per consumer warp) [2], full_k, full_v (1), empty_k,
 * empty_v (4·NC) [STAGES], then the tile ring: tile_full (1), tile_empty (4·NC: lane 0 of each consumer warp)
 * [FC_HP_TILE_RING] and the entries (fc_hp_tile, 64 bytes) [FC_HP_TILE_RING].
 *
 * The tile ring (FC_HP_TILE_RING = 2 entries of 64 bytes after the barriers): the producer sets every tile of the
 * CTA's walk up once (fc_hp_tile_setup: the schedule's divisions, the sequence, the visible key blocks) and publishes
 * the result in entry f % 2 (f = the tiles published so far) before its loads, then an end marker; each consumer warp
 * takes entry u when it needs tile u: the first at its start, the next one after the last P·V and the dummy trips of
 * the one before (not earlier: the producer's last fills of tile f − 1 may wait for the dummy trips' releases before
 * it publishes tile f). Publishing entry f waits for the consumers' release of tile f − 2, taken at the end of tile
 * f − 3, long before the producer (at most STAGES fills ahead) gets there; the consumers' take of tile f waits only
 * for the producer to finish issuing the loads of tile f − 1. Before faadf92 both sides ran the set-up:
 * on the consumers it lay on the critical path of every tile boundary, its integer divisions queued on the MUFU pipe
 * behind the other warpgroup's exponentials (1300-1600 cycles; tools/hopper/trace.py).
 * Dynamic order (sc.claim set): the tiles of a CTA are not known in advance. Its first
 * is position blockIdx.x; after the last load of each tile the producer claims the next position
 * (fc_hp_claim_position: grid + atomicAdd(claim, 1), −1 once past the last tile). Each tile is still computed whole
 * by one CTA, so the results do not depend on which CTA took it: deterministic as before.
 * Split rounds (fc_hp_sched_split; unmasked problems, the stride order, NC = 2): after its whole
 * tiles each CTA walks a range of key blocks, in parts of tiles published like tiles (j_begin, n_blocks set to the
 * part; split −1 or 1), and fc_hp_split_fixup joins a cut tile's two parts. Where the cuts fall depends only on the
 * problem and the grid (the SM count): the same bits run to run on one GPU model.
 *
 * Barrier phases across tiles (docs/hopper.md, "Persistent variant"): the producer and the consumers count
 * K uses, V uses and Q uses over the CTA's whole life, not per tile; use number u of a ring is stage u % STAGES,
 * its full barrier's phase u / STAGES (parity (u / STAGES) & 1), and fill u ≥ STAGES waits for the empty
 * barrier's phase u / STAGES − 1, completed by the release of use u − STAGES. Both sides skip the same tiles
 * (no query row in the sequence) and the same loads (no visible key block: no Q, K, V at all), so the counts
 * agree. Every K, V and Q use is released exactly once, in use order per stage: unlike the one-tile kernel,
 * the last two V stages of a tile are released too (the next tile's fills wait for them), and Q_i is released
 * once every S = Q_i·K_jᵀ of the tile has been waited for. Q_i has two slots (use u in slot u % 2), so that the
 * next tile's Q lands during this one's last blocks. */
#if FC_HOPPER_ARCH
/* One tile of the schedule, as the producer sets it up and the consumers take it from the tile ring. */
typedef struct fc_hp_tile {
  int64_t b, shift;
  int h, hk, bt;                /* query head, its K/V head, the batch coordinate of the tensor maps */
  int q_start, k_start, sq, sk; /* the sequence: offsets (varlen) and lengths */
  int i0, j_begin, n_blocks;    /* first query row; visible key blocks [j_begin, j_begin + n_blocks) */
  int split; /* the split rounds (fc_hp_sched_split): 0 a whole tile; −1 a tail part, its O, m, l to split_part; 1 a
              * head part, merged with CTA blockIdx.x + 1's tail part */
} fc_hp_tile;
static_assert(sizeof(fc_hp_tile) <= 64, "a tile ring entry holds 64 bytes");

/* Where one consumer warpgroup's rows of a tile go: what its epilogue needs once the tile itself is past. */
typedef struct fc_hp_out {
  int64_t b;
  int h, bt, q_start, sq, row0; /* row0: the warpgroup's first query row (< 0: before the sequence, align_end) */
} fc_hp_out;

/* The tile of this CTA's slot `slot` (query blocks of BR rows); false when the slot has no tile (snake's last round)
 * or its query block lies past its sequence (varlen: shorter sequences). SCORE_MOD: its key blocks are only those a
 * boolean attn_mask keeps for some of its rows (fc_hp_mask_range), which the consumers take from the tile ring. */
template <int BR = FC_HP_BR, int BC = FC_HP_BC, bool SCORE_MOD = false>
static __device__ __forceinline__ bool fc_hp_tile_setup(const fc_hopper_fwd_args &a, const fc_hp_sched &sc,
                                                        int64_t slot, fc_hp_tile *x, const fc_score_mod &md) {
  const int64_t t = fc_hp_slot_tile(sc, slot);
  if (t >= sc.tiles) return false;
  int mb, bh;
  fc_hp_tile_at(sc, (int)t, &mb, &bh);
  x->h = bh % a.heads_q;
  x->b = bh / a.heads_q;
  x->q_start = 0, x->k_start = 0, x->sq = a.seqlen_q, x->sk = a.seqlen_k;
  if (a.cu_q) {
    x->q_start = a.cu_q[x->b];
    x->sq = a.end_q[x->b] - x->q_start;
    x->k_start = a.cu_k[x->b];
    x->sk = a.end_k[x->b] - x->k_start;
  }
  x->i0 = mb * BR;
  if (x->i0 >= x->sq) return false;
  /* align_end (a causal-like mask): the query blocks end at the sequence's last row, so that a partial block is the
   * first, the lightest, rather than the last, the heaviest (192 rows, D = 64's, do not divide a seqlen of 2^k:
   * at 4096 the last block held 64 rows, one warpgroup alone through every key block, no partner to ping-pong
   * with). Shifted by whole warpgroups (64 rows) only: each warpgroup's rows are all < 0 (nothing to store) or
   * all ≥ 0, and a remainder below 64 rows stays at the end as before. Rows < 0 see no key (fc_hp_row_keys), their Q
   * rows are TMA's zero fill, or the previous sequence's rows for varlen, either way never stored. */
  if (a.align_end) x->i0 -= (BR - x->sq % BR) % BR / 64 * 64;
  x->hk = x->h / a.group;
  x->bt = a.cu_q ? 0 : (int)x->b;
  x->shift = (a.bottom_right ? (int64_t)x->sk - x->sq : 0) + a.mask_offset;
  int lo_first, hi_first, lo_last, hi_last;
  fc_hp_row_keys(x->i0, x->shift, a.window_left, a.window_right, x->sk, &lo_first, &hi_first);
  fc_hp_row_keys(min(x->i0 + BR, x->sq) - 1, x->shift, a.window_left, a.window_right, x->sk, &lo_last, &hi_last);
  x->j_begin = lo_first / BC;
  x->n_blocks = lo_first < hi_last ? (hi_last + BC - 1) / BC - x->j_begin : 0;
  if constexpr (SCORE_MOD) fc_hp_mask_range(md, x->b, x->h, x->i0, BR, x->sq, &x->j_begin, &x->n_blocks);
  x->split = 0;
  return true;
}
#endif /* FC_HOPPER_ARCH */

template <typename T, int D, int STAGES, bool TMA_STORE, int NC = 2, int BC = FC_HP_BC, bool SCORE_MOD = false,
          bool DROP = false>
__global__ void __launch_bounds__(128 + 128 * NC, 1)
    fc_hopper_fwd_persistent_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                                    const fc_hopper_fwd_args a, const fc_hp_sched sc, const fc_score_mod md) {
  /* md: softcap, ALiBi and attn_mask, the SCORE_MOD kernels' only: last, so that the plain kernels' parameters keep
   * their offsets */
#if FC_HOPPER_ARCH
  constexpr int HALVES = D / 64;
  /* NC consumer warpgroups of 64 query rows, as in hopper/fwd.cu (NC = 3: tmastore3, D = 64 only). */
  static_assert(NC == 2 || (NC == 3 && D == 64), "3 consumers: D = 64 only");
  constexpr int BR = 64 * NC, CONSUMER_WARPS = 4 * NC, BAR_TURN = FC_HP_BAR_EPILOGUE + NC;
  /* SO: sO and Q's second slot. D = 256 (Bc = 80) has no room for them: sQ and the K/V ring take 224 KB. There Q_i has
   * one slot (the next tile's Q lands after this one's last S, during its last P·V) and each thread stores its O
   * from registers (fc_hp_store_o_regs) right after the tile's last P·V. */
  constexpr bool SO = D <= 128;
  static_assert(SO || (!TMA_STORE && NC == 2), "D = 256: direct stores, 2 consumers");
  constexpr uint32_t Q_BYTES = BR * D * 2, KV_BYTES = BC * D * 2, Q_HALF_BYTES = BR * FC_HP_ROW_BYTES;
  constexpr uint32_t KV_HALF_BYTES = BC * FC_HP_ROW_BYTES; /* one 64-column half of a K or V block */
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sQ = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + Q_BYTES, sV = sK + STAGES * KV_BYTES, sO = sV + STAGES * KV_BYTES;
  const uint32_t sQ1 = SO ? sO + Q_BYTES : sQ, bars = SO ? sQ1 + Q_BYTES : sO; /* Q's second slot */
  /* q_full, q_empty: one per Q slot; ring: the tile ring */
  const uint32_t q_full = bars, q_empty = bars + 16u, ring = bars + 8u * (4 + 4 * STAGES);
  const uint32_t q_slots = SO && a.q_slots != 1 ? 2u : 1u;
  /* The tile ring's entries (after its barriers): the tiles as the producer set them up, 64 bytes each. */
  fc_hp_tile *const tile_info = (fc_hp_tile *)(smem_raw + (ring + 16u * FC_HP_TILE_RING - fc_smem_u32(smem_raw)));
#define FC_HP_TILE_INFO(e) (tile_info + (e))
#define FULL_K(s)          (bars + 8u * (4 + (s)))
#define FULL_V(s)          (bars + 8u * (4 + STAGES + (s)))
#define EMPTY_K(s)         (bars + 8u * (4 + 2 * STAGES + (s)))
#define EMPTY_V(s)         (bars + 8u * (4 + 3 * STAGES + (s)))

  if (threadIdx.x == 0) {
    for (int q = 0; q < 2; q++) {
      fc_mbar_init(q_full + 8u * q, 1);
      fc_mbar_init(q_empty + 8u * q, CONSUMER_WARPS);
    }
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
      fc_mbar_init(FULL_K(s), 1);
      fc_mbar_init(FULL_V(s), 1);
      fc_mbar_init(EMPTY_K(s), CONSUMER_WARPS);
      fc_mbar_init(EMPTY_V(s), CONSUMER_WARPS);
    }
#pragma unroll
    for (int e = 0; e < FC_HP_TILE_RING; e++) {
      fc_mbar_init(FC_HP_TILE_FULL(e), 1);               /* the producer's arrival after its store */
      fc_mbar_init(FC_HP_TILE_EMPTY(e), CONSUMER_WARPS); /* every consumer warp has read the entry */
    }
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */

  if (threadIdx.x < 128) {
    /* ---- producer: per tile K_0, Q_i, K_1, V_0, K_2, V_1, ..., V_{N−1}, fills counted over all tiles ---- */
    fc_setmaxnreg_dec<FC_HP_REGS_PRODUCER>();
    FC_HP_TRACE_BEGIN(0, threadIdx.x == 0);
    if (threadIdx.x == 0) {
      fc_tma_prefetch_map(&tm_q);
      fc_tma_prefetch_map(&tm_k);
      fc_tma_prefetch_map(&tm_v);
      uint32_t kfill = 0, vfill = 0, qfill = 0, tfill = 0;
      /* Every tile of the CTA's walk that has rows in its sequence goes to the consumers through the tile ring, set
       * up here once (the consumers' copies of the set-up sat on their critical path at every tile boundary: integer
       * divisions queued behind the other warpgroup's exponentials on the MUFU pipe, tools/hopper/trace.py), then
       * an end marker (n_blocks −1). Static orders: slots blockIdx.x + k·grid (64-bit: slot + grid may pass 2^31).
       * Dynamic: after the last load of each tile, the next position is claimed (−1: none left). */
      auto publish = [&](const fc_hp_tile &x) {
        const uint32_t e = tfill % FC_HP_TILE_RING, u = tfill / FC_HP_TILE_RING;
        if (u > 0) fc_mbar_wait(FC_HP_TILE_EMPTY(e), (u - 1) & 1); /* use tfill − FC_HP_TILE_RING was read */
        *FC_HP_TILE_INFO(e) = x;
        fc_mbar_arrive_if(FC_HP_TILE_FULL(e), true); /* releases the store above to the consumers' wait */
        tfill++;
      };
      auto load = [&](const fc_hp_tile &x) {
        FC_HP_MARK(20, x.n_blocks);
        const int sb = fc_hp_acquire_seq_maps(fc_hp_seq_maps_of(a), x.b); /* seqused: the sequence's own maps */
        for (int n = 0; n <= x.n_blocks; n++) {
          if (n < x.n_blocks) {
            const uint32_t s = kfill % STAGES, u = kfill / STAGES;
            if (u > 0) fc_mbar_wait(EMPTY_K(s), (u - 1) & 1); /* use kfill − STAGES is released */
            FC_HP_MARK(22, n);
            fc_mbar_arrive_expect_tx(FULL_K(s), KV_BYTES);
            const int row = x.k_start + (x.j_begin + n) * BC;
#pragma unroll
            for (int hf = 0; hf < HALVES; hf++)
              fc_tma_load_4d(sK + s * KV_BYTES + hf * KV_HALF_BYTES, fc_hp_map(fc_hp_seq_maps_of(a), sb, 1, &tm_k),
                             64 * hf, row, x.hk, x.bt, FULL_K(s));
            kfill++;
          }
          if (n == 0) {
            /* Q_i after K_0: K_0's stage is usually free already, while Q waits for the last tile's final S. */
            const uint32_t qs = qfill % q_slots, qu = qfill / q_slots;
            if (qu > 0) fc_mbar_wait(q_empty + 8u * qs, (qu - 1) & 1);
            FC_HP_MARK(21, 0);
            fc_mbar_arrive_expect_tx(q_full + 8u * qs, Q_BYTES);
#pragma unroll
            for (int hf = 0; hf < HALVES; hf++)
              fc_tma_load_4d((qs ? sQ1 : sQ) + hf * Q_HALF_BYTES, fc_hp_map(fc_hp_seq_maps_of(a), sb, 0, &tm_q),
                             64 * hf, x.q_start + x.i0, x.h, x.bt, q_full + 8u * qs);
            qfill++;
          } else {
            const uint32_t s = vfill % STAGES, u = vfill / STAGES;
            if (u > 0) fc_mbar_wait(EMPTY_V(s), (u - 1) & 1);
            FC_HP_MARK(23, n - 1);
            fc_mbar_arrive_expect_tx(FULL_V(s), KV_BYTES);
            const int row = x.k_start + (x.j_begin + n - 1) * BC;
#pragma unroll
            for (int hf = 0; hf < HALVES; hf++)
              fc_tma_load_4d(sV + s * KV_BYTES + hf * KV_HALF_BYTES, fc_hp_map(fc_hp_seq_maps_of(a), sb, 2, &tm_v),
                             64 * hf, row, x.hk, x.bt, FULL_V(s));
            vfill++;
          }
        }
      };
      for (int64_t slot = blockIdx.x; slot >= 0 && slot < sc.slots;
           slot = sc.claim ? fc_hp_claim_position(sc) : slot + gridDim.x) {
        fc_hp_tile x;
        if (!fc_hp_tile_setup<BR, BC, SCORE_MOD>(a, sc, slot, &x, md))
          continue; /* no rows: the consumers never see it */
        publish(x);
        if (x.n_blocks > 0) load(x); /* none: nothing to load, the consumers store zeros */
      }
      /* The split last rounds (fc_hp_sched_split): this CTA's range of key-block units, in parts of tiles. Every
       * tile there has n_kb key blocks from 0 (no mask, no attn_mask, no varlen: the set-up cannot refuse it). */
      if (NC == 2 && sc.split_units > 0) {
        const int64_t u_end = sc.split_u0 + (blockIdx.x + 1) * sc.split_units / gridDim.x;
        for (int64_t u = sc.split_u0 + blockIdx.x * sc.split_units / gridDim.x; u < u_end;) {
          const int64_t t = u / sc.n_kb;
          const int kb0 = (int)(u - t * sc.n_kb), kb1 = (int)min((int64_t)sc.n_kb, kb0 + (u_end - u));
          fc_hp_tile x;
          fc_hp_tile_setup<BR, BC>(a, sc, t, &x, md);
          x.j_begin = kb0;
          x.n_blocks = kb1 - kb0;
          x.split = kb0 > 0 ? -1 : kb1 < sc.n_kb ? 1 : 0;
          publish(x);
          load(x);
          u += kb1 - kb0;
        }
      }
      fc_hp_tile end = {};
      end.n_blocks = -1;
      publish(end);
    }
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    fc_setmaxnreg_inc<NC == 2 ? FC_HP_REGS_CONSUMER : FC_HP_REGS_CONSUMER_NC3>();
    const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1; /* uniform: see hopper/fwd.cu */
    const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t = lane % 4;
    const uint32_t o_rows = sO + 64 * cw * FC_HP_ROW_BYTES; /* SO only */
    /* SCORE_MOD: S becomes the modified score x (or tanh(S·k_in) for softcap alone), whose exponent and lse factors
     * fc_hp_softmax_factors gives; S itself for a boolean mask alone (fc_hp_mod_x); lse = m_scale·m + ln l */
    [[maybe_unused]] const bool mod_x = SCORE_MOD && fc_hp_mod_x(md);
    float c = a.scale_log2, m_scale = a.scale;
    if constexpr (SCORE_MOD) fc_hp_softmax_factors(md, mod_x, &c, &m_scale);
    FC_HP_TRACE_BEGIN(1 + cw, ct == 0);
    /* The turns (barrier BAR_TURN + c: consumer c's bar.sync and the previous consumer's bar.arrive, 256 threads)
     * go round robin, 0 → 1 (→ 2) → 0, as one chain over the CTA's whole life: the last consumer hands over after
     * every group, the last of a tile included, so consumer 0 takes its first turn of the next loaded tile as soon
     * as the last consumer has issued its last P·V of this one, while the others still run their epilogues.
     * (Before 8938a0a the 2 consumers balanced their turns per tile, as the one-tile kernel does: consumer 0 then
     * waited for consumer 1's epilogue and next tile's start.) Each consumer issues n_blocks + 1 groups per loaded
     * tile and none in a tile with n_blocks = 0 or past its sequence (the same tiles for all: n_blocks is the
     * tile's), so the groups of all tiles form one sequence 0, 1, (2,) 0, 1, ... The last consumer arrives once on
     * consumer 0's barrier before the first tile; the one arrival then left over at the end of the CTA's life (its
     * hand-over after its very last group, or that first arrival when the CTA loaded no tile) is taken by one more
     * bar.sync of consumer 0 after its last tile, instead of a skipped hand-over: skipping would need each consumer
     * to know that no later tile of its list loads anything. Barrier c then sees as many arrivals of consumer c − 1
     * as waits of its own, nothing is pending at exit, and no arrival lands in an earlier generation: consumer
     * c − 1's next hand-over needs its next turn, which needs the hand-overs of all the others, consumer c's
     * (after consumer c's wait) among them, across a tile boundary as within a tile. */
    auto my_turn = [&]() { fc_named_barrier(BAR_TURN + cw, 256); };
    auto your_turn = [&]() { fc_named_barrier_arrive_if(BAR_TURN + (cw == NC - 1 ? 0 : cw + 1), 256, true); };
    fc_named_barrier_arrive_if(BAR_TURN, 256, cw == NC - 1); /* consumer 0 first */
    uint32_t kuse = 0, vuse = 0, quse = 0, tuse = 0;         /* uses over all tiles: the producer's fill counts */

    /* The tiles as the producer set them up, from the tile ring (false: the end marker). In each warp lane 0 alone
     * reads the entry, shuffles it to the other lanes and releases it: its arrival orders its own reads before the
     * producer's next store there. Before 069591c every lane read the entry and lane 0 arrived after a __syncwarp:
     * correct (the warp barrier orders the lanes' reads before lane 0's arrival), but compute-sanitizer's racecheck
     * does not follow that order and reported the producer's store against the lanes' reads wherever a CTA took more
     * than two tiles. An arrival from every thread instead (128·NC per entry) cost 1-2 % at d128
     * (bench/results/configs/hopper-fwd-split-nc3-2026-11-25.txt, E). */
    auto take = [&](fc_hp_tile *x) -> bool {
      constexpr int WORDS = (int)(sizeof(fc_hp_tile) / 4);
      const uint32_t e = tuse % FC_HP_TILE_RING;
      fc_mbar_wait(FC_HP_TILE_FULL(e), (tuse / FC_HP_TILE_RING) & 1);
      uint32_t w[WORDS] = {};
      if (lane == 0) memcpy(w, FC_HP_TILE_INFO(e), sizeof w);
#pragma unroll
      for (int i = 0; i < WORDS; i++) w[i] = __shfl_sync(0xffffffffu, w[i], 0);
      fc_mbar_arrive_if(FC_HP_TILE_EMPTY(e), lane == 0);
      memcpy(x, w, sizeof w);
      tuse++;
      return x->n_blocks >= 0;
    };
    fc_hp_tile x;
    bool ok = take(&x);

    /* This warpgroup's rows of the last tile whose O (divided by l, packed to 16 bits in ob) still waits for its
     * epilogue (pending): it is stored while the next tile's S_0 runs (see fc_hp_epilogue's callers). Packed first,
     * so that the epilogue reads registers no wgmma wrote: reading O itself beside S_0 in flight made ptxas wait for
     * S_0 before the epilogue (C7517). */
    float o[D / 2], inv[2];
    uint32_t ob[SO ? D / 4 : 1];
    fc_hp_out out = {0, 0, 0, 0, 0, 0};
    bool pending = false;
    auto pack_o = [&]() {
      if constexpr (SO) {
#pragma unroll
        for (int e = 0; e < D / 8; e++)
#pragma unroll
          for (int rh = 0; rh < 2; rh++)
            ob[2 * e + rh] = fc_pack2<T>(o[4 * e + 2 * rh] * inv[rh], o[4 * e + 2 * rh + 1] * inv[rh]);
      }
    };

    /* ob (this warpgroup's rows of O / l) through sO to global memory, swizzled as in hopper/fwd.cu: chunk e of row r
     * at half e / 8, byte r·128 + ((e % 8) ^ (r % 8))·16. sO is this warpgroup's alone, so only its own last tile is in
     * the way: TMA store: the thread that issued it waits until the copy engine has read sO; direct stores: the
     * barrier below waits for every thread's reads. */
    auto fc_hp_epilogue = [&](const fc_hp_out &w) {
      const bool stores = w.row0 >= 0; /* align_end: a warpgroup before the sequence's first row stores nothing */
      FC_HP_MARK(15, 0);
      if constexpr (!SO) { /* D = 256: O / l from registers, at once (no sO, and no registers to hold ob) */
        uint16_t *O = a.o + w.b * a.o_sb + (int64_t)w.q_start * a.o_ss + (int64_t)w.h * a.o_sh;
        if (stores) fc_hp_store_o_regs<T, D>(a, O, o, inv, w.row0 + 16 * warp + g, w.sq, t);
        FC_HP_MARK(18, 0);
        return;
      }
      if constexpr (TMA_STORE) {
        if (ct == 0) fc_bulk_wait_read<0>();
      }
      fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128); /* the last tile's O has left sO */
      FC_HP_MARK(16, 0);
      if constexpr (SO) fc_hp_stage_o<D>(o_rows, Q_HALF_BYTES, ob, warp, lane);
      if constexpr (TMA_STORE) {
        /* The copy engine reads sO through the async proxy: each writer's generic stores are made visible to
         * it (fence.proxy.async), then the barrier orders all of them before the one thread that issues the
         * store. TMA writes nothing outside the tensor: rows past the sequence and columns past d stay untouched
         * (dense o only: the host picks this kernel only then). */
        fc_fence_proxy_async();
        fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128);
        FC_HP_MARK(17, 0);
        if (ct == 0 && stores) {
#pragma unroll
          for (int hf = 0; hf < HALVES; hf++)
            fc_tma_store_4d(&tm_o, o_rows + hf * Q_HALF_BYTES, 64 * hf, w.row0, w.h, w.bt);
          fc_bulk_commit();
        }
      } else {
        fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128); /* the warpgroup's O rows are all in shared memory */
        uint16_t *O = a.o + w.b * a.o_sb + (int64_t)w.q_start * a.o_ss + (int64_t)w.h * a.o_sh;
        if (stores) fc_hp_store_o_rows<D>(a, O, o_rows, Q_HALF_BYTES, w.row0, w.sq, ct);
      }
      FC_HP_MARK(18, 0);
    };

    /* 1 / l and lse = scale·m + ln l of this warpgroup's rows (m = −inf, the row saw no key: inv 0 and lse −inf;
     * a NaN m or l: NaN), lse stored at once. */
    auto fc_hp_finish_rows = [&](const fc_hp_tile &x, int wg_row0, const float(&m)[2], const float(&l)[2]) {
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        float lr = l[rh];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        inv[rh] = m[rh] != -INFINITY ? 1.0f / lr : 0.0f;
        if constexpr (DROP) inv[rh] *= md.drop_rp; /* O = Σ P∘keep·V / (l·(1 − p)) (hopper/fwd.cu) */
        const int row = wg_row0 + 16 * warp + g + 8 * rh;
        if (a.lse && t == 0 && row < x.sq && wg_row0 >= 0) {
          const int64_t at =
              a.cu_q ? (int64_t)x.h * a.total_q + x.q_start + row : (x.b * a.heads_q + x.h) * a.seqlen_q + row;
          /* __fmul_rn: not contracted into an fma (mma/fwd_common.cuh, fc_fwd_row_lse) */
          a.lse[at] = m[rh] != -INFINITY ? __fmul_rn(m[rh], m_scale) + logf(lr) : -INFINITY;
        }
      }
    };

    /* A split tile's two parts (fc_hp_sched_split), each thread's o, m, l as its registers hold them (unnormalised
     * O, l per thread before the quad's sum, m the quad's), thread-major so that a warp's accesses are whole lines.
     * Tail part (split −1): written to this CTA's slot, then its flag is raised. Head part (1): CTA blockIdx.x + 1's
     * tail part waited for, read and merged as two blocks of the online softmax, then 1 / l and lse as for a whole
     * tile. L2 only (.cg): the partner's lines never sit in this SM's L1. */
    auto fc_hp_split_fixup = [&](const fc_hp_tile &x, int wg_row0, float(&m)[2], float(&l)[2]) {
      constexpr int WORDS = D / 2 + 4;
      const int slot = (int)blockIdx.x + (x.split > 0 ? 1 : 0);
      float *part = sc.split_part + ((int64_t)slot * NC + cw) * WORDS * 128 + ct;
      int32_t *flag = sc.split_flag + slot * NC + cw;
      FC_HP_MARK(25, x.split + 1); /* trace.py: the fix-up's start (payload 0 tail part, 2 head part) */
      if (x.split < 0) {
#pragma unroll
        for (int e = 0; e < D / 2; e++) __stcg(part + e * 128, o[e]);
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
          __stcg(part + (D / 2 + rh) * 128, m[rh]);
          __stcg(part + (D / 2 + 2 + rh) * 128, l[rh]);
        }
        __threadfence();
        fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128); /* every thread's part is written and fenced */
        if (ct == 0) fc_flag_post(flag, 1);
        FC_HP_MARK(26, 0);
        return;
      }
      if (ct == 0) {
        fc_flag_wait(flag, 1, 100);
        *flag = 0; /* zero again for the next launch (fc_device_zeroed's contract): the only reader of this flag */
      }
      fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128); /* the partner's part is visible to the whole warpgroup */
      FC_HP_MARK(26, 1);
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const float m2 = __ldcg(part + (D / 2 + rh) * 128), l2 = __ldcg(part + (D / 2 + 2 + rh) * 128);
        const float mn = fc_fmax_nan(m[rh], m2), base = mn == -INFINITY ? 0.0f : mn * c;
        const float a1 = fc_exp2(m[rh] * c - base), a2 = fc_exp2(m2 * c - base);
        l[rh] = l[rh] * a1 + l2 * a2;
        m[rh] = mn;
#pragma unroll
        for (int x4 = 0; x4 < D / 8; x4++)
#pragma unroll
          for (int e = 2 * rh; e < 2 * rh + 2; e++)
            o[4 * x4 + e] = o[4 * x4 + e] * a1 + __ldcg(part + (4 * x4 + e) * 128) * a2;
      }
      fc_hp_finish_rows(x, wg_row0, m, l);
      FC_HP_MARK(27, 0);
    };

    while (ok) {
      const int wg_row0 = x.i0 + 64 * cw, n_blocks = x.n_blocks, j_begin = x.j_begin;
      const int split = NC == 2 ? x.split : 0; /* the split rounds: two consumer warpgroups only (hopper/fwd.cu) */
      /* This warpgroup's blocks [0, n_own) of the tile's n_blocks; the rest are dummy trips (below). */
      const int n_own = fc_hp_own_blocks(a, wg_row0, x.sq, x.sk, x.shift, BC, j_begin, n_blocks);
      FC_HP_MARK(1, n_blocks | n_own << 8);
      FC_HP_MARK(24, 0); /* right after the last: what a mark itself costs (trace.py subtracts nothing, reports it) */
      int lo[2], hi[2];
#pragma unroll
      for (int rh = 0; rh < 2; rh++)
        fc_hp_row_keys(wg_row0 + 16 * warp + g + 8 * rh, x.shift, a.window_left, a.window_right, x.sk, &lo[rh],
                       &hi[rh]);
      /* Whole key blocks of this warpgroup, as in hopper/fwd.cu. */
      int64_t full_hi = x.sk / BC, full_lo = 0;
      if (a.window_right >= 0) full_hi = min(full_hi, fc_hp_floor_div(wg_row0 + x.shift + a.window_right + 1, BC));
      if (a.window_left >= 0) full_lo = -fc_hp_floor_div(-(wg_row0 + 63 + x.shift - a.window_left), BC);
      const int j_full_hi = (int)max(full_hi, (int64_t)0),
                j_full_lo = (int)min(max(full_lo, (int64_t)0), (int64_t)j_full_hi);
      auto needs_mask = [&](int j) { return j < j_full_lo || j >= j_full_hi; };
      /* SCORE_MOD: the tile's ALiBi slope and each row's ALiBi distance to key 2t (hopper/fwd.cu's one-tile kernel) */
      float slope = 0.0f, dist0[2] = {0.0f, 0.0f}, lin_off = 0.0f;
      [[maybe_unused]] bool lin = false; /* ALiBi's linear form (fc_hp_alibi_lin) */
      if constexpr (SCORE_MOD) {
        slope = fc_score_mod_slope(md, x.b, x.h);
#pragma unroll
        for (int rh = 0; rh < 2; rh++) dist0[rh] = (float)(wg_row0 + 16 * warp + g + 8 * rh + x.sk - x.sq - 2 * t);
        lin = fc_hp_alibi_lin(md, x.shift, a.window_right, x.sq, x.sk, slope, &lin_off);
      }
      /* SCORE_MOD: the block in hand's class and keep bits, block j's read one block ahead (hopper/fwd.cu) */
      [[maybe_unused]] int cls = FC_MT_ALL;
      [[maybe_unused]] fc_hp_keep<BC> km;
      auto mask_class = [&](int j) {
        return SCORE_MOD && j < j_begin + n_own ? fc_hp_mask_class(md, x.b, x.h, wg_row0, x.sq, j) : (int)FC_MT_ALL;
      };
      auto mask_next = [&](int next, int j) {
        if constexpr (SCORE_MOD) {
          cls = next;
          fc_hp_mask_bits<BC>(km, md, x.b, x.h, next, wg_row0 + 16 * warp + g, x.sq, x.sk, j * BC, t);
        }
      };
      auto mod_block = [&](float(&s)[BC / 2], int j) {
        if constexpr (SCORE_MOD)
          fc_hp_mod_block<T, BC>(s, md, mod_x, slope, dist0, lin, x.b, x.h, cls, km, wg_row0 + 16 * warp + g, x.sq,
                                 x.sk, j * BC, t);
      };
      /* DROP (dropout): block j's keep bits at the top of its trip, P∘keep after the softmax (hopper/fwd.cu) */
      [[maybe_unused]] fc_hp_drop<BC> kd;
      auto drop_bits = [&](int j) {
        if constexpr (DROP)
          fc_hp_drop_bits<BC>(kd, md, (uint64_t)(x.b * a.heads_q + x.h), wg_row0 + 16 * warp + g, x.sk, j * BC, t);
      };
      auto drop_apply = [&](float(&s)[BC / 2]) {
        if constexpr (DROP) fc_hp_drop_apply<BC>(s, kd);
      };

      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
      uint32_t p[BC / 16][4];
      fc_hp_tile xn;
      bool okn;
      const fc_hp_out here = {x.b, x.h, x.bt, x.q_start, x.sq, wg_row0};

      if (n_blocks > 0) {
#pragma unroll
        for (int e = 0; e < D / 2; e++) o[e] = 0.0f;
        const uint32_t qs = quse % q_slots, q_rows = (qs ? sQ1 : sQ) + 64 * cw * FC_HP_ROW_BYTES;
        mask_next(mask_class(j_begin), j_begin);
        fc_mbar_wait(q_full + 8u * qs, (quse / q_slots) & 1); /* Q_i has landed */
        FC_HP_MARK(2, 0);
        {
          float s[BC / 2];
          [[maybe_unused]] const int cls_next = mask_class(j_begin + 1);
          drop_bits(j_begin);
          const uint32_t s0 = kuse % STAGES;
          fc_mbar_wait(FULL_K(s0), (kuse / STAGES) & 1);
          FC_HP_MARK(3, 0);
          my_turn();
          FC_HP_MARK(4, 0);
          fc_wgmma_fence();
          fc_hp_ss_kmajor<T, D, BC>(s, q_rows, sK + s0 * KV_BYTES);
          fc_wgmma_commit();
          your_turn();
          /* The last tile's epilogue while S_0 runs. */
          if (pending) fc_hp_epilogue(out);
          pending = false;
          fc_wgmma_wait<0>();
          fc_fence_regs(s);
          FC_HP_MARK(5, 0);
          fc_mbar_arrive_if(EMPTY_K(s0), lane == 0);
          kuse++;
          mod_block(s, j_begin);
          fc_hp_softmax_f32<BC>(s, needs_mask(j_begin), j_begin * BC, lo, hi, t, c, m, l, alpha);
          drop_apply(s);
          fc_hp_pack<T, BC>(s, p);
          mask_next(cls_next, j_begin + 1);
          FC_HP_MARK(6, 0);
        }

        for (int n = 1; n < n_own; n++) {
          /* K_n is K use kuse, V_{n−1} is V use vuse, V_{n−2} V use vuse − 1. */
          const uint32_t sn = kuse % STAGES, sp = vuse % STAGES;
          float s[BC / 2];
          [[maybe_unused]] const int cls_next = mask_class(j_begin + n + 1);
          drop_bits(j_begin + n);
          /* V_{n−2}: its P·V was waited for at the end of the last trip (where and why: hopper/fwd.cu) */
          fc_mbar_arrive_if(EMPTY_V((vuse + STAGES - 1) % STAGES), lane == 0 && n >= 2);
          fc_mbar_wait(FULL_K(sn), (kuse / STAGES) & 1);
          fc_mbar_wait(FULL_V(sp), (vuse / STAGES) & 1);
          FC_HP_MARK(7, n);
          fc_fence_regs(o);
          fc_fence_regs(p);
          my_turn();
          FC_HP_MARK(8, n);
          fc_wgmma_fence();
          fc_hp_ss_kmajor<T, D, BC>(s, q_rows, sK + sn * KV_BYTES);
          fc_wgmma_commit();
          fc_hp_pv<T, D, BC>(o, p, sV + sp * KV_BYTES);
          fc_wgmma_commit();
          your_turn();
          fc_wgmma_wait<1>(); /* S is ready; P·V may still run */
          fc_fence_regs(s);
          FC_HP_MARK(9, n);
          fc_mbar_arrive_if(EMPTY_K(sn), lane == 0);
          mod_block(s, j_begin + n);
          fc_hp_softmax_beside_pv<T, BC, D>(s, o, p, needs_mask(j_begin + n), (j_begin + n) * BC, lo, hi, t, c, m, l,
                                            alpha, a.head_dim > 0, drop_apply, [&] { FC_HP_MARK(10, n); });
          mask_next(cls_next, j_begin + n + 1);
          FC_HP_MARK(19, n);
          kuse++;
          vuse++;
        }

        /* The last O += P·V (of block n_own − 1). Before it: every S of the tile was waited for, so Q_i may be
         * overwritten by the next tile's, and V_{n_own−2}'s P·V was waited for in the loop's last trip. */
        const uint32_t sl = vuse % STAGES;
        fc_mbar_wait(FULL_V(sl), (vuse / STAGES) & 1);
        FC_HP_MARK(11, 0);
        fc_mbar_arrive_if(q_empty + 8u * qs, lane == 0);
        fc_mbar_arrive_if(EMPTY_V((vuse + STAGES - 1) % STAGES), lane == 0 && n_own >= 2);
        fc_fence_regs(o);
        fc_fence_regs(p);
        my_turn();
        FC_HP_MARK(12, 0);
        fc_wgmma_fence();
        fc_hp_pv<T, D, BC>(o, p, sV + sl * KV_BYTES);
        fc_wgmma_commit();
        your_turn();
        /* While it runs: this tile's 1 / l and lse (m, l are final; a part of a split tile's are not). */
        m[1] -= lin_off; /* ALiBi's linear form: row 1's offset (fc_hp_alibi_lin; 0 in the unmasked split rounds) */
        if (split == 0) fc_hp_finish_rows(x, wg_row0, m, l);
        fc_wgmma_wait<0>();
        fc_fence_regs(o);
        FC_HP_MARK(13, 0);
        fc_mbar_arrive_if(EMPTY_V(sl), lane == 0); /* V_{n_own−1}: the next tile's fills wait for it */
        vuse++;
        quse++;
        /* Dummy trips: blocks n_own .. n_blocks − 1 are masked for all of this warpgroup's rows (fc_hp_own_blocks).
         * One turn each, as the other consumers' groups of those blocks take theirs (the chain counts n_blocks + 1
         * per consumer and tile), and each K and V use released once as the producer's counts expect; after the
         * stage's full wait, so that the arrival cannot fall into the phase of the stage's previous use (the fill
         * that completes this full barrier waited for that phase's end). */
        for (int n = n_own; n < n_blocks; n++) {
          const uint32_t sn = kuse % STAGES, sp = vuse % STAGES;
          fc_mbar_wait(FULL_K(sn), (kuse / STAGES) & 1);
          my_turn();
          FC_HP_MARK(14, n);
          your_turn();
          fc_mbar_arrive_if(EMPTY_K(sn), lane == 0);
          fc_mbar_wait(FULL_V(sp), (vuse / STAGES) & 1);
          fc_mbar_arrive_if(EMPTY_V(sp), lane == 0);
          kuse++;
          vuse++;
        }
        if constexpr (NC == 2) {
          if (split != 0) fc_hp_split_fixup(x, wg_row0, m, l);
        }
        /* The next tile: only after the dummy trips, whose releases the producer's last fills of this tile may wait
         * for before it publishes the next one. O / l waits for its epilogue until the next loaded tile's S_0 is
         * issued (or the CTA's end); a tail part's O went to split_part instead. */
        if constexpr (!SO) {
          if (split >= 0) fc_hp_epilogue(here); /* before the take, which may wait for the producer */
        }
        okn = take(&xn);
        if (split >= 0) pack_o();
        out = here;
        pending = SO && split >= 0;
      } else {
        /* No key: O = 0 and lse = −inf (l = 0), after any tile still pending. */
        if (pending) fc_hp_epilogue(out);
        fc_hp_finish_rows(x, wg_row0, m, l);
#pragma unroll
        for (int e = 0; e < (SO ? D / 4 : 1); e++) ob[e] = 0u;
        if constexpr (!SO) {
#pragma unroll
          for (int e = 0; e < D / 2; e++) o[e] = 0.0f;
        }
        fc_hp_epilogue(here);
        pending = false;
        okn = take(&xn);
      }
      x = xn;
      ok = okn;
    }
    if (pending) fc_hp_epilogue(out);
    /* The last consumer's last hand-over (or its first arrival, when the CTA loaded no tile), see the turns. */
    if (cw == 0) my_turn();
    if constexpr (TMA_STORE) {
      if (ct == 0) fc_bulk_wait<0>(); /* the CTA's shared memory lives until its last store has read it */
    }
  }
#undef FULL_K
#undef FULL_V
#undef EMPTY_K
#undef EMPTY_V
#undef FC_HP_TILE_INFO
#endif /* FC_HOPPER_ARCH */
}

#if FC_HOPPER_ARCH
#undef FC_HP_TILE_FULL
#undef FC_HP_TILE_EMPTY
#undef FC_HP_TILE_POS
#endif

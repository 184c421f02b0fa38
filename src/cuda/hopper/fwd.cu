/* hopper/fwd.cu — cuda-hopper forward: FlashAttention on H100/H200 (sm_90a) with TMA, wgmma and warp
 * specialisation, after the FlashAttention-3 paper (Shah et al., 2024). Verified on an H100 (tools/hopper/gpu.sh:
 * 528/528 cases, memcheck, racecheck and synccheck clean); FLASHC_HOPPER=0 hides it (see docs/hopper.md).
 *
 *   CTA = one query block Q_i (Br = 128 rows) of one head of one sequence; 3 warpgroups (384 threads):
 *     warpgroup 0, producer (24 registers): one thread issues every TMA copy: Q_i once, then K_j and V_j
 *       into a ring of STAGES stages, each stage handed over through mbarriers (full: the bytes landed;
 *       empty: both consumers are done with it);
 *     warpgroups 1, 2, consumers (240 registers): rows 64·c .. 64·c + 63 of Q_i each, for every visible
 *       key block j (Bc = 128 keys):
 *         S = Q_i·K_jᵀ                       wgmma m64n128k16, Q_i and K_j from shared memory
 *         m' = max(m, rowmax S);  P = 2^(c·S − c·m');  l = 2^(c·(m − m'))·l + rowsum P   (c = scale·log2 e)
 *         O = 2^(c·(m − m'))·O + P·V_j        wgmma m64nDk16, P from registers, V_j from shared memory
 *       (m moves only when c·rowmax S passes c·m by 8, a factor 2^8, so O's rescale is skipped in most blocks),
 *       where S_{j+1} = Q_i·K_{j+1}ᵀ and O += P_j·V_j are issued back to back, and the softmax of block
 *       j + 1 runs on the CUDA cores while P_j·V_j is still in flight on the tensor cores (intra-warpgroup
 *       overlap), and the two consumers take turns to issue their GEMMs, so that one's softmax runs during
 *       the other's GEMMs (ping-pong); O /= l;  lse = scale·m + ln l;  O goes out through shared memory (the
 * warpgroup's rows of Q_i).
 *
 * Shared memory (each tile in 64-column halves of rows of 128 bytes, 128-byte swizzle as TMA writes it and
 * wgmma reads it; all tiles start on 1024-byte boundaries):
 *   sQ [D/64][Br][64]            Q_i; at the end each consumer stages its O rows in its own rows
 *   sK [STAGES][D/64][Bc][64]    K_j ring
 *   sV [STAGES][D/64][Bc][64]    V_j ring
 *   mbarriers: q_full, full_k[STAGES], full_v[STAGES], empty_k[STAGES], empty_v[STAGES]
 *
 * Shapes: q, o [b, sq, hq, d]; k, v [b, sk, hkv, d] (strides that TMA accepts: 16-byte aligned base and
 * strides); lse [b, hq, sq] or [hq, total_q] (varlen). d ≤ 64 runs as D = 64, d ≤ 128 as D = 128, d ≤ 256 as
 * D = 256 with Bc = 80: the copy engine fills the columns past d with zeros. v and o may have a head dim of their own
 * (fc_hp_dv_pair): 192/128 runs this kernel with D = 192 and DV = 128 (V_j's tile, P·V_j, O), the other pairs the
 * kernels of the larger head dim with zero columns. This one-tile kernel runs at D = 128 with
 * a causal-like mask from seqlen_k 8192 and at D = 256 with any mask; everything else runs hopper/fwd_persistent.cuh's
 * kernel (fc_hp_fwd_plan says which, and what lost to each choice). The kernels and their launches are
 * hopper/fwd_launch.cuh's; this file holds the plan and the plain kernels' instantiations. */
#include "hopper/fwd_launch.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 in the sm_90a image of this file, 0 in the others: tells the host whether the kernels it would launch on
 * this device have bodies. */
__constant__ int fc_hopper_built_for_sm90a = FC_HOPPER_ARCH;

/* FLASHC_HOPPER=0 hides the backend (auto then takes cuda-mma): a switch for comparisons and bisection. */
static bool hopper_enabled(void) {
  const char *e = getenv("FLASHC_HOPPER");
  return !(e && strcmp(e, "0") == 0);
}

/* Can o take the TMA store? A dense problem (varlen rows past one sequence are the next one's, which TMA's
 * clipping would not spare) and a view TMA can address (the conditions fc_hp_check_view puts on q, k, v). A
 * question, not a refusal: no fc_error, the persistent kernel's direct stores take any o. */
static bool fc_hp_o_tma_ok(const fc_problem *p) {
  if (p->cu_seqlens_q || (uintptr_t)p->o.data % 16 != 0) return false;
  const fc_hp_map_shape s = fc_hp_shape(p, &p->o, true);
  for (int d = 1; d < 4; d++)
    if (s.stride[d] % 8 != 0 || s.stride[d] >= ((int64_t)1 << 39) || s.size[d] > INT32_MAX) return false;
  return true;
}

/* V's head dim of its own (flashc_params.head_dim_v ≠ head_dim): the pairs cuda-hopper runs, by the ranges of head
 * dims that its tiles round up to (fc_hp_d_tile: 64, 128, 256), in both directions (the backward runs every pair at
 * the larger head dim's tile with zero columns: hopper/bwd.cu). 192/128 (DeepSeek-V2/V3's MLA) has a forward kernel of
 * its own (fc_hp_fwd_plan_of); 128/64, 64/128 and 64/256 run the forward's kernels of the larger head dim. */
typedef enum {
  FC_HP_DV_NONE = -1, /* head_dim_v = head_dim, or a pair that is not built */
  FC_HP_DV_192_128,   /* head_dim 129..192, head_dim_v 65..128 */
  FC_HP_DV_128_64,    /* head_dim 65..128, head_dim_v 1..64 */
  FC_HP_DV_64_128,    /* head_dim 1..64, head_dim_v 65..128 */
  FC_HP_DV_64_256,    /* head_dim 1..64, head_dim_v 129..256 */
} fc_hp_dv_pair_id;
static fc_hp_dv_pair_id fc_hp_dv_pair(const fc_problem *p) {
  const int64_t d = p->head_dim, dv = p->head_dim_v;
  if (d == dv) return FC_HP_DV_NONE;
  if (d > 128 && d <= 192 && dv > 64 && dv <= 128) return FC_HP_DV_192_128;
  if (d > 64 && d <= 128 && dv <= 64) return FC_HP_DV_128_64;
  if (d <= 64 && dv > 64 && dv <= 128) return FC_HP_DV_64_128;
  if (d <= 64 && dv > 128 && dv <= 256) return FC_HP_DV_64_256;
  return FC_HP_DV_NONE;
}

/* The forward's plan for one call: the kernel, its tile, the persistent kernel's order and split. What it picks
 * measured fastest on the H100 (and the H200 at D = 256); each losing alternative is named beside the choice with
 * what it measured against it, and docs/experiments.md keeps the alternatives that were deleted. */
static fc_hp_fwd_plan fc_hp_fwd_plan_of(const fc_problem *p) {
  const bool tri = fc_hp_triangular(p), unmasked = p->window_left < 0 && p->window_right < 0;
  const bool varlen = p->cu_seqlens_q || p->cu_seqlens_k;
  fc_hp_fwd_plan pl;
  /* V's head dim of its own (fc_hp_dv_pair): 192/128 runs the one-tile kernel at D = 192, DV = 128 (12 k-steps of
   * S = Q_i·K_jᵀ, O of 128 columns: O 64 + S 64 + P 32 registers as at D = 128, Bc = 128, 2 stages, 208 KB), not the
   * D = 256 tile, whose zero columns would add a third to S's tensor work and double P·V's, at Bc = 80. The
   * persistent kernel is not built for it: its second Q slot and sO do not fit beside D = 192's tiles. Not measured
   * yet. The other pairs run at the larger head dim's tile, the smaller one's columns TMA's zeros. */
  pl.d = fc_hp_d_tile(p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v);
  pl.dv = pl.d;
  if (fc_hp_dv_pair(p) == FC_HP_DV_192_128) {
    pl.persistent = false, pl.d = 192, pl.dv = 128, pl.nc = 2, pl.bc = FC_HP_BC;
    pl.tma_store = false, pl.order = FC_HP_SCHED_STRIDE, pl.split = false;
    return pl;
  }
  if (pl.d == 64)
    /* tmastore3 (persistent, 3 consumers, Br = 192), any mask: unmasked +2..17 % over 2 consumers (tmastore) and even
     * with the one-tile kernel with 3 consumers (pingpong3) at 4k–16k (configs/hopper-fwd-tmastore3.txt); causal
     * +1..11 % over pingpong3 at 4k–16k (configs/hopper-fwd-sched.txt) and, with the mask shortcuts, +9..17 % over
     * tmastore at 512–16k (configs/hopper-fwd-mask-shortcuts-2026-11-23.txt, steady state, bf16). */
    pl.persistent = true;
  else if (pl.d == 128)
    /* tmastore (persistent, 2 consumers) except causal-like from seqlen_k 8192, where the one-tile ping-pong kernel
     * (pingpong) wins. Unmasked, tmastore over pingpong: +1..6 % up to 1k (configs/hopper-fwd-dynsched.txt), +1..3 %
     * steady at 2k–4k once the L2 groups were dropped for unmasked attention (configs/hopper-fwd-l2-groups-2026-11-23
     * .txt), +1.4 % at 8k and +0.9 % at 16k with the split rounds (configs/hopper-fwd-d128-tmastore-2026-11-24.txt);
     * causal below 8k +5..9 % at 512–4k with the dynamic order (configs/hopper-fwd-dynsched.txt). */
    pl.persistent = !tri || p->seqlen_k < 8192;
  else
    /* D = 256: persistent (one Q slot, no sO: O stored from registers) without a mask, +6 % over pingpong at 1k (whole
     * tiles), +2 % at 2k–8k; with a causal mask it stayed 2 % under pingpong (dynamic order; stride lost 30 % to
     * imbalance) (configs/hopper-fwd-d256-persistent-2026-11-29.txt, H200, bf16). */
    pl.persistent = unmasked;
  pl.nc = pl.d == 64 ? 3 : 2;
  pl.bc = pl.d == 256 ? FC_HP_BC_D256 : FC_HP_BC; /* Bc = 80 at D = 256: O 128 + S 40 + 2 P 20 registers */
  /* The TMA store where o allows it (fc_hp_o_tma_ok; the direct stores take any o, varlen's among them), at D ≤ 128:
   * D = 256 has no sO to store from. Direct stores from sO: +0.4..−5 % (configs/hopper-fwd-variants.txt). */
  pl.tma_store = pl.persistent && pl.d <= 128 && fc_hp_o_tma_ok(p);
  /* Dropout: the persistent kernel at D = 64, and at D = 128 where it stores O by TMA; else the one-tile kernel (with
   * the keep bits the persistent kernel's other forms spilled 344 bytes, D = 128 without the TMA store, and 132, D =
   * 256, where the one-tile kernel spills 16 and 84: fc_hp_forward_kernels). */
  if (p->dropout_p > 0.0f && pl.d > 64 && !pl.tma_store) pl.persistent = false;
  /* Dynamic where the tiles' weights differ (a triangular mask) and at D = 128 up to seqlen_k 1024 unmasked, stride
   * elsewhere. Causal, snake1 (a snake over one L2 group of all pairs) vs stride: tmastore3 +6..18 % at 2k–16k,
   * D = 128 +1..21 % at 4k–16k, −19..−22 % at 1k–2k (configs/hopper-fwd-sched.txt); dynamic balances like snake1 and
   * keeps the L2 groups: tmastore3 causal 2k +8 %, D = 128 causal 512–4k +5..9 %, unmasked 512 +6 %
   * (configs/hopper-fwd-dynsched.txt); in the steady state under the power cap snake1 ends 2–10 % behind dynamic (3–10
   * % more energy per FLOP: it gives up the L2 groups; configs/hopper-fwd-l2-groups-2026-11-23.txt). */
  pl.order = FC_HP_SCHED_STRIDE;
  if (pl.persistent && (((pl.nc == 3 || pl.d >= 128) && tri) || (pl.d == 128 && !tri && p->seqlen_k <= 1024)))
    pl.order = FC_HP_SCHED_DYNAMIC;
  /* A boolean attn_mask: dynamic too, its tiles weigh what the mask keeps of them (a padding mask: each sequence's
   * length), as a triangular mask's do. Not measured against stride yet. */
  if (pl.persistent && p->attn_mask && p->attn_mask_is_bool) pl.order = FC_HP_SCHED_DYNAMIC;
  /* The split last rounds where every tile weighs the same (no mask, no varlen, the stride order) and two consumers
   * run, except at D = 256 below 4096 keys, where the fix-up (each consumer's 64 × 256 fp32 partial through global
   * memory) costs more than the partial round it saves: against whole tiles −7 % at 512 keys, −3.6 % at 1k, −0.5 % at
   * 2k, +0.7 % at 4k, +1.3 % at 8k (configs/hopper-fwd-d256-persistent-2026-11-29.txt). At D ≤ 128 it measured faster
   * at every seqlen it runs at (configs/hopper-split-2026-11-23.txt, hopper-fwd-d128-tmastore-2026-11-24.txt). */
  pl.split = pl.persistent && pl.nc == 2 && pl.order == FC_HP_SCHED_STRIDE && unmasked && !p->attn_mask && !varlen &&
             (pl.d <= 128 || p->seqlen_k >= 4096);
  return pl;
}

static bool hopper_usable(char *why, size_t len) {
  if (!hopper_enabled()) {
    if (why) snprintf(why, len, "disabled by FLASHC_HOPPER=0");
    return false;
  }
  if (!fc_cuda_usable_sm(90, why, len)) return false;
  fc_device_props props;
  if (fc_device_get_props(&props) != FLASHC_OK) {
    if (why) snprintf(why, len, "%s", flashc_last_error());
    return false;
  }
  if (props.sm != 90) { /* sm_90a code runs on compute capability 9.0 only */
    if (why)
      snprintf(why, len, "device %d is sm_%d; backend cuda-hopper runs on sm_90 (H100, H200) only", props.device,
               props.sm);
    return false;
  }
  /* Whether the device code loaded for this device is sm_90a's: asked once per device. The copy from the symbol is
   * synchronous (it waits for all the device's queued work), and `usable` runs at every call (auto asks cuda-hopper
   * first): asked at every call, it cost ~20 µs of an idle GPU before the kernel's launch and no host run-ahead
   * (bench/results/configs/hopper-usable-sync-2026-11-24.txt). */
  enum { MAX_DEVICES = 64 };
  static int built_on[MAX_DEVICES]; /* 0 unknown, 1 sm_90a code, −1 none */
  const int dev = props.device;
  int built = dev >= 0 && dev < MAX_DEVICES ? __atomic_load_n(&built_on[dev], __ATOMIC_RELAXED) : 0;
  if (built == 0) { /* threads racing here all copy the same flag */
    int flag = 0;
    built = cudaMemcpyFromSymbol(&flag, fc_hopper_built_for_sm90a, sizeof flag) == cudaSuccess && flag ? 1 : -1;
    if (built < 0) cudaGetLastError();
    if (dev >= 0 && dev < MAX_DEVICES) __atomic_store_n(&built_on[dev], built, __ATOMIC_RELAXED);
  }
  if (built < 0) {
    if (why) snprintf(why, len, "this libflashc was built without sm_90a code (add 90a to FLASHC_CUDA_ARCHITECTURES)");
    return false;
  }
  return true;
}

static flashc_status hopper_supports(const fc_problem *p) {
  /* Both directions run head dims up to 256 (the backward's D = 64, 128, 256 kernels); auto takes cuda-mma's
   * backward for what fc_hopper_bwd_supports refuses (deterministic mode past 128). */
  const int max_head_dim = 256;
  if (p->is_backward) FC_CHECK(fc_hopper_bwd_supports(p));
  if (p->head_dim > max_head_dim)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds %d on backend cuda-hopper%s", (long long)p->head_dim,
                    max_head_dim, p->is_backward ? " (backward)" : "");
  if (p->scale < 0.0f)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "scale %g is negative; backend cuda-hopper needs a positive scale",
                    (double)p->scale);
  if (p->heads_q > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_q %lld exceeds 2^31-1 on backend cuda-hopper",
                    (long long)p->heads_q);
  int grid = 0;
  FC_CHECK(fc_mma_grid("cuda-hopper", fc_cdiv(p->seqlen_q, FC_HP_BR), p->heads_q, p->batch, &grid));
  if (!p->is_backward && p->handle && !p->handle->fixed) {
    /* auto: a forward whose query tiles would fill at most a quarter of the GPU's slots runs faster as cuda-mma's
     * split keys (mma/fwd_split.cuh: decoding, a few heads) than as one long tile per CTA here. */
    int splits = 1;
    if (fc_mma_fwd_splits(p, &splits) == FLASHC_OK && splits >= 4)
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "flashc_forward: %d query tiles are too few for cuda-hopper under auto (cuda-mma splits the keys "
                      "%d ways)",
                      grid, splits);
  }
  /* V's head dim of its own: the pairs of fc_hp_dv_pair, in both directions alike (so that the calls a forward takes
   * are those its backward takes), without the score modifiers (their kernels are built for head_dim_v = head_dim) */
  if (p->head_dim_v != p->head_dim) {
    const char *op = p->is_backward ? "flashc_backward" : "flashc_forward";
    if (fc_hp_dv_pair(p) == FC_HP_DV_NONE)
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "%s: head_dim_v %lld with head_dim %lld is not supported on backend cuda-hopper (its pairs: "
                      "head_dim 129..192 with head_dim_v 65..128, head_dim 65..128 with head_dim_v 1..64, head_dim "
                      "1..64 with head_dim_v 65..256)",
                      op, (long long)p->head_dim_v, (long long)p->head_dim);
    if (p->softcap > 0.0f || p->alibi_slopes != NULL || p->dropout_p > 0.0f || p->attn_mask != NULL)
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "%s: head_dim_v %lld (with head_dim %lld) together with softcap, ALiBi, dropout or attn_mask is "
                      "not supported on backend cuda-hopper",
                      op, (long long)p->head_dim_v, (long long)p->head_dim);
  }
  FC_CHECK(fc_score_mod_check(p, "cuda-hopper"));
  FC_CHECK(fc_hp_check_view(p, &p->q, true, "q"));
  FC_CHECK(fc_hp_check_view(p, &p->k, false, "k"));
  FC_CHECK(fc_hp_check_view(p, &p->v, false, "v"));
  return FLASHC_OK;
}

static flashc_status hopper_forward(const fc_problem *p) {
  const fc_hp_fwd_plan pl = fc_hp_fwd_plan_of(p);
  const int br = 64 * pl.nc;
  const int m_blocks = (int)fc_cdiv(p->seqlen_q, br);
  int grid = 0;
  FC_CHECK(fc_mma_grid("flashc_forward", m_blocks, p->heads_q, p->batch, &grid));
  CUtensorMap maps[3];
  FC_CHECK(fc_hp_encode_box(p, &p->q, true, "q", br, "flashc_forward", &maps[0]));     /* the Q box: one query block */
  FC_CHECK(fc_hp_encode_box(p, &p->k, false, "k", pl.bc, "flashc_forward", &maps[1])); /* K, V: one key block */
  FC_CHECK(fc_hp_encode_box(p, &p->v, false, "v", pl.bc, "flashc_forward", &maps[2]));
  /* The dynamic order's claim counter lives in the workspace, after the varlen offsets, then the split's partials,
   * then a boolean attn_mask's tiles (each part a multiple of 256 bytes: the next one starts aligned). */
  /* seqused: the sequences' own tensor maps (fc_hp_seq_maps) right after the offsets, where the kernels' int reaches
   * them from cu_q (the workspace's start: fc_mma_upload_cu_seqlens) */
  const size_t offs_bytes = fc_mma_cu_seqlens_bytes(p), maps_bytes = (fc_hp_seq_maps_bytes(p) + 255) / 256 * 256;
  const size_t cu_bytes = offs_bytes + maps_bytes,
               claim_bytes = pl.order == FC_HP_SCHED_DYNAMIC ? FC_HP_CLAIM_BYTES : 0;
  size_t split_bytes = 0;
  fc_device_props props;
  if (pl.split) {
    FC_CHECK(fc_device_get_props(&props));
    split_bytes = fc_hp_split_part_bytes(props.num_sms, pl.d);
  }
  /* The tiles at the kernels' blocks: FC_HP_MASK_BM rows (one consumer warpgroup) × Bc keys (hopper/score_mod.cuh). */
  const size_t tiles_bytes = fc_mask_tiles_bytes(p, FC_HP_MASK_BM, pl.bc);
  void *ws = NULL;
  FC_CHECK(fc_device_workspace(p, cu_bytes + claim_bytes + split_bytes + tiles_bytes, &ws));
  int32_t *claim = pl.order == FC_HP_SCHED_DYNAMIC ? (int32_t *)((uint8_t *)ws + cu_bytes) : NULL;
  fc_hp_split_mem split_mem = {NULL, NULL}, *split = NULL;
  if (split_bytes) {
    void *flags = NULL;
    FC_CHECK(fc_device_zeroed(p, (size_t)props.num_sms * 2 * sizeof(int32_t), &flags));
    split_mem.part = (float *)((uint8_t *)ws + cu_bytes + claim_bytes);
    split_mem.flags = (int32_t *)flags;
    split = &split_mem;
  }
  fc_hopper_fwd_args a;
  memset(&a, 0, sizeof a);
  fc_mma_seqs seqs;
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, NULL, &seqs));
  a.cu_q = seqs.cu_q, a.cu_k = seqs.cu_k, a.end_q = seqs.end_q, a.end_k = seqs.end_k;
  a.o = (uint16_t *)p->o.data;
  a.lse = p->lse;
  a.o_sb = p->o.stride_b, a.o_ss = p->o.stride_s, a.o_sh = p->o.stride_h;
  a.seqlen_q = (int)p->seqlen_q;
  a.seqlen_k = (int)p->seqlen_k;
  a.total_q = p->total_q;
  a.heads_q = (int)p->heads_q;
  a.group = (int)(p->heads_q / p->heads_kv);
  a.head_dim = (int)p->head_dim_v; /* O's columns */
  a.m_blocks = m_blocks;
  a.scale = p->scale;
  a.scale_log2 = p->scale * 1.4426950408889634f;
  a.window_left = p->window_left;
  a.window_right = p->window_right;
  a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  a.o_aligned = fc_mma_view_aligned(&p->o);
  /* The mask shortcuts, the same bits as without them. Each consumer warpgroup stops at its own last visible key block
   * (fc_hp_own_blocks); with a causal-like mask the persistent kernel's query blocks end at the sequence's last row
   * (fc_hp_tile_setup; without one every block weighs the same). Both off: tmastore3 −9..−17 % causal at 512–16k
   * (configs/hopper-fwd-mask-shortcuts-2026-11-23.txt). Two Q slots: the persistent kernel loads the next tile's Q
   * during this one's last blocks; one slot, after the last S: no measurable change, kept so that the tile boundary
   * never waits for Q (configs/hopper-fwd-tile-boundary-2026-11-23.txt). */
  a.own_blocks = 1;
  a.align_end = fc_hp_triangular(p);
  a.q_slots = 2;
  FC_CHECK(fc_hp_seq_maps(p, br, pl.bc, "flashc_forward", ws, offs_bytes, &a.seq_maps_at));
  /* Softcap, ALiBi, dropout or attn_mask: the same plan's kernels built with SCORE_MOD (hopper/score_mod.cuh), one
   * variant each; cuda-mma's modifiers (bias_pair: the mask's pairs of keys as one load), with its k_in = |scale| =
   * scale here (hopper_supports refuses a negative one). A boolean mask's tiles are built on the call's stream
   * first. */
  fc_score_mod md;
  const bool mod = fc_mma_score_mod_of(p, &md);
  if (tiles_bytes)
    FC_CHECK(
        fc_mask_tiles_build(p, FC_HP_MASK_BM, pl.bc, (uint8_t *)ws + cu_bytes + claim_bytes + split_bytes, &md.tiles));
  if (md.drop_on) return fc_hp_forward_dropout(p, maps, &a, &md, &pl, claim, split, grid);
  if (mod) return fc_hp_forward_score_mod(p, maps, &a, &md, &pl, claim, split, grid);
  return fc_hp_forward_dtype<false>(p, maps, &a, &md, &pl, claim, split, grid);
}

#if FC_HP_TRACE
/* fc_hopper_trace_reset, fc_hopper_trace_read (tools/hopper/trace.py): the buffer of this file's kernels, the plain
 * ones; the score-modifier and dropout kernels (fwd_score_mod.cu, fwd_dropout.cu) mark their own file's copy of
 * fc_hp_trace_buf, which nothing reads */
FC_HP_TRACE_READERS(fc_hopper)
#endif

extern "C" const fc_backend fc_backend_cuda_hopper = {
    "cuda-hopper",
    "FlashAttention-3 style forward: TMA, wgmma, warp-specialised producer/consumers, mbarrier ring "
    "(sm_90a); the backward likewise",
    FLASHC_DEVICE_CUDA,
    (1u << FLASHC_F16) | (1u << FLASHC_BF16),
    1,
    256, /* the backward too */
    hopper_usable,
    hopper_supports,
    hopper_forward,
    fc_hopper_backward,
    FC_FEATURE_SOFTCAP | FC_FEATURE_ALIBI | FC_FEATURE_HEAD_DIM_V | FC_FEATURE_ATTN_MASK | FC_FEATURE_SEQUSED |
        FC_FEATURE_DROPOUT | FC_FEATURE_CU_SEQLENS_DEVICE, /* features (common/score_mod.cuh; seqused: hopper/tma.cuh,
                                                            * fc_hp_seq_maps; dbias, and dropout's backward at D = 256
                                                            * or with a float attn_mask: fc_hopper_bwd_supports refuses
                                                            * them); validate.c refuses the others */
    0,                       /* max_head_dim_v: max_head_dim; hopper_supports refuses the pairs fc_hp_dv_pair has not */
    fc_cuda_forward_kvcache, /* forward_kvcache: mma/decode.cu */
};

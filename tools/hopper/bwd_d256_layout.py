"""Host-side checks of the index arithmetic of cuda-hopper's head-dim-256 backward (src/cuda/hopper/bwd_d256.cuh),
which nothing but a GPU can run: every formula below is copied from the kernel and compared with an independent
statement of what it must be (the PTX ISA's canonical 128-byte-swizzled layouts, the TMA box, the blocked dQ sum).

    python3 tools/hopper/bwd_d256_layout.py        (prints one line per check, exits 1 on a failure)

Checked:
  1. the shared-memory map (alignment, FC_HPB256_SMEM, the 227 KB limit);
  2. the Pᵀ/dSᵀ stores of both warpgroups (fc_hpb256_store_half): every (key, query) once, where dV's/dK's K-major A
     (sP, sdS read as Pᵀ, dSᵀ) and dQ's MN-major A (sdS read as dS) read it;
  3. the operands read from the TMA tiles: Sᵀ/dPᵀ (A = K_j/V_j, B = the warpgroup's 32 rows of Q_i/dO_i, K-major),
     dK/dV (B = columns 128c .. of Q_i/dO_i, MN-major, N = 128 over two halves), dQ (B = K_j columns 128c + 64h ..);
  4. the dQ tiles (fc_hpb_dq_tile_add<64>) at fc_bwd_dq_blocked_index's place with ld = 256, w = 64;
  5. the epilogue's staging of dK/dV (writes vs fc_hpb_store_tile<128>'s reads);
  6. fc_hpb_query_blocks<64, 64> and the kernel's whole-block test (keys k0 .. k0 + 63 × the warpgroup's 32 queries)
     against brute force over random masks;
  7. the pair 192/128 (NQ = 3, NV = 2): its shared-memory map (fc_hpb256_smem(3, 2)), the warpgroups' shares of dV
     (N = 64), dK (2 + 1 halves) and dQ (1 + 2 halves) covering every column once from the right TMA columns, the
     dQ tiles' places, and its epilogue's staging (128 + 64 and 64 + 64 columns) inside the Q ring.
The stores of 2. are those of the order that split Sᵀ, dPᵀ by queries (32 per warpgroup, fc_hpb256_store_half;
its code is at commit d79fa1c); the kernel today (WHOLE) is checked against them: warpgroup 0's store of all 64
queries (fc_hpb256_store_ps<T, 64>) at the same addresses as the split stores (so the A operands of 2. read
it), warpgroup 1's read-back (fc_hpb256_ds_whole) of each thread's own fragment, Sᵀ/dPᵀ's B = all 64 rows
(fc_hpb256_s_chain<T, 64>), the whole-block test at 64 queries.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_common import check, fails, query_blocks, swz, threads, visible, whole_but_masked  # noqa: E402

ROW, D, BR, BC, QS, DQ_TILE, W = 128, 256, 64, 64, 32, 64, 64
HALF = 64 * ROW
TILE = D // 64 * HALF
PS = 64 * ROW
DQ_TILE_BYTES = DQ_TILE * W * 4
ROWS = BR * 4


def k_major_addr(start, m, k, sbo=1024):
    """Canonical K-major 128B-swizzle layout: row m (8-row groups sbo apart), 16-bit element k of the k-step."""
    return swz(start + (m % 8) * ROW + (m // 8) * sbo + 2 * k)


def mn_major_addr(start, m, k, lbo, sbo=1024):
    """Canonical MN-major 128B-swizzle layout: m contiguous (64 per 128-byte row, 64-wide blocks lbo apart), k-rows
    128 bytes apart in 8-row groups sbo apart."""
    return swz(start + 2 * (m % 64) + (m // 64) * lbo + (k % 8) * ROW + (k // 8) * sbo)


def tma(tile, row, col):
    """Element (row, col) of a TMA box of 64-column halves (64 rows each here), 128-byte swizzle."""
    return swz(tile + (col // 64) * HALF + row * ROW + 2 * (col % 64))


# ---- 1. shared memory (the kernel's map) ------------------------------------------------------------------
sK = 0
sV = sK + TILE
sQ = sV + TILE
sdO = sQ + 2 * TILE
sPS = sdO + TILE
sdQ = sPS + 4 * PS
sLse = sdQ + 2 * DQ_TILE_BYTES
sDsum = sLse + 2 * ROWS
bars = sDsum + ROWS
end = bars + 7 * 8
SMEM = 5 * TILE + 4 * PS + 2 * DQ_TILE_BYTES + 3 * ROWS + 7 * 8 + 1024  # FC_HPB256_SMEM
tiles = [sK, sV, sQ, sQ + TILE, sdO] + [sPS + i * PS for i in range(4)]
check("smem: swizzled tiles 1024-byte aligned", all(x % 1024 == 0 for x in tiles))
check("smem: sdQ tiles, lse2/D rows 16-byte aligned, barriers 8", sdQ % 16 == 0 and sLse % 16 == 0 and
      sDsum % 16 == 0 and bars % 8 == 0)
check("smem: FC_HPB256_SMEM = the map + 1024 slack", SMEM == end + 1024, f"{SMEM} vs {end + 1024}")
check("smem: <= 232448 bytes", SMEM <= 232448, f"{SMEM} bytes")
check("epilogue: the Q ring holds 2 warpgroups x (dK, dV) of 64 x 128 x 2 bytes", 2 * TILE >= 4 * 64 * 128 * 2)
check("stage bytes announced = what TMA and the bulk copies deliver", TILE + ROWS == 4 * 64 * 64 * 2 + 64 * 4)

# ---- 2. Pᵀ/dSᵀ stores vs the A operands ----------------------------------------------------------------------
for buf in range(2):
    sP = sPS + buf * 2 * PS
    written = {}
    for cw, warp, g, t in threads():
        for x in range(QS // 8):  # fc_hpb256_store_half: accumulators 4x + 2rh, + 1
            for rh in range(2):
                r = 16 * warp + g + 8 * rh
                addr = sP + r * ROW + (((4 * cw + x) ^ g) << 4) + 4 * t
                # Sᵀ accumulator 4x + 2rh + e: key row 16·warp + g + 8·rh, query column 8x + 2t + e of the
                # warpgroup's 32 (queries 32c ..)
                for e in range(2):
                    written[(r, QS * cw + 8 * x + 2 * t + e)] = addr + 2 * e
    check(f"sP[{buf}]: every (key, query) written once, inside the tile",
          len(written) == 64 * 64 and len(set(written.values())) == 64 * 64 and
          all(sP <= a < sP + PS for a in written.values()))
    bad = 0
    for kb in range(BR // 16):  # dV/dK A: K-major, start sP + 32·kb, m = key, k = query 16·kb + k
        for m in range(64):
            for k in range(16):
                if k_major_addr(sP + kb * 32, m, k) != written[(m, 16 * kb + k)]:
                    bad += 1
    check(f"sP[{buf}]/sdS: dV/dK's A (K-major, 4 k-steps) reads Pᵀ[key][query]", bad == 0, f"{bad} mismatches")
    bad = 0
    for kb in range(4):  # fc_hpb_dq: A = dS MN-major, m = query, k = key 16·kb + k, start + kb·2048
        for m in range(64):
            for k in range(16):
                if mn_major_addr(sP + kb * 16 * ROW, m, k, 64 * 128) != written[(16 * kb + k, m)]:
                    bad += 1
    check(f"sdS[{buf}]: dQ's A (MN-major) reads dS[query][key] = dSᵀ[key][query]", bad == 0, f"{bad} mismatches")

    # WHOLE: warpgroup 0 stores all 64 queries (N = 64, c = 0: chunk x of 8); warpgroup 1's thread (warp, g, t)
    # reads back, at fc_hpb256_ds_whole's address, the pair of its own dPᵀ accumulators 4x + 2rh, + 1
    whole_w, bad = {}, 0
    for _, warp, g, t in threads(0):
        for x in range(8):
            for rh in range(2):
                r = 16 * warp + g + 8 * rh
                for e in range(2):
                    whole_w[(r, 8 * x + 2 * t + e)] = sP + r * ROW + (((8 * 0 + x) ^ g) << 4) + 4 * t + 2 * e
    for _, warp, g, t in threads(1):
        for x in range(8):
            for rh in range(2):
                r = 16 * warp + g + 8 * rh
                rd = sP + r * ROW + ((x ^ g) << 4) + 4 * t
                bad += rd != whole_w[(r, 8 * x + 2 * t)] or rd + 2 != whole_w[(r, 8 * x + 2 * t + 1)]
    check(f"WHOLE sP[{buf}]: warpgroup 0's 64-query store = the split stores' map; warpgroup 1 reads its own pairs",
          whole_w == written and bad == 0, f"{bad} read mismatches")

# ---- 3. operands from the TMA tiles -----------------------------------------------------------------------------
bad = 0
q_tile = sQ + TILE  # stage 1
for cw in range(2):
    for kk in range(D // 16):  # fc_hpb256_s_chain: off = (kk / 4)·HALF + (kk % 4)·32
        off = (kk // 4) * HALF + (kk % 4) * 32
        for n in range(QS):  # B = rows 32c + n of Q_i
            for k in range(16):
                if k_major_addr(q_tile + QS * cw * ROW + off, n, k) != tma(q_tile, QS * cw + n, 16 * kk + k):
                    bad += 1
        for m in range(64):  # A = K_j rows (keys)
            for k in range(16):
                if k_major_addr(sK + off, m, k) != tma(sK, m, 16 * kk + k):
                    bad += 1
check("Sᵀ/dPᵀ: A = K_j (64 keys), B = the warpgroup's 32 rows of Q_i, both K-major", bad == 0, f"{bad} mismatches")
bad = 0
for kk in range(D // 16):  # WHOLE: fc_hpb256_s_chain<T, 64>(st, .., q_tile): B = all 64 rows, N = 64
    off = (kk // 4) * HALF + (kk % 4) * 32
    for n in range(64):
        for k in range(16):
            if k_major_addr(q_tile + off, n, k) != tma(q_tile, n, 16 * kk + k):
                bad += 1
check("WHOLE Sᵀ/dPᵀ: B = all 64 rows of Q_i/dO_i, K-major", bad == 0, f"{bad} mismatches")
bad = 0
for cw in range(2):
    for kb in range(BR // 16):  # fc_hpb256_kv_chain: B = q_tile + 2c·HALF + kb·2048, LBO = HALF, N = 128
        for k in range(16):
            for n in range(128):
                if mn_major_addr(q_tile + 2 * cw * HALF + kb * 16 * ROW, n, k, HALF) != \
                        tma(q_tile, 16 * kb + k, 128 * cw + n):
                    bad += 1
check("dK/dV B: columns 128c .. of Q_i/dO_i, MN-major, N = 128 (two halves)", bad == 0, f"{bad} mismatches")
bad = 0
for cw in range(2):
    for h in range(2):  # fc_hpb_dq(dq_h, sdS, sK + 2c·HALF (+ HALF)): B = K_j MN-major, N = 64 (one half)
        for kb in range(4):
            for k in range(16):
                for n in range(64):
                    if mn_major_addr(sK + (2 * cw + h) * HALF + kb * 16 * ROW, n, k, 128 * 128) != \
                            tma(sK, 16 * kb + k, 128 * cw + 64 * h + n):
                        bad += 1
check("dQ B: K_j columns 128c + 64h .., MN-major, 4 k-steps of 16 keys", bad == 0, f"{bad} mismatches")


# ---- 4. dQ tiles vs the blocked fp32 sum ------------------------------------------------------------------------
def blocked_index(hr, c, ld, w):  # fc_bwd_dq_blocked_index
    r, cc = hr % DQ_TILE, c % w
    return (hr - r) * ld + (c // w) * DQ_TILE * w + r * w + (((cc // 4) ^ ((2 * r) % (w // 4))) * 4) + cc % 4


off = {}  # fc_hpb_dq_tile_add<64, 64>: float offset of (row, column) in the warpgroup's tile
for _, warp, g, t in threads():
    for x in range(64 // 8):
        for rh in range(2):
            b = (16 * warp + g + 8 * rh) * (W * 4) + (((2 * x + (t >> 1)) ^ ((2 * g) % (W // 4))) << 4) + 8 * (t & 1)
            for e in range(2):
                off[(16 * warp + g + 8 * rh, 8 * x + 2 * t + e)] = b // 4 + e
check("dQ tile: every element once, inside the 16 KB tile", sorted(off.values()) == list(range(64 * 64)))
bad = 0
for hh, total_pad, pad0, q0 in ((0, 256, 0, 0), (3, 1024, 128, 384), (1, 384, 256, 64)):
    for cw in range(2):
        for h in range(2):
            dst = (hh * total_pad + pad0 + q0) * D + 2 * cw * DQ_TILE * W + h * DQ_TILE * W  # the kernel's dq_dst
            for (r, c), o in off.items():
                if dst + o != blocked_index(hh * total_pad + pad0 + q0 + r, 128 * cw + 64 * h + c, D, W):
                    bad += 1
check("dQ tiles: at fc_bwd_dq_blocked_index's place (ld 256, w 64), one contiguous bulk add each", bad == 0,
      f"{bad} mismatches")

# ---- 5. epilogue staging vs fc_hpb_store_tile<128> --------------------------------------------------------------
staged = {}
for cw, warp, g, t in threads():
    tk = sQ + cw * 2 * (64 * 128 * 2)
    for rh in range(2):
        r = 16 * warp + g + 8 * rh
        for x in range(16):  # accumulators 4x + 2rh, + 1: row r, columns 8x + 2t, + 1 of the warpgroup's 128
            a = tk + r * 256 + ((x ^ (r % 8)) << 4) + 4 * t
            for e in range(2):
                staged[(cw, r, 8 * x + 2 * t + e)] = a + 2 * e
read = {}
for cw in range(2):
    tk = sQ + cw * 2 * (64 * 128 * 2)
    for ct in range(128):
        for i in range(64 * 16 // 128):
            idx = i * 128 + ct
            r, ch = idx // 16, idx % 16
            for e in range(8):
                read[(cw, r, 8 * ch + e)] = tk + r * 2 * 128 + ((ch ^ (r % 8)) << 4) + 2 * e
check("epilogue: staged dK/dV elements are read back from the same place, each once",
      staged == read and len(set(staged.values())) == len(staged) == 2 * 64 * 128)
check("epilogue: dK tiles of both warpgroups and their dV tiles inside the Q ring",
      all(sQ <= a < sQ + 2 * TILE - 64 * 128 * 2 for a in staged.values()))


# ---- 6. query-block range and the whole-block test -------------------------------------------------------------
random.seed(1)
bad_range = bad_whole = 0
for _ in range(1500):
    sq, sk = random.randint(1, 400), random.randint(1, 400)
    wl = random.choice([-1, 0, 5, 40, 200])
    wr = random.choice([-1, 0, 7, 100])
    shift = random.choice([0, sk - sq]) + random.choice([0, 0, -30, 50])
    for k0 in range(0, sk, BC):
        begin, n = query_blocks(k0, sq, sk, shift, wl, wr, BR, BC)
        seen = {i // BR for i in range(sq) for j in range(k0, min(k0 + BC, sk)) if visible(i, j, shift, wl, wr)}
        if not seen <= set(range(begin, begin + n)) or (seen and (min(seen) != begin or max(seen) != begin + n - 1)):
            bad_range += 1
        for ib in range(begin, begin + n):
            # WHOLE: keys k0 .. k0 + 63 × all 64 queries of the block; then each warpgroup's 32 queries
            bad_whole += whole_but_masked(ib * BR, BR, k0, BC, sk, shift, wl, wr)
            bad_whole += sum(whole_but_masked(ib * BR + QS * cw, QS, k0, BC, sk, shift, wl, wr) for cw in range(2))
check("fc_hpb_query_blocks<64, 64>: exactly the query blocks that see a key of the block", bad_range == 0,
      f"{bad_range} key blocks wrong")
check("whole-block test: never true when some pair is masked", bad_whole == 0, f"{bad_whole} blocks wrong")


# ---- 7. the pair 192/128 (NQ = 3, NV = 2) -------------------------------------------------------------------------
NQ, NV = 3, 2
VH, KH0, KH1, QH0 = NV // 2, (NQ + 1) // 2, NQ // 2, NQ // 2
TQ, TV = NQ * HALF, NV * HALF
sK2, sV2 = 0, TQ
sQ2 = sV2 + TV
sdO2 = sQ2 + 2 * TQ
sPS2 = sdO2 + TV
sdQ2 = sPS2 + 4 * PS
end2 = sdQ2 + 2 * DQ_TILE_BYTES + 3 * ROWS + 7 * 8
smem2 = (3 * NQ + 2 * NV) * HALF + 4 * PS + 2 * DQ_TILE_BYTES + 3 * ROWS + 7 * 8 + 1024  # fc_hpb256_smem(3, 2)
check("192/128 smem: swizzled tiles 1024-byte aligned",
      all(x % 1024 == 0 for x in [sK2, sV2, sQ2, sQ2 + TQ, sdO2] + [sPS2 + i * PS for i in range(4)]))
check("192/128 smem: fc_hpb256_smem(3, 2) = the map + 1024 slack = 173880", smem2 == end2 + 1024 == 173880,
      f"{smem2} vs {end2 + 1024}")
check("192/128 stage bytes announced = what TMA delivers", (NQ * HALF + ROWS, NV * HALF + ROWS, (NQ + NV) * HALF) ==
      (NQ * 64 * 64 * 2 + 64 * 4, NV * 64 * 64 * 2 + 64 * 4, (NQ + NV) * 64 * 64 * 2))
cols = {"dV": [], "dK": [], "dQ": []}
bad = 0
for cw in range(2):
    # dV: fc_hpb256_kv_chain<T, 64·VH>(dv, sP, sdO + dv_cols), dv_cols = c·VH·HALF
    for kb in range(4):
        for k in range(16):
            for n in range(64 * VH):
                if mn_major_addr(sdO2 + cw * VH * HALF + kb * 16 * ROW, n, k, HALF) != \
                        tma(sdO2, 16 * kb + k, 64 * VH * cw + n):
                    bad += 1
    cols["dV"] += [64 * VH * cw + n for n in range(64 * VH)]
    # dK: warpgroup 0 N = 64·KH0 from q_tile, warpgroup 1 N = 64·KH1 from q_tile + KH0·HALF (dk_cols)
    nk, k0c = (64 * KH0, 0) if cw == 0 else (64 * KH1, 64 * KH0)
    for kb in range(4):
        for k in range(16):
            for n in range(nk):
                if mn_major_addr(sQ2 + cw * KH0 * HALF + kb * 16 * ROW, n, k, HALF) != tma(sQ2, 16 * kb + k, k0c + n):
                    bad += 1
    cols["dK"] += [k0c + n for n in range(nk)]
    # dQ: halves c·QH0 (+ 1 for warpgroup 1: dq_two), each N = 64 from sK + (c·QH0 + h)·HALF
    for h in range(1 if cw == 0 else 2):
        hf = cw * QH0 + h
        for kb in range(4):
            for k in range(16):
                for n in range(64):
                    if mn_major_addr(sK2 + hf * HALF + kb * 16 * ROW, n, k, 128 * 128) != tma(sK2, 16 * kb + k,
                                                                                         64 * hf + n):
                        bad += 1
        cols["dQ"] += [64 * hf + n for n in range(64)]
check("192/128 operands: dV (N = 64 per warpgroup), dK (2 + 1 halves), dQ (1 + 2 halves) read the right columns",
      bad == 0, f"{bad} mismatches")
check("192/128 shares: every column of dV (128), dK (192), dQ (192) once",
      sorted(cols["dV"]) == list(range(128)) and sorted(cols["dK"]) == list(range(192)) and
      sorted(cols["dQ"]) == list(range(192)))
check("192/128 dQ tiles: warpgroup c's first at tile c·QH0 of the row's four (ld 256)",
      [cw * QH0 for cw in range(2)] == [0, 1] and max(cols["dQ"]) < 256)
staged, read = {}, {}
for cw, warp, g, t in threads():
    tk = sQ2 + cw * (64 * 2) * (64 * KH0 + 64 * VH)
    wk = 64 * (KH0 if cw == 0 else KH1)
    tv = tk + (64 * 2) * wk
    for what, tile, w in (("k", tk, wk), ("v", tv, 64 * VH)):  # fc_hpb256_stage<T, W>
        for rh in range(2):
            r = 16 * warp + g + 8 * rh
            for x in range(w // 8):
                a = tile + r * 2 * w + ((x ^ (r % 8)) << 4) + 4 * t
                for e in range(2):
                    staged[(what, cw, r, 8 * x + 2 * t + e)] = a + 2 * e
for cw in range(2):
    tk = sQ2 + cw * (64 * 2) * (64 * KH0 + 64 * VH)
    wk = 64 * (KH0 if cw == 0 else KH1)
    for what, tile, w in (("k", tk, wk), ("v", tk + (64 * 2) * wk, 64 * VH)):  # fc_hpb_store_tile<W>
        ch_n = w // 8
        for ct in range(128):
            for i in range(64 * ch_n // 128):
                idx = i * 128 + ct
                r, ch = idx // ch_n, idx % ch_n
                for e in range(8):
                    read[(what, cw, r, 8 * ch + e)] = tile + r * 2 * w + ((ch ^ (r % 8)) << 4) + 2 * e
check("192/128 epilogue: staged dK/dV elements are read back from the same place, each once",
      staged == read and len(set(staged.values())) == len(staged) == 64 * (192 + 128))
check("192/128 epilogue: inside the Q ring (2 x 24 KB)", all(sQ2 <= a < sQ2 + 2 * TQ for a in staged.values()))

print(f"{len(fails)} failed" if fails else "all passed")
sys.exit(1 if fails else 0)

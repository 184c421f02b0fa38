"""Host-side checks of the index arithmetic of cuda-hopper's backward with Br = 128 query rows per block, which
nothing but a GPU can run: every formula below is copied from the kernel and compared with an independent statement
of what it must be. The formulas are those of the first kernel at Br = 128 (src/cuda/hopper/bwd.cu at commit
d79fa1c: its shared-memory map and hand-written dSᵀ stores are gone since); the A fragments, B operands, dQ tile and
query-block range are those the second kernel at D = 64 (src/cuda/hopper/bwd_kernel.cuh) still uses.

    python3 tools/hopper/bwd_br128_layout.py        (prints one line per check, exits 1 on a failure)

Checked:
  1. the shared-memory map (offsets, alignment, the launch's fc_hpb_smem_bytes, the 227 KB limit);
  2. the hand-written dSᵀ stores into sdS: every (key, query) once, in range, at the address that wgmma's
     MN-major 128-byte-swizzled A descriptor of dQ's M-tile reads (PTX ISA canonical layout, address swizzle);
  3. the Pᵀ/dSᵀ A fragments of dK/dV (packed from the m64n128 accumulators) against the A register layout;
  4. the B operands read from the TMA tiles of Q_i/dO_i (K-major for Sᵀ/dPᵀ, MN-major for dK/dV);
  5. the dQ tile in sdQ: every element once, at fc_bwd_dq_blocked_index's place, and one warpgroup's 64 × 64
     tile landing on one contiguous 16 KB range of the blocked sum (one bulk add);
  6. fc_hpb_query_blocks and the "whole block" test against brute force over random masks.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_common import check, fails, query_blocks, swz, threads, visible, whole_but_masked  # noqa: E402

ROW, BC, DQ_TILE = 128, 128, 64
# ---- 1. shared memory ---------------------------------------------------------------------------------------


def smem_bytes(d, stages, w, br):  # fc_hpb_smem_bytes
    return 2 * BC * d * 2 + stages * 2 * br * d * 2 + BC * br * 2 + 2 * br * w * 4 + stages * 2 * br * 4 + \
        8 * (1 + 2 * stages) + 1024


D, STAGES, BR = 64, 3, 128
NQ, DQ_W = D, D // 2
KV_BYTES, Q_BYTES, ROWS_BYTES = BC * D * 2, BR * D * 2, BR * 4
Q_HALF, DS_HALF, DS_BYTES, DQ_TILE_BYTES = BR * ROW, BC * ROW, BC * BR * 2, DQ_TILE * NQ * 4
sK = 0
sV = sK + KV_BYTES
sQ = sV + KV_BYTES
sdO = sQ + STAGES * Q_BYTES
sdS = sdO + STAGES * Q_BYTES
sdQ = sdS + DS_BYTES
sLD = sdQ + 2 * DQ_TILE_BYTES
bars = sLD + STAGES * 2 * ROWS_BYTES
end = bars + 8 * (1 + 2 * STAGES)
tiles = [sK, sV] + [sQ + s * Q_BYTES for s in range(STAGES)] + [sdO + s * Q_BYTES for s in range(STAGES)] + [sdS]
check("smem: swizzled tiles 1024-byte aligned", all(x % 1024 == 0 for x in tiles))
check("smem: sdQ tiles, lse2/D rows 16-byte aligned, barriers 8",
      sdQ % 16 == 0 and (sdQ + DQ_TILE_BYTES) % 16 == 0 and all((sLD + i * ROWS_BYTES) % 16 == 0
                                                                 for i in range(2 * STAGES)) and bars % 8 == 0)
check("smem: the launch's size = the kernel's map + 1024 slack", smem_bytes(D, STAGES, DQ_W, BR) == end + 1024,
      f"{smem_bytes(D, STAGES, DQ_W, BR)} vs {end + 1024}")
check("smem: <= 227 KB (232448 bytes)", end + 1024 <= 232448, f"{end + 1024} bytes")
check("smem: Br = 64 unchanged", smem_bytes(64, 3, 32, 64) == 2 * BC * 64 * 2 + 3 * 2 * 64 * 64 * 2 +
      BC * 64 * 2 + 2 * DQ_TILE * 32 * 4 + 3 * 2 * 64 * 4 + 8 * 7 + 1024)
check("stage bytes announced = what TMA and the bulk copies deliver", 2 * Q_BYTES + 2 * ROWS_BYTES ==
      2 * (D // 64) * (64 * 2 * BR) + 2 * BR * 4)

# ---- 2. dSᵀ stores vs the dQ A descriptor ------------------------------------------------------------------
written = {}
for cw, warp, g, t in threads():
    ds_rows = sdS + 64 * cw * ROW
    for x in range(BR // 8):
        for rh in range(2):
            r = 16 * warp + g + 8 * rh
            addr = ds_rows + (x // 8) * DS_HALF + r * ROW + (((x % 8) ^ g) << 4) + 4 * t
            key = 64 * cw + r
            for e in range(2):  # the two 16-bit values of the 32-bit word: queries 8x + 2t, + 1
                written[(key, 8 * x + 2 * t + e)] = addr + 2 * e
check("sdS: every (key, query) written once", len(written) == BC * BR and len(set(written.values())) == BC * BR)
check("sdS: inside sdS", all(sdS <= a < sdS + DS_BYTES for a in written.values()))


def mn_major_addr(start, m, k, lbo, sbo):
    """Canonical MN-major 128B-swizzle layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 8 16-bit elements, in
    bytes, then the address swizzle."""
    return swz(start + 2 * (m % 64) + (m // 64) * lbo + (k % 8) * ROW + (k // 8) * sbo)


bad = 0
for cw in range(2):  # warpgroup cw: M-tile = queries 64·cw .., fc_hpb_dq(sdS + cw·DS_HALF) then + 64 key rows
    for call, key_base in ((0, 0), (1, 64)):
        a_base = sdS + cw * DS_HALF + call * 64 * ROW
        for kb in range(4):
            start = a_base + kb * 16 * ROW
            for m in range(64):
                for k in range(16):
                    if mn_major_addr(start, m, k, 64 * 128, 1024) != written[(key_base + 16 * kb + k, 64 * cw + m)]:
                        bad += 1
check("sdS: dQ's A (dS, MN-major) reads dS[query][key] where dSᵀ was written", bad == 0, f"{bad} mismatches")

# ---- 3. A fragments of dK/dV from the m64n128 accumulators ----------------------------------------------------
bad = 0
for _, warp, g, t in threads():
    acc = {}  # accumulator index -> (row, column) of the m64n128 fragment (PTX ISA wgmma D layout)
    for c in range(BR // 8):
        acc[4 * c + 0], acc[4 * c + 1] = (16 * warp + g, 8 * c + 2 * t), (16 * warp + g, 8 * c + 2 * t + 1)
        acc[4 * c + 2], acc[4 * c + 3] = (16 * warp + g + 8, 8 * c + 2 * t), (16 * warp + g + 8, 8 * c + 2 * t + 1)
    for kb in range(BR // 16):
        want = [(16 * warp + g, 2 * t), (16 * warp + g + 8, 2 * t), (16 * warp + g, 2 * t + 8),
                (16 * warp + g + 8, 2 * t + 8)]  # A's a[r], low half; the high half is column + 1
        for r in range(4):
            lo, hi = acc[8 * kb + 2 * r], acc[8 * kb + 2 * r + 1]  # pp[kb][r] = pack(st[8kb + 2r], st[8kb + 2r + 1])
            if lo != (want[r][0], 16 * kb + want[r][1]) or hi != (want[r][0], 16 * kb + want[r][1] + 1):
                bad += 1
check("Pᵀ/dSᵀ A fragments: k-step kb holds queries 16kb .. 16kb + 15", bad == 0, f"{bad} mismatches")
bad = 0
for _, warp, g, t in threads():  # the dSᵀ store reads dsp[x / 2][2·(x % 2) + rh] as accumulators 4x + 2rh, + 1
    for x in range(BR // 8):
        for rh in range(2):
            kb, r = x // 2, 2 * (x % 2) + rh
            if (8 * kb + 2 * r, 8 * kb + 2 * r + 1) != (4 * x + 2 * rh, 4 * x + 2 * rh + 1):
                bad += 1
check("dSᵀ store: dsp[x / 2][2(x % 2) + rh] = accumulators 4x + 2rh, + 1", bad == 0)

# ---- 4. B operands from the TMA tiles of Q_i, dO_i ----------------------------------------------------------
tma = lambda tile, row, col: swz(tile + row * ROW + 2 * col)  # noqa: E731  TMA box: rows of 128 B, 128B swizzle
bad = 0
q_tile = sQ + Q_BYTES  # stage 1
for kk in range(D // 16):  # Sᵀ: B = Q_i K-major ((8,n),(T,2k)):((8T,SBO),(1,T)), start 32·(kk % 4) into half kk / 4
    start = q_tile + (kk // 4) * Q_HALF + (kk % 4) * 32
    for n in range(BR):
        for k in range(16):
            if swz(start + (n % 8) * ROW + (n // 8) * 1024 + 2 * k) != tma(q_tile, n, 16 * kk + k):
                bad += 1
check("Sᵀ/dPᵀ B: Q_i/dO_i K-major, N = 128 rows", bad == 0, f"{bad} mismatches")
bad = 0
for kb in range(BR // 16):  # dK/dV: B = Q_i MN-major (k = query, n = column), start kb·2048, LBO = Q_HALF
    for k in range(16):
        for n in range(D):
            if mn_major_addr(q_tile + kb * 16 * ROW, n, k, Q_HALF, 1024) != tma(q_tile, 16 * kb + k, n):
                bad += 1
check("dK/dV B: Q_i/dO_i MN-major, 8 k-steps of 16 queries", bad == 0, f"{bad} mismatches")
bad = 0
for kb in range(4):  # dQ: B = K_j MN-major (k = key, n = column), k-step kb at kb·2048, then + 64 key rows
    for call in range(2):
        for k in range(16):
            for n in range(D):
                if mn_major_addr(sK + call * 64 * ROW + kb * 16 * ROW, n, k, BC * ROW, 1024) != \
                        tma(sK, 64 * call + 16 * kb + k, n):
                    bad += 1
check("dQ B: K_j MN-major, all 64 columns, 8 k-steps of 16 keys", bad == 0, f"{bad} mismatches")


# ---- 5. dQ tile vs the blocked fp32 sum ------------------------------------------------------------------------
def blocked_index(hr, c, ld, w):  # fc_bwd_dq_blocked_index
    r, cc = hr % DQ_TILE, c % w
    return (hr - r) * ld + (c // w) * DQ_TILE * w + r * w + (((cc // 4) ^ ((2 * r) % (w // 4))) * 4) + cc % 4


def tile_offsets(nq, w):  # fc_hpb_dq_tile_add<NQ, W>: float offset of (row, column) in one warpgroup's tile
    out = {}
    for _, warp, g, t in threads():
        for x in range(nq // 8):
            for rh in range(2):
                b = (x // (w // 8)) * (DQ_TILE * w * 4) + (16 * warp + g + 8 * rh) * (w * 4) + \
                    (((2 * (x % (w // 8)) + (t >> 1)) ^ ((2 * g) % (w // 4))) << 4) + 8 * (t & 1)
                assert b % 8 == 0
                for e in range(2):
                    out[(16 * warp + g + 8 * rh, 8 * x + 2 * t + e)] = b // 4 + e
    return out


for nq, w, ld, tag in ((64, 32, 64, "Br = 128 (64 rows x 64 cols, w 32)"), (32, 32, 64, "Br = 64, D = 64"),
                       (64, 64, 128, "Br = 64, D = 128")):
    off = tile_offsets(nq, w)
    check(f"dQ tile {tag}: every element once, inside the tile",
          len(off) == 64 * nq and sorted(off.values()) == list(range(64 * nq)))
    bad = 0
    for hh, total_pad, pad0, q0, cw in ((0, 256, 0, 0, 0), (3, 1024, 128, 384, 1), (1, 384, 256, 0, 1)):
        rowsplit = nq == ld
        row0 = 64 * cw if rowsplit else 0  # the kernel's row0, col0 and bulk-add destination (floats)
        col0 = 0 if rowsplit else nq * cw
        dst = (hh * total_pad + pad0 + q0 + row0) * ld + col0 * DQ_TILE
        # what the product holds: Br = 128, queries 64·cw .. (its A is half cw of sdS), all columns; Br = 64 split:
        # queries 0 .. 63, columns nq·cw .. (its B starts nq·cw columns into K_j)
        q_first, c_first = (64 * cw, 0) if rowsplit else (0, nq * cw)
        for (r, c), o in off.items():
            if dst + o != blocked_index(hh * total_pad + pad0 + q0 + q_first + r, c_first + c, ld, w):
                bad += 1
    check(f"dQ tile {tag}: at fc_bwd_dq_blocked_index's place (one contiguous bulk add)", bad == 0,
          f"{bad} mismatches")
pair = all(blocked_index(5, c + 1, 64, 32) == blocked_index(5, c, 64, 32) + 1 for c in range(0, 64, 2))
check("dQ tile: column pairs (8x + 2t, + 1) adjacent in the sum (st.shared.v2)", pair)


# ---- 6. query-block ranges and the whole-block test -------------------------------------------------------------


rng = random.Random(1)
bad_cover = bad_whole = bad_pad = 0
for _ in range(400):
    sq, sk = rng.randint(1, 700), rng.randint(1, 700)
    causal, br_align = rng.random() < 0.5, rng.random() < 0.5
    shift = (sk - sq if br_align else 0) + rng.choice([0, 0, 64, -37])
    wl, wr = (-1, 0) if causal else (rng.choice([-1, 20, 200]), rng.choice([-1, 5, 130]))
    for br in (64, 128):
        pad = (sq + 127) // 128 * 128
        for k0 in range(0, sk, BC):
            ib, n = query_blocks(k0, sq, sk, shift, wl, wr, br, BC)
            if n and (ib + n) * br > pad:
                bad_pad += 1  # a block past the sequence's padded rows
            for i in range(sq):
                for j in range(k0, min(k0 + BC, sk)):
                    if visible(i, j, shift, wl, wr) and not ib <= i // br < ib + n:
                        bad_cover += 1
            bad_whole += sum(whole_but_masked(blk * br, br, k0, BC, sk, shift, wl, wr) for blk in range(ib, ib + n))
check("query blocks: every visible (query, key) pair lies in a block the key block walks", bad_cover == 0,
      f"{bad_cover} pairs missed")
check("query blocks: no block past the padded rows (FC_BWD_ROWS_PAD = 128)", bad_pad == 0)
check("whole-block test: no mask needed when it says so", bad_whole == 0, f"{bad_whole} wrong")

print("all checks passed" if not fails else f"{len(fails)} FAILED: {fails}")
sys.exit(1 if fails else 0)

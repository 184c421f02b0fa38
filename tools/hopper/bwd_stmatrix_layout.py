"""Host-side check of the default backward kernel's dSᵀ stores (src/cuda/hopper/bwd_kernel.cuh, fc_hpb_lag_block, since
66f32af): one stmatrix.m8n8.x4 per j writes four 8 × 8 matrices of the packed dSᵀ fragments dsp[j][0..3], each
lane giving the address of one matrix row. Checked against an independent statement of where each fragment word
belongs (the kernel's 32-bit stores before 66f32af, which the dQ wgmma's MN-major A descriptor reads):

    python3 tools/hopper/bwd_stmatrix_layout.py        (prints one line per check, exits 1 on a failure)

stmatrix (PTX ISA, "stmatrix"): register i of lane 4g + t holds row g, columns 2t, 2t + 1 (two 16-bit values) of
matrix i; lane l supplies the address of row l % 8 of matrix l / 8. Br = 64 (D = 128) and Br = 128 (D = 64).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_common import check, fails, threads  # noqa: E402

ROW, BC = 128, 128
DS_HALF = BC * ROW  # one 64-query half of sdS (Br = 128); Br = 64 has one


def word_place(cw, warp, g, t, kb, i):
    """Where fragment word dsp[kb][i] of this thread belongs: key row r (a row of sdS), queries 8x + 2t, + 1 with
    x = 2·kb + i / 2 and r = 64·cw + 16·warp + g + 8·(i % 2) (the m64nBr accumulator layout, packed in pairs), in
    half x / 8, 16-byte chunk x % 8 swizzled by r % 8."""
    x, r = 2 * kb + i // 2, 64 * cw + 16 * warp + g + 8 * (i % 2)
    return (x // 8) * DS_HALF + r * ROW + (((x % 8) ^ (r % 8)) << 4) + 4 * t


def stmatrix_row_address(cw, warp, lane, j):  # the kernel's formula, lane l of the warp, store j
    mi, mr = lane // 8, lane % 8
    r = 64 * cw + 16 * warp + 8 * (mi % 2) + mr
    x = 2 * j + mi // 2
    return (x // 8) * DS_HALF + r * ROW + (((x % 8) ^ mr) << 4)


for br in (64, 128):
    wrong, seen = 0, set()
    for cw, warp, g, t in threads():
        for j in range(br // 16):
            for i in range(4):
                # stmatrix writes register i of lane 4g + t at row g of matrix i, whose address lane 8i + g gave
                got = stmatrix_row_address(cw, warp, 8 * i + g, j) + 4 * t
                wrong += got != word_place(cw, warp, g, t, j, i)
                seen.add(got)
    rows_addressed = all(stmatrix_row_address(cw, w, lane, j) % 16 == 0
                         for cw in range(2) for w in range(4) for lane in range(32) for j in range(br // 16))
    check(f"Br = {br}: every dSᵀ word where the dQ descriptor reads it", wrong == 0, f"{wrong} misplaced")
    check(f"Br = {br}: every 32-bit word of sdS's {2 * 64 * br * 2} bytes written once", len(seen) == 2 * 64 * br // 2)
    check(f"Br = {br}: row addresses 16-byte aligned", rows_addressed)
sys.exit(1 if fails else 0)

"""What the host-side layout checks of the cuda-hopper backward kernels share (bwd_br128_layout.py,
bwd_d256_layout.py, bwd_stmatrix_layout.py): the check recorder, the 128-byte swizzle, the consumer
threads' coordinates, and the kernels' mask arithmetic (the query blocks a key block walks, the whole-block test)."""
fails = []  # names of the failed checks, in order


def check(name, ok, info=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {info}" if info else ""))
    if not ok:
        fails.append(name)


def swz(addr):
    """128-byte swizzle of a byte address (tiles 1024-byte aligned): 16-byte chunk bits 4-6 ^= bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def threads(only=None):
    """(consumer warpgroup, warp, lane / 4, lane % 4) of every consumer thread, or of warpgroup `only`'s."""
    for cw in range(2) if only is None else (only,):
        for warp in range(4):
            for g in range(8):
                for t in range(4):
                    yield cw, warp, g, t


def visible(i, j, shift, wl, wr):  # fc_hpb_visible
    return (wl < 0 or j >= i + shift - wl) and (wr < 0 or j <= i + shift + wr)


def query_blocks(k0, sq, sk, shift, wl, wr, br, bc):  # fc_hpb_query_blocks<BR, BC>
    """(first, count) of the blocks of br queries that see a key of keys k0 .. k0 + bc - 1."""
    i_lo = 0 if wr < 0 else k0 - shift - wr
    i_hi = sq if wl < 0 else min(k0 + bc, sk) - 1 - shift + wl + 1
    i_lo, i_hi = max(i_lo, 0), min(i_hi, sq)
    begin = i_lo // br  # i_lo >= 0: C division
    return begin, ((i_hi + br - 1) // br - begin if i_lo < i_hi else 0)


def whole_but_masked(q0, rows, k0, bc, sk, shift, wl, wr):
    """Whether the kernels' whole-block test (src/cuda/hopper/bwd_launch.cuh: no mask needed for queries q0 ..
    q0 + rows - 1 against keys k0 .. k0 + bc - 1) passes although some pair is masked. It may miss a whole block (that
    costs only time), never this."""
    whole = k0 + bc <= sk and (wr < 0 or k0 + bc - 1 <= q0 + shift + wr) and \
        (wl < 0 or k0 >= q0 + rows - 1 + shift - wl)
    return whole and not all(visible(i, j, shift, wl, wr) for i in range(q0, q0 + rows) for j in range(k0, k0 + bc))

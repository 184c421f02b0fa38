"""What the host-side layout checks of the cuda-hopper backward kernels share (bwd_br128_layout.py,
bwd_d256_layout.py, bwd_v2_stmatrix_layout.py): the check recorder, the 128-byte swizzle and the consumer
threads' coordinates."""
fails = []  # names of the failed checks, in order


def check(name, ok, info=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {info}" if info else ""))
    if not ok:
        fails.append(name)


def swz(addr):
    """128-byte swizzle of a byte address (tiles 1024-byte aligned): 16-byte chunk bits 4-6 ^= bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def threads():
    """(consumer warpgroup, warp, lane / 4, lane % 4) of every consumer thread."""
    for cw in range(2):
        for warp in range(4):
            for g in range(8):
                for t in range(4):
                    yield cw, warp, g, t

"""How much of a one-CTA-per-tile grid's time the SMs sit idle, by the order its tiles are handed out: the list-
scheduling model behind src/cuda/common/tail_order.cuh (no GPU).

    python3 tools/profile/grid_order_model.py [--sms 132] [--ctas-per-sm 1] [--pass bwd|fwd] [--waves 1,2,3,4]
        [--mask causal|full]

The hardware hands a grid's CTAs out in blockIdx order, each to the first free slot (SMs x CTAs per SM): greedy
list scheduling. A tile costs `overhead` plus one unit per block it loops over; with a causal mask (top-left,
seqlen_q = seqlen_k) the tiles of one (sequence, head) pair differ: in the backward key block j of n sees n - j
query blocks (Bc / Br of them per key block), in the forward query block i sees i + 1 key blocks. The grids of
docs/targets.md: 16k tokens, width 2048 (b = 16384 / s, h = 2048 / d). Orders:
  pair   each pair's tiles together, heaviest first (the kernels before the tail order, 1874f51);
  tailW  the same, except the last W waves' pairs tile index by tile index (common/tail_order.cuh: W = 2);
  lpt    every tile by length, longest first (the model's best; spreads the CTAs at work over every pair: L2).
Prints the idle share of each: (makespan - ideal) / makespan, ideal = total work / slots. With --mask full every
tile has one length and the order cannot matter: the table shows what the last, partial round of tiles leaves idle,
beside "split": tiles cut at block boundaries so that every slot gets the same number of blocks (stream-K; the
combine of a cut tile's partial results not counted).
"""
import argparse
import heapq
import math

# (head dim, block the tile covers, block it loops over, overhead in loop units): the defaults of the kernels
BWD = {64: (128, 128, 2), 128: (128, 64, 2), 256: (64, 64, 2)}  # Bc, Br (cuda-hopper)
FWD = {64: (192, 128, 2), 128: (128, 128, 2), 256: (128, 80, 2)}  # Br, Bc (cuda-hopper; cuda-mma differs)


def makespan(costs, slots):
    free = [0.0] * slots
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c)
    return max(free)


def tile_costs(which, d, s, mask="causal"):
    own, other, overhead = (BWD if which == "bwd" else FWD)[d]
    n = math.ceil(s / own)
    if mask == "full":
        return [overhead + math.ceil(s / other)] * n
    if which == "bwd":  # key block j: query rows j·Bc .. s
        return [overhead + math.ceil((s - j * own) / other) for j in range(n)]
    # forward, heaviest first: query block i (from the end) sees keys 0 .. its last row
    return [overhead + math.ceil(min(s, (n - i) * own) / other) for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--ctas-per-sm", type=int, default=1)
    ap.add_argument("--pass", dest="which", choices=("bwd", "fwd"), default="bwd")
    ap.add_argument("--waves", default="1,2,3,4")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--mask", choices=("causal", "full"), default="causal")
    a = ap.parse_args()
    slots = a.sms * a.ctas_per_sm
    waves = [int(w) for w in a.waves.split(",")]
    print(f"idle share of the SMs' time, {a.which}, {a.mask}, {slots} slots ({a.sms} SMs x {a.ctas_per_sm})")
    if a.mask == "full":
        print(f"{'d':>4s} {'seqlen':>6s} {'tiles':>6s} {'rounds':>7s} {'pair':>7s} {'split':>7s}")
        for d in (64, 128, 256):
            for s in (int(x) for x in a.seqlens.split(",")):
                per_pair = tile_costs(a.which, d, s, "full")
                tiles = len(per_pair) * (16384 // s) * (2048 // d)
                work = per_pair[0] * tiles
                pair = 1 - work / slots / (math.ceil(tiles / slots) * per_pair[0])
                split = 1 - work / slots / math.ceil(work / slots)
                print(f"{d:4d} {s:6d} {tiles:6d} {tiles / slots:7.2f} {100 * pair:6.1f}% {100 * split:6.1f}%")
        return
    print(f"{'d':>4s} {'seqlen':>6s} {'tiles':>6s} {'pair':>7s} " + " ".join(f"{'tail' + str(w):>7s}" for w in waves)
          + f" {'lpt':>7s}")
    for d in (64, 128, 256):
        for s in (int(x) for x in a.seqlens.split(",")):
            per_pair = tile_costs(a.which, d, s, a.mask)
            pairs, n = (16384 // s) * (2048 // d), len(per_pair)
            ideal = sum(per_pair) * pairs / slots
            idle = lambda order: 1 - ideal / makespan(order, slots)  # noqa: E731
            pair_major = per_pair * pairs
            row = [idle(pair_major)]
            for w in waves:
                tail = min(pairs, math.ceil(w * slots / n))
                row.append(idle(per_pair * (pairs - tail) + [c for c in per_pair for _ in range(tail)]))
            row.append(idle(sorted(pair_major, reverse=True)))
            print(f"{d:4d} {s:6d} {n * pairs:6d} " + " ".join(f"{100 * x:6.1f}%" for x in row))


if __name__ == "__main__":
    main()

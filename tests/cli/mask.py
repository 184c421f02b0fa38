#!/usr/bin/env python3
"""tests/cli/mask.py FLASHC — `--attn-mask` of flashc run, check and bench, end to end (ctest cli_mask).

Python's standard library only (CI has no numpy here): .npy files are written and read with struct.
  results  `flashc run` with a mask file (bool, f2/f4/f8 bias; 4-d, 3-d, 1-d, 0-d shapes that broadcast; with
           causal and GQA) gives the o of attention computed here in float64 from the same q, k, v and mask, on
           cpu and cpu-ref; a row the mask hides entirely gets o = 0 and lse = -inf; the generated `padding` mask
           is the documented one (the same o as its .npy file); `flashc check` (cpu against cpu-ref, forward and
           backward) passes with every mask, in f32, bf16 and f16
  refusals a shape that does not broadcast, more than 4 dimensions, an integer dtype, NaN or +inf in a bias (also
           after rounding to f16), a missing or truncated file, a bool q.npy: exit 2 and a message naming the file
           and the shape or value
  bench    --attn-mask with --check yes passes on cpu and cpu-ref (and --dropout too); a mask file whose shape
           does not fit a sequence length is refused
"""

import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

FLASHC = sys.argv[1]
failures = 0

B, SQ, SK, H, HKV, D = 2, 5, 7, 4, 2, 8
CODES = {"<f2": "e", "<f4": "f", "<f8": "d", "|b1": "?", "<i4": "i"}
# Two sequence lengths, both checked against cpu-ref (exit 1 on a failed check), on the two host backends.
BENCH = "bench --backend cpu,cpu-ref --seqlens 37,64 --heads 2 --head-dim 16 --repeats 1 --warmup 0".split()


def fail(what):
    global failures
    failures += 1
    print(f"FAIL: {what}", file=sys.stderr)


def ok(what):
    print(f"ok    {what}")


def write_npy(path, descr, shape, values):
    """An .npy file as numpy writes it (version 1.0, header padded to 64 bytes)."""
    shape_text = "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    data = struct.pack(f"<{len(values)}{CODES[descr]}", *values)
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


def read_npy(path):
    with open(path, "rb") as f:
        raw = f.read()
    hl = struct.unpack("<H", raw[8:10])[0]
    header = raw[10 : 10 + hl].decode()
    descr = header.split("'descr': '")[1].split("'")[0]
    shape = tuple(int(n) for n in header.split("'shape': (")[1].split(")")[0].split(",") if n.strip())
    n = math.prod(shape)
    return shape, list(struct.unpack(f"<{n}{CODES[descr]}", raw[10 + hl :]))


def run(*args):
    p = subprocess.run([FLASHC, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def at(x, shape, *idx):
    """Element idx of a flat C-order list of `shape`."""
    flat = 0
    for i, n in zip(idx, shape):
        flat = flat * n + i
    return x[flat]


def broadcast(shape, values):
    """mask(b, h, i, j) of a mask of `shape` broadcast to [B, H, SQ, SK] (numpy's rule)."""
    full = (1,) * (4 - len(shape)) + tuple(shape)
    return lambda b, h, i, j: at(values, full, *(0 if n == 1 else x for n, x in zip(full, (b, h, i, j))))


def attention(q, k, v, mask=None, is_bool=False, causal=False):
    """o [B, SQ, H, D] and lse [B, H, SQ] in float64; the diagonal bottom-right as flashc's default."""
    qs, ks = (B, SQ, H, D), (B, SK, HKV, D)
    o, lse = [0.0] * (B * SQ * H * D), [0.0] * (B * H * SQ)
    scale = 1 / math.sqrt(D)
    for b in range(B):
        for h in range(H):
            hk = h // (H // HKV)
            for i in range(SQ):
                s = []
                for j in range(SK):
                    x = scale * sum(at(q, qs, b, i, h, t) * at(k, ks, b, j, hk, t) for t in range(D))
                    visible = not causal or j <= i + SK - SQ
                    if mask is not None:
                        m = mask(b, h, i, j)
                        visible = visible and (bool(m) if is_bool else m != -math.inf)
                        x += 0 if is_bool else m
                    s.append(x if visible else -math.inf)
                top = max(s)
                lse[(b * H + h) * SQ + i] = (
                    top if top == -math.inf else top + math.log(sum(math.exp(x - top) for x in s))
                )
                if top == -math.inf:
                    continue  # a row that sees no key: o = 0
                p = [math.exp(x - top) for x in s]
                total = sum(p)
                for t in range(D):
                    o[((b * SQ + i) * H + h) * D + t] = sum(p[j] * at(v, ks, b, j, hk, t) for j in range(SK)) / total
    return o, lse


def close(x, ref, tol):
    return len(x) == len(ref) and all(
        (a == b) if math.isinf(b) else abs(a - b) <= tol * (1 + abs(b)) for a, b in zip(x, ref)
    )


def main(tmp):
    data = os.path.join(tmp, "data")
    shape = f"--batch {B} --seqlen-q {SQ} --seqlen-k {SK} --heads {H} --heads-kv {HKV} --head-dim {D} --seed 3"
    rc, _, err = run("gen", "--data", data, *shape.split())
    if rc:
        fail(f"flashc gen: exit {rc}: {err}")
        return
    q, k, v = (read_npy(os.path.join(data, f"{t}.npy"))[1] for t in "qkv")
    rng = random.Random(7)

    # ---- masks that broadcast, against attention computed here -------------------------------------------
    keep = [rng.random() < 0.6 for _ in range(B * SQ * SK)]
    for j in range(SK):
        keep[(0 * SQ + 2) * SK + j] = False  # batch 0, query 2 sees no key
    bias3 = [rng.gauss(0, 1) if rng.random() < 0.8 else -math.inf for _ in range(H * SQ * SK)]
    cases = [  # name, descr, shape, values, extra flags
        ("bool [B,1,SQ,SK] with a hidden row", "|b1", (B, 1, SQ, SK), keep, []),
        ("f4 bias [H,SQ,SK] with -inf", "<f4", (H, SQ, SK), bias3, []),
        ("f8 bias [SK]", "<f8", (SK,), [rng.gauss(0, 2) for _ in range(SK)], []),
        ("f2 bias [B,H,1,SK]", "<f2", (B, H, 1, SK), [rng.gauss(0, 1) for _ in range(B * H * SK)], []),
        ("bool 0-d True", "|b1", (), [True], []),
        ("f4 bias [1,1,SQ,SK], causal", "<f4", (1, 1, SQ, SK), [rng.gauss(0, 1) for _ in range(SQ * SK)], ["--causal"]),
    ]
    for n, (name, descr, shape, values, extra) in enumerate(cases):
        path = os.path.join(tmp, f"mask{n}.npy")
        write_npy(path, descr, shape, values)
        if descr == "<f2":  # the values the file holds
            values = list(struct.unpack(f"<{len(values)}e", struct.pack(f"<{len(values)}e", *values)))
        if descr == "<f4":
            values = list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))
        ref_o, ref_lse = attention(q, k, v, broadcast(shape, values), descr == "|b1", "--causal" in extra)
        for backend in ("cpu", "cpu-ref"):
            rc, _, err = run("run", "--data", data, "--backend", backend, "--mode", "fwd", "--attn-mask", path, *extra)
            if rc:
                fail(f"run {backend}, {name}: exit {rc}: {err}")
                continue
            o, lse = read_npy(os.path.join(data, "o.npy"))[1], read_npy(os.path.join(data, "lse.npy"))[1]
            if not close(o, ref_o, 1e-5) or not close(lse, ref_lse, 1e-5):
                worst = max(abs(a - b) for a, b in zip(o, ref_o))
                fail(f"run {backend}, {name}: o or lse differ from float64 attention (max |o error| {worst:.3g})")
            else:
                ok(f"run {backend}, {name}: o and lse match float64 attention")
        if n == 0:
            hidden = [o[((0 * SQ + 2) * H + h) * D + t] for h in range(H) for t in range(D)]
            row_lse = [lse[(0 * H + h) * SQ + 2] for h in range(H)]
            if any(x != 0 for x in hidden) or any(x != -math.inf for x in row_lse):
                fail(f"{name}: the hidden row has o {hidden[:4]}..., lse {row_lse}")
            else:
                ok(f"{name}: the hidden row has o = 0, lse = -inf")
        for dtype in ("f32", "bf16", "f16"):
            args = f"check --backend cpu --mode both --dtype {dtype}".split()
            rc, out, err = run(*args, "--data", data, "--attn-mask", path, *extra)
            if rc or "PASS" not in out or "attn_mask" not in out:
                fail(f"check cpu {dtype}, {name}: exit {rc}: {out[-300:]} {err}")
            else:
                ok(f"check cpu {dtype}, {name}: PASS (forward and backward against cpu-ref)")

    # ---- the generated masks ------------------------------------------------------------------------------
    padding = [j < SK - (b + 1) * SK // (2 * B) for b in range(B) for j in range(SK)]
    pad_path = os.path.join(tmp, "padding.npy")
    write_npy(pad_path, "|b1", (B, 1, 1, SK), padding)
    outputs = []
    for spec in ("padding", pad_path):
        rc, _, err = run("run", "--data", data, "--backend", "cpu", "--mode", "fwd", "--attn-mask", spec)
        outputs.append(read_npy(os.path.join(data, "o.npy"))[1] if rc == 0 else err)
    if outputs[0] != outputs[1]:
        fail(f"--attn-mask padding differs from its documented mask: {str(outputs)[:300]}")
    else:
        ok("--attn-mask padding: the same o as the documented [batch, 1, 1, seqlen_k] mask")
    for spec in ("padding", "random-bool"):
        for flags in ("", "--causal --heads 4 --heads-kv 1 --dtype bf16"):
            args = f"check --backend cpu --seqlen-q 113 --seqlen-k 203 --head-dim 59 --batch 3 {flags}".split()
            rc, out, err = run(*args, "--attn-mask", spec)
            if rc or "PASS" not in out:
                fail(f"check --attn-mask {spec} {flags}: exit {rc}: {out[-300:]} {err}")
            else:
                ok(f"check --attn-mask {spec} {flags}: PASS")

    # ---- refusals: exit 2, the file and its shape or value named --------------------------------------------
    def refused(what, message, *args):
        rc, _, err = run(*args)
        if rc != 2:
            fail(f"{what}: exit {rc}, expected 2 ({err.strip()})")
        elif not all(m in err for m in message):
            fail(f"{what}: the message '{err.strip()}' lacks {message}")
        else:
            ok(f"{what}: exit 2: {err.strip()}")

    run_cpu = ("run", "--data", data, "--backend", "cpu")
    bad = [  # what, file name, descr, shape, values, the message's parts (after the path), the command
        ("shape (3, 5, 7)", "b3.npy", "|b1", (3, SQ, SK), [True] * (3 * SQ * SK),
         ["shape (3, 5, 7) does not broadcast", "[2, 4, 5, 7]", "heads dimension is 3"], run_cpu),
        ("seqlen_k 6", "k6.npy", "<f4", (B, H, SQ, 6), [0.0] * (B * H * SQ * 6),
         ["shape (2, 4, 5, 6)", "seqlen_k dimension is 6, not 1 or 7"], ("check", "--data", data, "--backend", "cpu")),
        ("5 dimensions", "d5.npy", "|b1", (1, B, H, SQ, SK), [True] * (B * H * SQ * SK),
         ["shape (1, 2, 4, 5, 7) has 5 dimensions"], run_cpu),
        ("an int32 mask", "int.npy", "<i4", (SQ, SK), [1] * (SQ * SK), ["dtype '<i4' is not supported", "'|b1'"],
         run_cpu),
        ("a NaN bias", "nan.npy", "<f4", (SQ, SK), [0.0] * 3 + [math.nan] + [0.0] * (SQ * SK - 4),
         ["element 3 is nan", "finite or -inf"], run_cpu),
        ("a +inf bias", "inf.npy", "<f8", (SK,), [0.0] * (SK - 1) + [math.inf], ["element 6 is inf"], run_cpu),
        ("a bias that is +inf in f16", "big.npy", "<f4", (SK,), [7e4] + [0.0] * (SK - 1),
         ["element 0 is 70000, +inf in f16"], ("check", "--data", data, "--backend", "cpu", "--dtype", "f16")),
        ("a truncated file", "short.npy", "|b1", (SQ, SK), [True] * (SQ * SK), ["truncated"], run_cpu),
        ("bench with a mask for one seqlen of two", "s37.npy", "|b1", (37, 37), [True] * (37 * 37),
         ["seqlen_q dimension is 37, not 1 or 64"], BENCH),
    ]  # fmt: skip
    for what, name, descr, shape, values, message, command in bad:
        path = os.path.join(tmp, name)
        write_npy(path, descr, shape, values)
        if name == "short.npy":
            with open(path, "rb") as f:
                raw = f.read()
            with open(path, "wb") as f:
                f.write(raw[:-1])
        refused(what, [path, *message], *command, "--attn-mask", path)
    missing = os.path.join(tmp, "absent.npy")
    refused("a missing file", [missing], *run_cpu, "--attn-mask", missing)
    bool_data = os.path.join(tmp, "bool-data")
    os.mkdir(bool_data)
    for t in "qkv":
        shape = (B, SQ if t == "q" else SK, H if t == "q" else HKV, D)
        write_npy(os.path.join(bool_data, f"{t}.npy"), "|b1", shape, [True] * math.prod(shape))
    refused("a bool q.npy", ["q.npy: dtype |b1 (bool) is not an input's"], "run", "--data", bool_data, "--backend",
            "cpu", "--mode", "fwd")  # fmt: skip

    # ---- bench ------------------------------------------------------------------------------------------
    for flags in ("--attn-mask padding", "--attn-mask random-bool --causal", "--dropout 0.1"):
        rc, out, err = run(*BENCH, "--check", "yes", *flags.split())
        rows = [line for line in out.splitlines() if line.startswith(("cpu ", "cpu-ref "))]
        if rc or len(rows) != 8 or any(not r.endswith("PASS") for r in rows):
            fail(f"bench {flags}: exit {rc}, {len(rows)} rows: {out[-400:]} {err}")
        elif "--attn-mask" in flags and not all("+mask" in r for r in rows):
            fail(f"bench {flags}: the rows do not say +mask: {rows}")
        else:
            ok(f"bench {flags}: {len(rows)} rows, every check PASS")


scratch = tempfile.mkdtemp()
try:
    main(scratch)
finally:
    shutil.rmtree(scratch)
if failures:
    print(f"{failures} failure(s)", file=sys.stderr)
    sys.exit(1)

"""flashc.attention_with_kvcache (flashc_forward_kvcache) on cpu and cpu-ref, numpy and torch, against a plain fp64
computation written here: each sequence's cache gathered into dense [len, heads_kv, d] form (the appended rows
included), then softmax attention with the mask from its definition. Also: the cache is written in place exactly
where k/v belong and nowhere else, bad block tables and lengths are refused naming the value, the struct mirrors
the library's, the torch operator (opcheck, torch.compile); on a GPU the CUDA backends against the same reference
with FlashAttention's rule (twice the error of the plain bf16/f16 computation), device tables that the host cannot
check (NaN outputs, nothing written outside the caches), and a capture in a CUDA graph; skipped without CUDA."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

import flashc
from flashc import kvcache as kvc

from conftest import need_backend, visible

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- building a cache ------------------------------------------------------------------------------------------
def make_cache(rng, *, batch, capacity, hkv, d, page, cached, sn, dtype=np.float32, spare_blocks=3):
    """Caches (dense when page is None, else paged with a permuted block table whose unused entries are garbage),
    the new k/v, and the int32 lengths."""
    if page is None:
        shape = (batch, capacity, hkv, d)
        table = None
    else:
        assert capacity % page == 0
        per = capacity // page
        n_blocks = batch * per + spare_blocks
        shape = (n_blocks, page, hkv, d)
        perm = rng.permutation(n_blocks).astype(np.int32)
        table = np.full((batch, per + 2), -5, dtype=np.int32)  # padded rows: a stride of per + 2
        table[:, :per] = perm[: batch * per].reshape(batch, per)
        table = table[:, :per]
    kc = rng.standard_normal(shape).astype(dtype)
    vc = rng.standard_normal(shape).astype(dtype)
    k = rng.standard_normal((batch, sn, hkv, d)).astype(dtype) if sn else None
    v = rng.standard_normal((batch, sn, hkv, d)).astype(dtype) if sn else None
    lens = np.array(cached, dtype=np.int32)
    return kc, vc, k, v, lens, table


def gather(cache, table, page, s, n):
    """The first n rows of sequence s's cache, dense [n, heads_kv, d], in float64."""
    if table is None:
        return cache[s, :n].astype(np.float64)
    rows = [cache[table[s, j // page], j % page] for j in range(n)]
    return np.array(rows, dtype=np.float64).reshape((n,) + cache.shape[2:])


def reference(q, kc, vc, k, v, lens, table, page, causal=False, window=None, scale=None):
    """o [b, sq, hq, d] and lse [b, hq, sq] in float64, from the caches before the call."""
    b, sq, hq, d = q.shape
    hkv = kc.shape[2]
    scale = np.float32(1.0 / np.sqrt(d)) if scale is None else np.float32(scale)
    o = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), -np.inf)
    for s in range(b):
        K, V = gather(kc, table, page, s, lens[s]), gather(vc, table, page, s, lens[s])
        if k is not None:
            K = np.concatenate([K, k[s].astype(np.float64)])
            V = np.concatenate([V, v[s].astype(np.float64)])
        n = K.shape[0]
        for h in range(hq):
            hk = h // (hq // hkv)
            scores = float(scale) * (q[s, :, h].astype(np.float64) @ K[:, hk].T)  # [sq, n]
            seen = visible(sq, n, causal, window)
            scores = np.where(seen, scores, -np.inf)
            m = scores.max(axis=1, initial=-np.inf)
            for r in range(sq):
                if m[r] == -np.inf:
                    continue
                e = np.exp(scores[r] - m[r])
                o[s, r, h] = e @ V[:, hk] / e.sum()
                lse[s, h, r] = m[r] + np.log(e.sum())
    return o, lse


def expected_caches(kc, vc, k, v, lens, table, page):
    kc2, vc2 = kc.copy(), vc.copy()
    if k is None:
        return kc2, vc2
    for s in range(kc.shape[0] if table is None else lens.shape[0]):
        for t in range(k.shape[1]):
            j = lens[s] + t
            at = (s, j) if table is None else (table[s, j // page], j % page)
            kc2[at], vc2[at] = k[s, t], v[s, t]
    return kc2, vc2


def tolerance(dtype, backend):
    u = {np.dtype(np.float32): 2.0**-24, BF16: 2.0**-8, np.dtype(np.float16): 2.0**-11}[np.dtype(dtype)]
    return (1.01 * u, 1e-12) if backend == "cpu-ref" else (4 * u, 2e-6)


def check(o, lse, ref_o, ref_lse, dtype, backend):
    rel, floor = tolerance(dtype, backend)
    o = np.asarray(o, dtype=np.float64)
    err = np.abs(o - ref_o).max(initial=0)
    assert err <= rel * max(1.0, np.abs(ref_o).max(initial=0)) + floor, f"o error {err}"
    empty = ref_lse == -np.inf
    assert np.array_equal(np.asarray(lse)[empty], ref_lse[empty]), "rows that see no key have lse = -inf"
    assert np.all(o.transpose(0, 2, 1, 3)[empty] == 0), "rows that see no key have o = 0"
    assert np.allclose(np.asarray(lse)[~empty], ref_lse[~empty], rtol=2e-6, atol=2e-6)


# ---- numpy, every layout -----------------------------------------------------------------------------------------
LAYOUTS = [
    # page, capacity, cached per sequence (None: random), sn, hq, hkv, d, causal, window
    pytest.param(None, 200, None, 1, 8, 2, 64, True, None, id="dense-decode-gqa"),
    pytest.param(None, 100, [100, 0, 37], 0, 4, 4, 32, False, None, id="dense-full-empty"),
    pytest.param(16, 96, None, 1, 4, 1, 64, True, None, id="page16-mqa"),
    pytest.param(16, 64, [15, 31, 0], 16, 4, 2, 32, True, None, id="page16-append-16-across-pages"),
    pytest.param(256, 1024, [700, 1019], 4, 4, 2, 128, True, None, id="page256-spec4"),
    pytest.param(7, 70, None, 3, 6, 3, 24, True, (9, -1), id="page7-window"),
    pytest.param(16, 160, [150, 3], 5, 2, 1, 59, False, (4, 2), id="page16-window-both"),
    pytest.param(16, 48, [48, 0], 0, 2, 2, 16, True, None, id="page16-full-empty"),
    pytest.param(None, 3000, [2999], 1, 4, 1, 32, True, None, id="dense-long-splits"),
]


@pytest.mark.parametrize("backend", ["cpu-ref", "cpu"])
@pytest.mark.parametrize("page,capacity,cached,sn,hq,hkv,d,causal,window", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["f32", "bf16"])
def test_numpy_layouts(rng, backend, page, capacity, cached, sn, hq, hkv, d, causal, window, dtype):
    need_backend(backend)
    batch = len(cached) if cached else 3
    if cached is None:
        cached = rng.integers(0, capacity - sn + 1, size=batch)
    kc, vc, k, v, lens, table = make_cache(
        rng, batch=batch, capacity=capacity, hkv=hkv, d=d, page=page, cached=cached, sn=sn, dtype=dtype
    )
    sq = max(sn, 1)
    q = rng.standard_normal((batch, sq, hq, d)).astype(dtype)
    ref_o, ref_lse = reference(q, kc, vc, k, v, lens, table, page, causal, window)
    want_k, want_v = expected_caches(kc, vc, k, v, lens, table, page)
    o, lse = flashc.attention_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=causal, window=window, return_lse=True,
        backend=backend,
    )  # fmt: skip
    assert flashc.last_backend() == backend
    check(o, lse, ref_o, ref_lse, dtype, backend)
    assert np.array_equal(kc.view(np.uint8), want_k.view(np.uint8)), "k_cache: only the appended rows change"
    assert np.array_equal(vc.view(np.uint8), want_v.view(np.uint8)), "v_cache: only the appended rows change"


@pytest.mark.parametrize("sn", [1, 2, 7, 16])
def test_speculative_rows(rng, sn):
    """seqlen_new 1..16 new rows, causal bottom-right, on both backends alike."""
    need_backend("cpu")
    kc, vc, k, v, lens, table = make_cache(rng, batch=2, capacity=64, hkv=2, d=32, page=16, cached=[20, 47], sn=sn)
    q = rng.standard_normal((2, sn, 4, 32)).astype(np.float32)
    ref_o, ref_lse = reference(q, kc, vc, k, v, lens, table, 16, causal=True)
    o, lse = flashc.attention_with_kvcache(q, kc, vc, k, v, lens, table, causal=True, return_lse=True, backend="cpu")
    check(o, lse, ref_o, ref_lse, np.float32, "cpu")


def test_splits_and_threads_agree(rng):
    """The cpu backend's result does not depend on the thread count; given splits stay correct."""
    need_backend("cpu")
    kc, vc, _, _, lens, table = make_cache(rng, batch=1, capacity=4096, hkv=2, d=64, page=256, cached=[4000], sn=0)
    q = rng.standard_normal((1, 1, 8, 64)).astype(np.float32)
    ref_o, ref_lse = reference(q, kc, vc, None, None, lens, table, 256)
    outs = [
        flashc.attention_with_kvcache(
            q, kc, vc, cache_seqlens=lens, block_table=table, return_lse=True, backend="cpu", threads=t, num_splits=s
        )  # fmt: skip
        for t, s in ((1, 0), (3, 0), (2, 5), (1, 1))
    ]
    for o, lse in outs:
        check(o, lse, ref_o, ref_lse, np.float32, "cpu")
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_int_seqlens_and_full_default(rng):
    need_backend("cpu")
    kc, vc, _, _, _, _ = make_cache(rng, batch=2, capacity=30, hkv=1, d=16, page=None, cached=[30, 30], sn=0)
    q = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    full = flashc.attention_with_kvcache(q, kc, vc)  # None: every cache full
    as_int = flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=30)
    ref_o, _ = reference(q, kc, vc, None, None, np.array([30, 30]), None, None)
    assert np.array_equal(full, as_int)
    assert np.abs(full - ref_o).max() < 1e-5


# ---- refusals ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu-ref", "cpu"])
def test_bad_tables_and_lengths(rng, backend):
    need_backend(backend)
    kc, vc, k, v, lens, table = make_cache(rng, batch=2, capacity=64, hkv=2, d=16, page=16, cached=[20, 33], sn=2)
    q = rng.standard_normal((2, 2, 4, 16)).astype(np.float32)
    kc0, vc0 = kc.copy(), vc.copy()

    def call(lens_=lens, table_=table):
        return flashc.attention_with_kvcache(q, kc, vc, k, v, lens_, table_, causal=True, backend=backend)

    bad = table.copy()
    bad[1, 2] = kc.shape[0]
    with pytest.raises(ValueError, match=r"cache.block_table\[1\]\[2\] is 11, outside the 11 blocks"):
        call(table_=bad)
    bad[1, 2] = -1
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\] is -1"):
        call(table_=bad)
    with pytest.raises(ValueError, match=r"sequence 0 needs 65 keys .* but its cache holds 64"):
        call(lens_=np.array([63, 0], np.int32))
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] is -1"):
        call(lens_=np.array([0, -1], np.int32))
    shared = table.copy()
    shared[1, 0] = table[0, 1]  # sequence 0 appends into its block 1, which sequence 1 reads
    with pytest.raises(ValueError, match="also uses"):
        call(table_=shared)
    with pytest.raises(ValueError, match="cache_seqlens has 3 lengths for a batch of 2"):
        call(lens_=np.array([1, 2, 3], np.int32))
    with pytest.raises(TypeError, match="int32"):
        call(lens_=np.array([1, 2], np.int64))
    assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0), "a refused call writes nothing"
    # entries past a sequence's length are never read: garbage there is fine
    junk = table.copy()
    junk[0, 2:] = 10**6
    call(table_=junk)


def test_struct_mirrors_the_library(rng):
    """KVCache is flashc_kvcache: the library names its own size when refusing a larger struct_size."""
    kc, vc, _, _, lens, _ = make_cache(rng, batch=1, capacity=8, hkv=1, d=8, page=None, cached=[4], sn=0)
    q = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)
    out = np.empty_like(q)
    c = kvc.KVCache(struct_size=ctypes.sizeof(kvc.KVCache) + 8, k_cache=flashc._arrays.describe(kc),
                    v_cache=flashc._arrays.describe(vc))  # fmt: skip
    h = flashc._api._handle("cpu-ref")
    p = flashc._lib.params_default()
    status = kvc._fn(h.ptr, ctypes.byref(flashc._arrays.describe(q)), ctypes.byref(c),
                     ctypes.byref(flashc._arrays.describe(out)), None, ctypes.byref(p))  # fmt: skip
    assert status == flashc._lib.ERR_INVALID_ARGUMENT
    msg = flashc._lib.lib.flashc_last_error().decode()
    assert f"this library's flashc_kvcache ({ctypes.sizeof(kvc.KVCache)} bytes)" in msg, msg


def test_out_is_written_in_place(rng):
    """out= receives the result (the same bits as without it) and is what the call returns; a wrong shape, dtype or
    kind of out is refused before anything is written."""
    need_backend("cpu")
    kc, vc, _, _, lens, table = make_cache(rng, batch=2, capacity=64, hkv=2, d=32, page=16, cached=[15, 40], sn=0)
    q = rng.standard_normal((2, 2, 4, 32)).astype(np.float32)
    want, want_lse = flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, return_lse=True)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    got, lse = flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, out=out,
                                             return_lse=True)  # fmt: skip
    assert got is out and np.array_equal(out, want) and np.array_equal(lse, want_lse)
    assert flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, out=out) is out
    for bad, err in ((np.empty((2, 2, 4, 16), np.float32), ValueError), (np.empty(q.shape, np.float64), TypeError)):
        with pytest.raises(err, match="out"):
            flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, out=bad)
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    if not hasattr(torch.library, "custom_op"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op")
    T = torch.from_numpy
    tout = torch.full(q.shape, float("nan"))
    got, lse = flashc.attention_with_kvcache(T(q), T(kc), T(vc), cache_seqlens=T(lens), block_table=T(table),
                                             out=tout, return_lse=True)  # fmt: skip
    assert got is tout and np.array_equal(tout.numpy(), want) and np.array_equal(lse.numpy(), want_lse)
    with pytest.raises(ValueError, match="out"):
        flashc.attention_with_kvcache(T(q), T(kc), T(vc), cache_seqlens=T(lens), out=out)  # numpy out, torch q
    torch.library.opcheck(
        torch.ops.flashc.fwd_kvcache_out.default,
        (
            T(q),
            T(kc.copy()),
            T(vc.copy()),
            None,
            None,
            T(lens),
            T(table),
            torch.empty(q.shape),
            torch.empty(2, 4, 2),
            None,
            False,
            -1,
            -1,
            "cpu",
            -1,
            0,
        ),  # fmt: skip
    )

    def step(q_, kc_, vc_, lens_, table_, out_):
        return flashc.attention_with_kvcache(q_, kc_, vc_, cache_seqlens=lens_, block_table=table_, out=out_)

    tout2 = torch.empty(q.shape)
    torch.compile(step, fullgraph=True, backend="aot_eager")(T(q), T(kc), T(vc), T(lens), T(table), tout2)
    assert np.array_equal(tout2.numpy(), want), "the compiled call writes out in place"


# ---- torch -----------------------------------------------------------------------------------------------------------
def test_torch_in_place_and_compile(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    if not hasattr(torch.library, "custom_op"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op")
    need_backend("cpu")
    kc, vc, k, v, lens, table = make_cache(rng, batch=2, capacity=64, hkv=2, d=32, page=16, cached=[15, 40], sn=3)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    ref_o, ref_lse = reference(q, kc, vc, k, v, lens, table, 16, causal=True)
    want_k, want_v = expected_caches(kc, vc, k, v, lens, table, 16)
    T = torch.from_numpy
    tk, tv = T(kc.copy()), T(vc.copy())
    o, lse = flashc.attention_with_kvcache(T(q), tk, tv, T(k), T(v), T(lens), T(table), causal=True, return_lse=True)
    check(o.numpy(), lse.numpy(), ref_o, ref_lse, np.float32, "cpu")
    assert np.array_equal(tk.numpy(), want_k) and np.array_equal(tv.numpy(), want_v)

    torch.library.opcheck(
        torch.ops.flashc.fwd_kvcache.default,
        (T(q), T(kc.copy()), T(vc.copy()), T(k), T(v), T(lens), T(table), None, True, -1, -1, "cpu", -1, 0),
    )

    def step(q_, kc_, vc_, k_, v_, lens_, table_):
        return flashc.attention_with_kvcache(q_, kc_, vc_, k_, v_, lens_, table_, causal=True)

    ck, cv = T(kc.copy()), T(vc.copy())
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    o2 = compiled(T(q), ck, cv, T(k), T(v), T(lens), T(table))
    assert torch.equal(o2, o)
    assert np.array_equal(ck.numpy(), want_k), "the compiled call mutates the cache in place"


# ---- CUDA -----------------------------------------------------------------------------------------------------------
CUDA_BACKENDS = ["cuda-mma", "cuda-hopper"]


def need_cuda(backend):
    """torch with a CUDA device and a usable `backend` ("auto": any), else a skip."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if backend != "auto":
        need_backend(backend)
    return torch


def to_device(torch, x, dtype):
    """A numpy array (or None) as a CUDA tensor of `dtype` (values rounded), and the rounded values in numpy."""
    if x is None:
        return None, None
    t = torch.from_numpy(np.ascontiguousarray(x)).to(dtype).cuda()
    return t, t.float().cpu().numpy()


def plain_lowp(torch, q, kc, vc, k, v, lens, table, page, causal, window, dtype):
    """The same maths done plainly in dtype, on the CPU: S = q·Kᵀ rounded to dtype, the softmax in fp32 rounded, O = P·V
    rounded: FlashAttention's baseline (a kernel's error may be twice this one's)."""
    b, sq, hq, d = q.shape
    hkv = kc.shape[2]
    out = np.zeros((b, sq, hq, d))
    for s in range(b):
        K, V = gather(kc, table, page, s, lens[s]), gather(vc, table, page, s, lens[s])
        if k is not None:
            K, V = np.concatenate([K, k[s]]), np.concatenate([V, v[s]])
        n = K.shape[0]
        seen = visible(sq, n, causal, window)
        for h in range(hq):
            hk = h // (hq // hkv)
            Q, Kh, Vh = (torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in (q[s, :, h], K[:, hk], V[:, hk]))
            S = (Q @ Kh.T).float() / np.sqrt(d)
            S = S.masked_fill(~torch.from_numpy(seen), -float("inf"))
            P = torch.softmax(S, dim=1).nan_to_num(0.0).to(dtype)
            out[s, :, h] = (P @ Vh).double().numpy()
    return out


def check_cuda(o, lse, ref_o, ref_lse, base_o, dtype_name):
    """FlashAttention's rule: max error <= 2x the plain low-precision computation's + 4u of the output's magnitude;
    lse within fp32 rounding; rows that see no key exactly o = 0, lse = -inf."""
    u = {"bf16": 2.0**-8, "f16": 2.0**-11}[dtype_name]
    o = o.float().cpu().numpy().astype(np.float64)
    lse = lse.cpu().numpy().astype(np.float64)
    base = np.abs(base_o - ref_o).max(initial=0)
    tol = 2 * base + 4 * u * max(np.abs(ref_o).max(initial=0), 1e-3)
    assert np.isfinite(o).all(), "o has non-finite values"
    err = np.abs(o - ref_o).max(initial=0)
    assert err <= tol, f"o error {err:.3e} > {tol:.3e} (baseline {base:.3e})"
    empty = ref_lse == -np.inf
    assert np.array_equal(lse[empty], ref_lse[empty]), "rows that see no key have lse = -inf"
    assert np.all(o.transpose(0, 2, 1, 3)[empty] == 0), "rows that see no key have o = 0"
    assert np.allclose(lse[~empty], ref_lse[~empty], rtol=1e-5, atol=1e-5)


CUDA_LAYOUTS = [
    # page, capacity, cached per sequence (None: random), sn, hq, hkv, d, causal, window, num_splits
    pytest.param(None, 700, None, 1, 32, 8, 128, True, None, 0, id="dense-gqa32/8"),
    pytest.param(16, 320, [14, 31, 0], 4, 32, 8, 128, True, None, 0, id="page16-spec4-across-pages"),
    pytest.param(256, 1024, [700, 1019], 1, 32, 1, 64, True, None, 0, id="page256-mqa"),
    pytest.param(256, 2048, [2000], 4, 16, 1, 64, True, None, 0, id="page256-mqa-spec4-64rows"),
    pytest.param(16, 512, None, 1, 8, 2, 64, True, (50, -1), 0, id="page16-window"),
    pytest.param(None, 80, [60, 13], 0, 4, 2, 96, False, (7, 2), 0, id="dense-window-both-d96"),
    pytest.param(None, 64, [0, 0], 0, 4, 1, 64, True, None, 0, id="dense-empty"),
    pytest.param(16, 48, [48, 0], 0, 4, 2, 59, True, None, 3, id="page16-full-empty-d59"),
    pytest.param(None, 600, [555], 1, 8, 2, 256, True, None, 0, id="dense-d256"),
    pytest.param(None, 3000, [2999, 1500], 0, 8, 2, 128, False, None, 1, id="splits-1"),
    pytest.param(None, 3000, [2999, 1500], 0, 8, 2, 128, False, None, 2, id="splits-2"),
    pytest.param(256, 4096, [4000], 4, 16, 2, 128, True, None, 64, id="splits-64"),
    # a split walking many key blocks of 64 over pages that do not divide them (2 or 3 pages a block)
    pytest.param(48, 1440, [1300, 700], 1, 32, 8, 128, True, None, 1, id="page48-one-split"),
    pytest.param(48, 480, [47, 300], 1, 4, 2, 256, True, None, 3, id="page48-d256-splits-3"),
]


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("page,capacity,cached,sn,hq,hkv,d,causal,window,splits", CUDA_LAYOUTS)
@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
def test_cuda_layouts(rng, backend, page, capacity, cached, sn, hq, hkv, d, causal, window, splits, dtype_name):
    """The CUDA backends against the fp64 reference: dense and paged (permuted tables), appends, GQA/MQA, masks,
    empty caches, splits; the caches written in place exactly where k/v belong."""
    torch = need_cuda(backend)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
    batch = len(cached) if cached else 3
    if cached is None:
        cached = rng.integers(0, capacity - sn + 1, size=batch)
    kc, vc, k, v, lens, table = make_cache(rng, batch=batch, capacity=capacity, hkv=hkv, d=d, page=page,
                                           cached=cached, sn=sn)  # fmt: skip
    q = rng.standard_normal((batch, max(sn, 1), hq, d)).astype(np.float32)
    (tq, q), (tkc, kc), (tvc, vc), (tk, k), (tv, v) = (to_device(torch, x, dtype) for x in (q, kc, vc, k, v))
    ref_o, ref_lse = reference(q, kc, vc, k, v, lens, table, page, causal, window)
    base_o = plain_lowp(torch, q, kc, vc, k, v, lens, table, page, causal, window, dtype)
    want_k, want_v = expected_caches(kc, vc, k, v, lens, table, page)
    tlens = torch.from_numpy(lens).cuda()
    ttable = None if table is None else torch.from_numpy(np.ascontiguousarray(table)).cuda()
    o, lse = flashc.attention_with_kvcache(
        tq, tkc, tvc, tk, tv, cache_seqlens=tlens, block_table=ttable, causal=causal, window=window, return_lse=True,
        backend=backend, num_splits=splits,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert flashc.last_backend() == backend
    check_cuda(o, lse, ref_o, ref_lse, base_o, dtype_name)
    assert np.array_equal(tkc.float().cpu().numpy(), want_k), "k_cache: only the appended rows change"
    assert np.array_equal(tvc.float().cpu().numpy(), want_v), "v_cache: only the appended rows change"


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("breakage", ["index-high", "index-negative", "length-past", "length-negative"])
def test_cuda_bad_tables(rng, backend, breakage):
    """Device tables the host cannot check: the broken sequence's outputs are NaN and nothing is appended for it;
    nothing outside the caches is written (guard blocks around the pool); the other sequence is right."""
    torch = need_cuda(backend)
    kc, vc, k, v, lens, table = make_cache(rng, batch=2, capacity=64, hkv=2, d=64, page=16, cached=[20, 33], sn=2)
    q = rng.standard_normal((2, 2, 8, 64)).astype(np.float32)
    dtype = torch.bfloat16
    (tq, q), (tk, k), (tv, v) = (to_device(torch, x, dtype) for x in (q, k, v))
    n_blocks = kc.shape[0]
    pools = [torch.full((n_blocks + 2,) + kc.shape[1:], 7.0, dtype=dtype, device="cuda") for _ in range(2)]
    for pool, x in zip(pools, (kc, vc)):
        pool[1:-1] = torch.from_numpy(x).to(dtype).cuda()
    tkc, tvc = pools[0][1:-1], pools[1][1:-1]
    kc, vc = tkc.float().cpu().numpy(), tvc.float().cpu().numpy()
    ref_o, ref_lse = reference(q, kc, vc, k, v, lens, table, 16, causal=True)
    base_o = plain_lowp(torch, q, kc, vc, k, v, lens, table, 16, True, None, dtype)
    want_k, want_v = expected_caches(kc, vc, k[:1], v[:1], lens[:1], table[:1], 16)
    bad_table, bad_lens = table.copy(), lens.copy()
    if breakage == "index-high":
        bad_table[1, 1] = n_blocks  # the guard block after the pool, were it used
    elif breakage == "index-negative":
        bad_table[1, 0] = -1  # the guard block before it
    elif breakage == "length-past":
        bad_lens[1] = 63  # + 2 new > 64
    else:
        bad_lens[1] = -3
    o, lse = flashc.attention_with_kvcache(tq, tkc, tvc, tk, tv, torch.from_numpy(bad_lens).cuda(),
                                           torch.from_numpy(np.ascontiguousarray(bad_table)).cuda(), causal=True,
                                           return_lse=True, backend=backend)  # fmt: skip
    torch.cuda.synchronize()
    assert torch.isnan(o[1]).all() and torch.isnan(lse[1]).all(), "the broken sequence's outputs are NaN"
    check_cuda(o[:1], lse[:1], ref_o[:1], ref_lse[:1], base_o[:1], "bf16")
    for pool, want in zip(pools, (want_k, want_v)):
        assert bool((pool[0] == 7).all() and (pool[-1] == 7).all()), "nothing is written outside the cache"
        assert np.array_equal(pool[1:-1].float().cpu().numpy(), want), "only sequence 0's rows are appended"


# The key splits of a tile merged by its last CTA (mma/decode.cu): explicit split counts up to DEC_SPLIT_MAX, odd ones,
# rows per tile from 1 to 24 (two row blocks), head dims whose float4s per row are not a power of two.
SPLIT_SHAPES = [
    # page, seqlen_q, hq, hkv, d, num_splits
    *(pytest.param(None, 1, 24, 4, 128, n, id=f"dense-sq1-gqa24/4-splits{n}") for n in (2, 7, 32, 128)),
    *(pytest.param(64, 4, 24, 4, 128, n, id=f"page64-sq4-gqa24/4-splits{n}") for n in (2, 7, 32, 128)),
    *(pytest.param(None, 4, 24, 4, 128, n, id=f"dense-sq4-gqa24/4-splits{n}") for n in (7, 128)),
    *(pytest.param(64, 1, 24, 4, 128, n, id=f"page64-sq1-gqa24/4-splits{n}") for n in (7, 128)),
    pytest.param(None, 1, 8, 8, 128, 32, id="dense-sq1-mha-splits32"),  # one row per tile, as batch-1 32:32
    pytest.param(16, 4, 8, 8, 128, 7, id="page16-sq4-mha-splits7"),
    pytest.param(None, 1, 4, 4, 59, 32, id="dense-sq1-mha-d59-splits32"),
    pytest.param(16, 4, 8, 2, 256, 32, id="page16-sq4-gqa8/2-d256-splits32"),
    pytest.param(None, 1, 8, 1, 64, 128, id="dense-sq1-mqa-d64-splits128"),
]


def split_case(torch, rng, page, hkv, d, dtype):
    """Three sequences of 8192 keys (room for 128 splits of one 64-key block): full, empty (every row sees no key:
    o 0, lse -inf) and 3001 keys (splits past its keys are empty). The caches on the device, their rounded values."""
    kc, vc, _, _, lens, table = make_cache(rng, batch=3, capacity=8192, hkv=hkv, d=d, page=page, cached=[8192, 0, 3001],
                                           sn=0)  # fmt: skip
    (tkc, kc), (tvc, vc) = (to_device(torch, x, dtype) for x in (kc, vc))
    tlens = torch.from_numpy(lens).cuda()
    ttable = None if table is None else torch.from_numpy(np.ascontiguousarray(table)).cuda()
    return kc, vc, lens, table, tkc, tvc, tlens, ttable


def check_cuda_nan_row(o, lse, ref_o, ref_lse, base_o, nan_at, dtype_name):
    """check_cuda, where query row (b, i, h) = nan_at had a NaN in q (the references computed without it): that row's o
    and lse are NaN, every other row as check_cuda says."""
    b, i, h = nan_at
    assert bool(o[b, i, h].isnan().all() and lse[b, h, i].isnan()), "the NaN query row's o and lse are NaN"
    o, lse = o.clone(), lse.clone()
    o[b, i, h] = o.new_tensor(ref_o[b, i, h])
    lse[b, h, i] = float(ref_lse[b, h, i])
    check_cuda(o, lse, ref_o, ref_lse, base_o, dtype_name)


def same_bits(torch, a, b):
    """a and b hold the same bits (NaN included)."""
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("page,sq,hq,hkv,d,splits", SPLIT_SHAPES)
def test_cuda_split_merge(rng, backend, page, sq, hq, hkv, d, splits):
    """num_splits splits per tile, the tile's last CTA merging them, three calls on one handle (one stream): the tiles'
    counters are left zero, so each call merges again. Call 1 and 3 take the same q (with a NaN in one query row:
    that row NaN, the others right), call 2 another; outputs poisoned before each. Call 3 repeats call 1's bits
    (the merge's order does not depend on which CTA is last)."""
    torch = need_cuda(backend)
    dtype = torch.bfloat16
    kc, vc, lens, table, tkc, tvc, tlens, ttable = split_case(torch, rng, page, hkv, d, dtype)
    nan_at = (0, sq - 1, hq - 1)  # the last head: the last row of the last tile of sequence 0
    outs = []
    for q_seed in (1, 2, 1):
        q = np.random.default_rng(q_seed).standard_normal((3, sq, hq, d)).astype(np.float32)
        tq, q = to_device(torch, q, dtype)
        if q_seed == 1:
            tq[nan_at] = float("nan")
        out = torch.full_like(tq, float("nan"))
        o, lse = flashc.attention_with_kvcache(
            tq, tkc, tvc, cache_seqlens=tlens, block_table=ttable, causal=True, return_lse=True, backend=backend,
            num_splits=splits, out=out,
        )  # fmt: skip
        torch.cuda.synchronize()
        assert flashc.last_backend() == backend
        ref_o, ref_lse = reference(q, kc, vc, None, None, lens, table, page, causal=True)
        base_o = plain_lowp(torch, q, kc, vc, None, None, lens, table, page, True, None, dtype)
        if q_seed == 1:
            check_cuda_nan_row(o, lse, ref_o, ref_lse, base_o, nan_at, "bf16")
        else:
            check_cuda(o, lse, ref_o, ref_lse, base_o, "bf16")
        outs.append((o.clone(), lse.clone()))
    assert same_bits(torch, outs[0][0], outs[2][0]) and same_bits(torch, outs[0][1], outs[2][1]), "the same bits again"


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_cuda_graph_replays_split_merge(rng, backend):
    """A call of 32 splits per tile captured in a CUDA graph and replayed five times, with new lengths and q each time
    and an eager call of another split count on the same stream (the same handle and counters) between replays:
    the last CTAs leave the counters zero for the next launch, whichever it is."""
    torch = need_cuda(backend)
    dtype, page, sq, hq, hkv, d = torch.bfloat16, 64, 1, 32, 8, 128
    kc, vc, lens, table, tkc, tvc, tlens, ttable = split_case(torch, rng, page, hkv, d, dtype)
    tq, _ = to_device(torch, rng.standard_normal((3, sq, hq, d)).astype(np.float32), dtype)

    def step(n):
        return flashc.attention_with_kvcache(tq, tkc, tvc, cache_seqlens=tlens, block_table=ttable, causal=True,
                                             return_lse=True, backend=backend, num_splits=n)  # fmt: skip

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the warm-up grows the handle's workspace and zeroed memory outside the capture
        step(32)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        o, lse = step(32)
    for replay, new_lens in enumerate(([8192, 0, 3001], [17, 8000, 0], [4096, 4097, 1], [0, 0, 8192], [64, 65, 63])):
        tlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        tq.copy_(torch.randn_like(tq))
        torch.cuda.synchronize()
        q = tq.float().cpu().numpy()
        lens_np = np.array(new_lens, dtype=np.int32)
        ref_o, ref_lse = reference(q, kc, vc, None, None, lens_np, table, page, causal=True)
        base_o = plain_lowp(torch, q, kc, vc, None, None, lens_np, table, page, True, None, dtype)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        with torch.cuda.stream(stream):
            graph.replay()
            if replay % 2:
                eager_o, eager_lse = step(7)
        torch.cuda.synchronize()
        check_cuda(o, lse, ref_o, ref_lse, base_o, "bf16")
        if replay % 2:
            check_cuda(eager_o, eager_lse, ref_o, ref_lse, base_o, "bf16")


def test_cuda_graph_capture(rng):
    """attention_with_kvcache captured in a CUDA graph (lengths and block table on the device, no host sync), replayed
    after changing cache_seqlens, q and the new k/v in place: each replay appends and attends at the new lengths."""
    torch = need_cuda("auto")
    dtype, page, hq, hkv, d = torch.bfloat16, 16, 8, 2, 64
    kc, vc, k, v, lens, table = make_cache(rng, batch=2, capacity=256, hkv=hkv, d=d, page=page, cached=[100, 37], sn=1)
    q = rng.standard_normal((2, 1, hq, d)).astype(np.float32)
    (tq, _), (tkc, _), (tvc, _), (tk, _), (tv, _) = (to_device(torch, x, dtype) for x in (q, kc, vc, k, v))
    tlens = torch.from_numpy(lens).cuda()
    ttable = torch.from_numpy(np.ascontiguousarray(table)).cuda()

    def step():
        return flashc.attention_with_kvcache(tq, tkc, tvc, tk, tv, tlens, ttable, causal=True, return_lse=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the warm-up grows the handle's workspace outside the capture
        step()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        o, lse = step()
    for new_lens in ([150, 60], [7, 200]):
        tlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        tq.copy_(torch.randn_like(tq))
        tk.copy_(torch.randn_like(tk))
        tv.copy_(torch.randn_like(tv))
        torch.cuda.synchronize()
        kc0, vc0 = tkc.float().cpu().numpy(), tvc.float().cpu().numpy()
        qn, kn, vn = (x.float().cpu().numpy() for x in (tq, tk, tv))
        lens_np = np.array(new_lens, dtype=np.int32)
        ref_o, ref_lse = reference(qn, kc0, vc0, kn, vn, lens_np, table, page, causal=True)
        base_o = plain_lowp(torch, qn, kc0, vc0, kn, vn, lens_np, table, page, True, None, dtype)
        graph.replay()
        torch.cuda.synchronize()
        check_cuda(o, lse, ref_o, ref_lse, base_o, "bf16")
        want_k, _ = expected_caches(kc0, vc0, kn, vn, lens_np, table, page)
        assert np.array_equal(tkc.float().cpu().numpy(), want_k), "the replay appends at the new lengths"


def fresh_stream_then_warm_capture(torch, call, out):
    """PyTorch's usual capture (a warm-up under torch.cuda.stream(s), then torch.cuda.graph(g), which captures on a
    stream of its own): flashc's first call on that stream raises the clear RuntimeError and leaves nothing broken;
    a capture on the warmed-up stream s then replays the eager result into out."""
    from flashc import _ops

    graph = torch.cuda.CUDAGraph()
    usual = torch.cuda.graph(graph)  # its capture stream: PyTorch's default one
    side = torch.cuda.Stream()
    while side.cuda_stream == usual.capture_stream.cuda_stream:  # streams come from a pool: another one
        side = torch.cuda.Stream()
    _ops._tls.handles.clear()  # this thread's handles: every stream is new to flashc
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    side.synchronize()
    want = out.clone()
    with pytest.raises(RuntimeError, match="first flashc call on a CUDA stream cannot be captured"), usual:
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("path", ["extension", "python"])
def test_cuda_graph_on_a_fresh_stream(monkeypatch, path):
    """attention_with_kvcache through the C++ extension's path and the Python path alike (8k keys at batch 1: split
    keys, partials in the stream's workspace)."""
    torch = need_cuda("auto")
    if path == "python":
        monkeypatch.setattr(kvc, "_fast", False)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    kc, vc = (torch.randn(1, 8192, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "kv")
    out = torch.full_like(q, float("nan"))
    fresh_stream_then_warm_capture(torch, lambda: flashc.attention_with_kvcache(q, kc, vc, causal=True, out=out), out)


def test_cuda_graph_numpy_style_call_on_a_fresh_stream():
    """flashc.attention on CUDA tensors (the prepared-call API) takes the same per-stream handles."""
    torch = need_cuda("auto")
    gen = torch.Generator(device="cuda").manual_seed(8)
    q, k, v = (torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "qkv")
    out = torch.empty_like(q)
    fresh_stream_then_warm_capture(torch, flashc.prepare_forward(q, k, v, causal=True, out=out), out)


def test_cuda_graph_survives_a_growing_workspace():
    """A graph captured on a stream keeps its workspace when a larger call on that stream grows the handle's: the
    old memory is kept for the graph (flashc.h, the handle), not freed under it. The replay after the growth (and
    after filling fresh allocations with NaN, which would land in freed memory) gives the eager result."""
    torch = need_cuda("cuda-mma")
    gen = torch.Generator(device="cuda").manual_seed(49)

    def case(batch, cap):
        q = torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        kc, vc = (torch.randn(batch, cap, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "kv")
        return q, kc, vc, torch.full((batch,), cap, dtype=torch.int32, device="cuda")

    small, large = case(1, 4096), case(8, 32768)  # decoding splits the keys: partials in the workspace

    def step(q, kc, vc, lens):
        return flashc.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, backend="cuda-mma")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        want = step(*small).clone()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        o = step(*small)
    with torch.cuda.stream(stream):  # the workspace grows on the same handle
        step(*large)
    stream.synchronize()
    junk = [torch.full((1 << 24,), float("nan"), device="cuda") for _ in range(8)]
    o.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    del junk
    assert torch.equal(o, want)

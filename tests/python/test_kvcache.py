"""flashc.attention_with_kvcache (flashc_forward_kvcache) on cpu and cpu-ref, numpy and torch, against a plain fp64
computation written here: each sequence's cache gathered into dense [len, heads_kv, d] form (the appended rows
included), then softmax attention with the mask from its definition. Also: the cache is written in place exactly
where k/v belong and nowhere else, bad block tables and lengths are refused naming the value, the struct mirrors
the library's, the torch operator (opcheck, torch.compile), and the CUDA backends' refusal."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

import flashc
from flashc import kvcache as kvc

from conftest import need_backend

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
    wl, wr = window if window is not None else (-1, -1)
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
            i = np.arange(sq)[:, None]
            j = np.arange(n)[None, :]
            diag = i + n - sq
            seen = np.ones((sq, n), bool)
            if causal:
                seen &= j <= diag
            if wl >= 0:
                seen &= j >= diag - wl
            if wr >= 0:
                seen &= j <= diag + wr
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


def test_cuda_refuses(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = "cuda"
    q = torch.randn(1, 1, 4, 64, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(1, 128, 2, 64, device=dev, dtype=torch.bfloat16)
    lens = torch.tensor([100], dtype=torch.int32, device=dev)
    with pytest.raises(NotImplementedError):
        flashc.attention_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens)

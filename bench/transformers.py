#!/usr/bin/env python3
"""bench/transformers.py — flashc inside a Hugging Face transformers Llama, against attn_implementation="sdpa".

    python bench/transformers.py --csv bench/results/transformers.csv      (the lent GPU: bf16, about a minute)
    python bench/transformers.py --device cpu --quick                      (host-sized smoke run in fp32, as the
                                                                            tests run it)

The model. One LlamaForCausalLM with random weights (seed 0, std 0.02), built once: by default 8 layers, hidden
2048, 16 query / 4 KV heads (head_dim 128), intermediate 5632, vocabulary 32000 (Llama 2's), bf16 on CUDA and
fp32 on the CPU (--dtype to choose). Both implementations run on these weights: the model switches between them with
model.set_attn_implementation(), flashc's under the name flashc.hf.register() returns. They take turns
(flashc, sdpa, flashc, sdpa, ...) so that the GPU's clock and the allocator's state weigh on both alike.

Workloads.
  train-step  forward + causal LM loss (labels = inputs) + backward + AdamW step (lr 1e-5, fused on CUDA) +
              zero_grad, batch 1 x each --seqlens; --warmup untimed steps per implementation, then --steps
              timed ones each; ms = the median step, tokens/s = seqlen / ms. Both implementations train the
              same weights in turn (the step's cost does not depend on the values). Before timing, one batch
              goes forward with each on the same weights: max |Δ logits| / max |logit| above 1e-4 (fp32) or
              0.1 (bf16) is a FAIL; it and both losses are in `note`.
              With --padded the batch is 4 sequences of each --seqlens, sequence b's last b/8 of them padding
              (attention_mask 0, labels -100: transformers' padded batch), tokens/s counts the real tokens, the
              check compares the real positions' logits, and flashc runs it both ways flashc.hf offers: unpadded
              through varlen (register(), the default) and as attn_mask (register(padding="mask")); their rows'
              config ends in "padded varlen" / "padded attn_mask".
  prefill / decodeN
              model.generate(prompt of --prompt random tokens, batch 1, max_new_tokens=--decode-tokens,
              do_sample=False, no EOS: every run generates N tokens) with transformers' default dynamic cache.
              A logits processor records a mark when the first token's logits are ready: prefill ms = start to
              that mark (the prompt's forward); decode ms = that mark to the end (N − 1 one-token forward
              steps, the first token coming from the prefill). tokens/s = prompt / prefill and (N − 1) / decode.
              --warmup untimed generations per implementation, then --steps timed ones each; medians.
              Checks: the greedy tokens of both implementations must be the same, and the prompt's last-position
              logits are compared (max |Δ| in `note`). In fp32 a difference is a FAIL; in bf16 greedy decoding
              may diverge where two logits are within rounding, so a difference is reported ("differ") with the
              first step that differs.
Times are CUDA events on the GPU (the caller's view: host overhead between kernels counts), perf_counter on the
host.

Output: a table on stdout and, with --csv, rows in the results schema of bench/compare.py's header (date, device,
commit, impl, dtype, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, pass, world, threads, ms,
tflops, gbps, max_abs_err, rel_l2_err), then config, status, speedup, baseline, repeats, note. impl is
"flashc:<backend>" (the backend flashc's "auto" picked for the workload's forward attention calls; a decode row
names the one of its one-token steps) or "torch:sdpa"; seqlen_q/seqlen_k are the workload's attention shape
(decode: 1 query over the last step's prompt + N - 1 keys); speedup = flashc's tokens/s over sdpa's;
note = tokens/s and, on flashc's rows, the ratio and the check. tflops, gbps and the error columns are empty:
the errors of the schema are against an fp64 reference, which an end-to-end model has not.
"""

from __future__ import annotations

import argparse
import datetime
import math
import pathlib
import statistics
import sys
import time

# This file is named transformers.py: with its folder first on sys.path (as `python bench/transformers.py` puts it),
# `import transformers` would import this script again instead of the library.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

try:
    import flashc
except ImportError:  # run from a checkout without `pip install ./python` (then FLASHC_LIBRARY names the lib)
    sys.path.insert(0, str(_HERE.parent / "python"))
    import flashc

from flashc.testing import engine, impls, report  # noqa: E402

COLUMNS = engine.SCHEMA + ["config", "status", "speedup", "baseline", "repeats", "note"]
SDPA = "sdpa"
# The train-step check, max |Δ logits| / max |logit| between the two implementations on the same batch and weights:
# fp32 rounding, or bf16's (measured 0.019 on the CPU at 8 layers, hidden 2048, seq 256). A wrong mask or scale
# moves the logits by their own size.
TOLERANCE = {"f32": 1e-4, "bf16": 0.1}


# Sizes: the benchmark's (the model on the GPU), and --quick's (what the tests run on the CPU). An option
# given on the command line wins over both.
FULL = dict(layers=8, hidden=2048, heads=16, kv_heads=4, vocab=32000, seqlens="4096,8192", prompt=4096,
            decode_tokens=128, steps=20, warmup=3)  # fmt: skip
QUICK = dict(layers=2, hidden=128, heads=4, kv_heads=2, vocab=1024, seqlens="64,128", prompt=128, decode_tokens=8,
             steps=3, warmup=1)  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
        epilog="See the header of bench/transformers.py for the method.",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda (bf16) or cpu (fp32, a smoke run)")
    p.add_argument("--dtype", choices=["bf16", "f32"], default=None, help="default: bf16 on cuda, f32 on cpu")
    p.add_argument("--layers", type=int, help="default 8")
    p.add_argument("--hidden", type=int, help="default 2048")
    p.add_argument("--heads", type=int, help="query heads, default 16 (head_dim = hidden / heads)")
    p.add_argument("--kv-heads", type=int, help="default 4")
    p.add_argument("--intermediate", type=int, help="MLP width (default 2.75 x hidden: 5632 at 2048)")
    p.add_argument("--vocab", type=int, help="default 32000")
    p.add_argument("--seqlens", help="training steps' sequence lengths (batch 1), comma-separated; default 4096,8192")
    p.add_argument("--prompt", type=int, help="prompt length of the generation workload, default 4096")
    p.add_argument("--decode-tokens", type=int, help="max_new_tokens of the generation workload, default 128")
    p.add_argument("--steps", type=int, help="timed training steps and generations per implementation, default 20")
    p.add_argument("--warmup", type=int, help="untimed ones before them, per implementation, default 3")
    p.add_argument("--skip", default="", help="workloads to leave out: train, generate (comma-separated)")
    p.add_argument(
        "--padded",
        action="store_true",
        help="training steps on a padded batch of 4 (see the header), flashc's varlen and attn_mask routes",
    )
    p.add_argument("--csv", default=None, help="write the rows here (results schema of bench/compare.py)")
    p.add_argument("--append", action="store_true", help="append to --csv instead of replacing it")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a CPU check: 2 layers, hidden 128, 4/2 heads, vocab 1024, seqlens 64,128, prompt 128, "
        "8 decode tokens, 3 steps, 1 warm-up, weights drawn with std 0.2 (attention far from uniform)",
    )
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.seqlens = [int(s) for s in args.seqlens.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seqlens {args.seqlens!r}: give comma-separated integers, e.g. 4096,8192")
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if not args.skip <= {"train", "generate"}:
        p.error(f"--skip {','.join(sorted(args.skip))}: use train, generate")
    for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "prompt", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.decode_tokens < 2:
        p.error(f"--decode-tokens must be at least 2 (the first comes from the prefill), not {args.decode_tokens}")
    if args.warmup < 0 or not args.seqlens or min(args.seqlens) < 2:
        p.error("--warmup must be >= 0 and --seqlens lengths >= 2")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error(f"--hidden {args.hidden} must divide by --heads {args.heads}, --heads by --kv-heads {args.kv_heads}")
    if args.intermediate is None:
        args.intermediate = 64 * math.ceil(2.75 * args.hidden / 64)
    return args


# ---- clocks ------------------------------------------------------------------------------------------------------
class Clock:
    """Marks on the device's timeline: CUDA events (recorded without a sync) or perf_counter on the host."""

    def __init__(self, torch, device: str):
        self.torch, self.cuda = torch, device == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def ms(self, a, b) -> float:
        if not self.cuda:
            return (b - a) * 1e3
        b.synchronize()
        return a.elapsed_time(b)


# ---- the model ---------------------------------------------------------------------------------------------------
def build_model(args, torch, transformers, dtype, device):
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(max(args.seqlens), args.prompt + args.decode_tokens),
        attention_dropout=0.0,
        initializer_range=0.2 if args.quick else 0.02,
        bos_token_id=None,
        eos_token_id=None,  # no EOS: every generation runs its N tokens
        pad_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):  # the weights are drawn where they live: no 1 GB copy from the host
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=SDPA, dtype=dtype)


def use(model, name: str) -> None:
    model.set_attn_implementation(name)
    assert model.config._attn_implementation == name, (model.config._attn_implementation, name)


# ---- workloads ---------------------------------------------------------------------------------------------------
PADDED_BATCH = 4  # --padded: sequence b of the batch has its last b/8 tokens padding


def train_batch(args, seqlen, torch, device):
    """(input_ids, attention_mask or None, labels, real tokens) of one seqlen's training step."""
    g = torch.Generator().manual_seed(seqlen)
    batch = PADDED_BATCH if args.padded else 1
    ids = torch.randint(0, args.vocab, (batch, seqlen), generator=g)
    if not args.padded:
        return ids.to(device), None, ids.to(device), seqlen
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, seqlen - b * seqlen // 8 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids.to(device), mask.to(device), labels.to(device), int(mask.sum())


def train(model, names, seqlen, args, torch, clock, device) -> dict:
    """{name: {'ms': median step, 'loss': loss of the check batch, 'backend': flashc's last}, 'logits_rel': {name:
    the check against the last name's logits}, 'tokens': real tokens a step} for one seqlen."""
    ids, mask, labels, tokens = train_batch(args, seqlen, torch, device)
    out = {n: {"samples": []} for n in names}
    model.train()
    with torch.no_grad():  # the check: the logits and loss of the same batch on the same weights
        for n in names:
            use(model, n)
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
            out[n]["loss"], out[n]["logits"] = o.loss.float().item(), o.logits
            out[n]["backend"] = flashc.last_backend()  # flashc's: what "auto" picked for this forward
        real = slice(None) if mask is None else mask.bool()
        want = out[names[-1]]["logits"].float()[real]
        out["logits_rel"] = {
            n: ((out[n].pop("logits").float()[real] - want).abs().max() / want.abs().max()).item() for n in names[:-1]
        }
        out[names[-1]].pop("logits")
        out["tokens"] = tokens
        del want, o
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(args.warmup + args.steps):
        for n in names:
            use(model, n)
            a = clock.mark()
            step()
            b = clock.mark()
            if i >= args.warmup:
                out[n]["samples"].append((a, b))
    for n in names:
        out[n]["ms"] = statistics.median(clock.ms(a, b) for a, b in out[n]["samples"])
    return out  # the optimizer's state goes with this frame


def generate(model, names, args, torch, transformers, clock, device) -> dict:
    """{name: {'prefill_ms', 'decode_ms', 'tokens', 'logits', backends}} of the generation workload."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=g).to(device)
    mask = torch.ones_like(prompt)
    model.eval()

    class FirstLogits(transformers.LogitsProcessor):
        """Marks the end of the prefill: generate calls it first with the prompt's last logits."""

        def __init__(self):
            self.mark, self.backend = None, ""

        def __call__(self, input_ids, scores):
            if self.mark is None:
                self.mark, self.backend = clock.mark(), flashc.last_backend()
            return scores

    out = {n: {"prefill": [], "decode": []} for n in names}
    with torch.no_grad():
        for n in names:  # the check: the prompt's last logits on the same weights
            use(model, n)
            out[n]["logits"] = model(input_ids=prompt, attention_mask=mask, logits_to_keep=1).logits[0, -1].float()
        for i in range(args.warmup + args.steps):
            for n in names:
                use(model, n)
                first = FirstLogits()
                a = clock.mark()
                seq = model.generate(
                    input_ids=prompt,
                    attention_mask=mask,
                    max_new_tokens=args.decode_tokens,
                    do_sample=False,
                    logits_processor=transformers.LogitsProcessorList([first]),
                )
                b = clock.mark()
                if seq.shape[1] != args.prompt + args.decode_tokens:
                    made = seq.shape[1] - args.prompt
                    raise SystemExit(f"{n}: generate made {made} tokens, not {args.decode_tokens}")
                if i == 0:
                    out[n]["tokens"] = seq[0, args.prompt :].tolist()
                    out[n]["prefill_backend"] = first.backend
                    out[n]["decode_backend"] = flashc.last_backend()
                if i >= args.warmup:
                    out[n]["prefill"].append((a, first.mark))
                    out[n]["decode"].append((first.mark, b))
    for n in names:
        out[n]["prefill_ms"] = statistics.median(clock.ms(a, b) for a, b in out[n]["prefill"])
        out[n]["decode_ms"] = statistics.median(clock.ms(a, b) for a, b in out[n]["decode"])
    return out


# ---- rows --------------------------------------------------------------------------------------------------------
def impl_name(name: str, backend: str) -> str:
    return "torch:sdpa" if name == SDPA else f"flashc:{backend or 'auto'}"


def rows_of(base: dict, pass_: str, shape: tuple, tokens: int, fc: tuple, sd_ms: float, status: str, check: str):
    """The two rows (flashc's, sdpa's) of one workload. shape: (seqlen_q, seqlen_k); tokens: what one timed
    interval makes; fc: (impl, ms) of flashc's."""
    (fc_impl, fc_ms), rate = fc, (lambda ms: tokens / (ms / 1e3))
    ratio = rate(fc_ms) / rate(sd_ms)
    common = dict(base, seqlen_q=shape[0], seqlen_k=shape[1], baseline="torch:sdpa", **{"pass": pass_})
    mine = dict(impl=fc_impl, ms=round(fc_ms, 4), tok_s=rate(fc_ms), status=status, speedup=round(ratio, 4))
    mine["note"] = f"{rate(fc_ms):.6g} tok/s; flashc/sdpa {ratio:.3f}x; {check}"
    peer = dict(impl="torch:sdpa", ms=round(sd_ms, 4), tok_s=rate(sd_ms), status="", speedup=1.0)
    peer["note"] = f"{rate(sd_ms):.6g} tok/s"
    return [dict(common, **mine), dict(common, **peer)]


def print_rows(rows) -> None:
    for r in rows:
        route = r["config"].rpartition(" padded")[2].strip()  # --padded: varlen / attn_mask (flashc's rows)
        impl = f"{r['impl']} {route}" if route else r["impl"]
        print(
            f"{r['pass']:<11} {r['seqlen_q']:>6} {r['seqlen_k']:>6} {impl:<20} {r['ms']:>10.4g} "
            f"{r['tok_s']:>12.6g} {r['speedup']:>8.3f} {r['status'] or '-':<7} {r['note'].split('; ', 2)[-1]}"
        )


def first_difference(a: list, b: list) -> int:
    """The index of the first differing token (len if none)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = impls.torch_or_none()
    if torch is None:
        raise SystemExit("bench/transformers.py needs torch (pip install torch)")
    try:
        import transformers
    except ImportError:
        raise SystemExit("bench/transformers.py needs transformers (pip install transformers)") from None
    import flashc.hf

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs torch with a CUDA device (--device cpu for a smoke run)")
    dname = args.dtype or ("bf16" if device == "cuda" else "f32")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dname]
    name = flashc.hf.register()
    names = [name, flashc.hf.register(padding="mask"), SDPA] if args.padded else [name, SDPA]
    clock = Clock(torch, device)
    model = build_model(args, torch, transformers, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    config = f"llama {args.layers}x{args.hidden} ffn{args.intermediate} vocab{args.vocab}"
    base = dict(
        date=datetime.date.today().isoformat(),
        device=impls.device_name(device),
        commit=engine.git_commit(str(_HERE)),
        dtype=dname,
        batch=1,
        heads_q=args.heads,
        heads_kv=args.kv_heads,
        head_dim=args.hidden // args.heads,
        causal=1,
        world=1,
        threads=torch.get_num_threads() if device == "cpu" else 0,
        config=config,
        repeats=args.steps,
    )
    print(
        f"flashc {flashc.__version__} ({flashc.library_path}) | transformers {transformers.__version__} | "
        f"torch {torch.__version__} | {base['device']} | {config}, {args.heads}/{args.kv_heads} heads, "
        f"{params / 1e6:.1f}M parameters, {dname} | {args.warmup} warm-up + {args.steps} timed each, interleaved"
    )
    print(f"{'pass':<11} {'sq':>6} {'sk':>6} {'impl':<20} {'ms':>10} {'tok/s':>12} {'speedup':>8} {'status':<7} check")
    rows = []

    def emit(new):
        print_rows(new)
        rows.extend(new)
        if args.csv:  # after each workload, so an interrupted run keeps what it measured
            report.write_csv(new, args.csv, COLUMNS, append=args.append or len(rows) > len(new))

    if "train" not in args.skip:
        for s in args.seqlens:
            t = train(model, names, s, args, torch, clock, device)
            sd = t[SDPA]
            for i, n in enumerate(names[:-1]):
                fc, rel = t[n], t["logits_rel"][n]
                status = "pass" if rel <= TOLERANCE[dname] else "FAIL"
                check = f"logits max |Δ| / max |logit| {rel:.3g}, loss {fc['loss']:.6g} vs {sd['loss']:.6g}"
                route = (
                    dict(config=f"{config} padded {('varlen', 'attn_mask')[i]}", batch=PADDED_BATCH)
                    if args.padded
                    else {}
                )
                new = rows_of(dict(base, **route), "train-step", (s, s), t["tokens"], (impl_name(n, fc["backend"]),
                              fc["ms"]), sd["ms"], status, check)  # fmt: skip
                if args.padded:
                    new[1]["config"] = f"{config} padded"
                emit(new if i == len(names) - 2 else new[:1])  # sdpa's row once, after the last flashc route
            if device == "cuda":
                torch.cuda.empty_cache()
    if "generate" not in args.skip:
        gen = generate(model, names, args, torch, transformers, clock, device)
        fc, sd = gen[name], gen[SDPA]
        n, p = args.decode_tokens, args.prompt
        differ = "FAIL" if dname == "f32" else "differ"  # see the header: bf16 greedy decoding may diverge
        dlogit = (fc["logits"] - sd["logits"]).abs().max().item()
        same = int(fc["logits"].argmax()) == int(sd["logits"].argmax())
        check = f"prompt's last logits max |Δ| {dlogit:.3g}, same argmax: {'yes' if same else 'no'}"
        impl = impl_name(name, fc["prefill_backend"])
        status = "pass" if same else differ
        new = rows_of(base, "prefill", (p, p), p, (impl, fc["prefill_ms"]), sd["prefill_ms"], status, check)
        at = first_difference(fc["tokens"], sd["tokens"])
        check = f"greedy tokens: {'same' if at == n else f'differ from token {at}'} ({n} tokens)"
        impl = impl_name(name, fc["decode_backend"])
        status = "pass" if at == n else differ
        shape = (1, p + n - 1)
        new += rows_of(base, f"decode{n}", shape, n - 1, (impl, fc["decode_ms"]), sd["decode_ms"], status, check)
        emit(new)
    if args.csv:
        print(f"wrote {len(rows)} rows to {args.csv}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

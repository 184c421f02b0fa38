"""flashc.testing — check every flashc backend against an fp64 reference and time it beside PyTorch.

    python -m flashc.testing --mode both --kernel cpu --no-gpu-reference      # one backend, host only
    python -m flashc.testing --mode forward --experiment --save-results         # everything, CSV + plots
    python -m flashc.testing --mode forward --seqlen-experiment --save-results --output-dir ./plots
    python -m flashc.testing --list                                             # backends and peers here

What runs. --kernel NAME[,NAME] picks flashc backends (default: the best usable one of --device);
--experiment runs every flashc backend and every peer. Peers (PyTorch, when installed): torch:cpu
(F.scaled_dot_product_attention on the host) and, on a GPU run, torch:flash, torch:efficient, torch:cudnn
and torch:math (pinned through torch.nn.attention.sdpa_kernel). Configurations: the ten of the CUDA-core
FA2 project (small-1 1/1/128/64 … stress-1 8/16/2048/64), the seqlen sweep 128…8192 at 4/8/·/64
(--seqlen-experiment), or --config B/H/S/D (repeatable; B/HQ:HKV/SQ:SK/D for GQA and unequal lengths).
Features (issue #48): --softcap CAP, --alibi (slopes 2^(−8(h+1)/H)), --dropout P and --head-dim-v DV apply to
every configuration; the reference computes them, flashc gets softcap=/alibi_slopes=/dropout_p= (with a fixed
seed, impls.DROPOUT_SEED: the reference draws the same Philox mask, cpu-ref from the seed itself, the other
engines from reference.Dropout), SDPA gets ALiBi as a float attn_mask and skips softcap (no mask can express it)
and dropout (its mask comes from torch's generator). A backend that refuses a feature gives a skipped row.
bench/compare.py --grid features/decode uses the same machinery (decode: flashc.testing.decode).

Checks. Every implementation's output is compared with an fp64 reference computed from the same rounded
inputs: flashc's cpu-ref backend in float64 (the default on the host), or materialised scores in torch
float64 (the default on a GPU run; --reference picks). Outputs are poisoned with NaN before the checked
call. A flashc row passes when max_abs_err <= tolerance·max(1, max|ref|) (--tolerance; default by dtype:
f64 1e-9, f32 1e-3, f16 1e-2, bf16 4e-2); peers are listed beside it with their own errors and never fail
the run. Metrics per row: ms (median), speed-up over the baseline (torch:cpu when it ran, else the first
row; --baseline), TFLOP/s (forward 4·b·h·sq·sk·d, halved for causal; backward 2.5×; with V's own head dim
dv, 2·(d + dv) and 2·(3d + 2dv) per pair), GB/s (inputs read and outputs written once), max_abs, mean_abs,
MSE, max_rel (|ref| floored at 1e-3·rms) and rel_l2 errors.
By default the run stops at the first failing row (--no-stop-on-failure runs everything); the exit status
is 1 when any flashc row failed.

Keeping CPU runs practical. The fp64 oracle is plain loops in double precision (a few GFLOP/s at best):
on two cores cpu-ref takes seconds at 4/8/512/64 and minutes at stress-1 (8/16/2048/64). So, with a host
reference:
  --max-ref-seqlen N (default 512): above N, the reference is computed on --ref-samples (default 2)
      (batch, kv-head) slices — the first, the last and random ones — and errors are measured on those
      slices only (the reference column says so); cpu-ref itself is not timed above N (a skipped row).
      0 removes the limit (cpu-ref is then timed up to 1024).
  --time-budget S (default 3 s per row of a host implementation, on any run): repeats shrink to fit,
      never below 3. GPU rows always run every --repeats.
On a GPU run the torch-fp64 reference has no limit (it goes one sequence at a time).

Timing: --warmup calls, then --repeats calls (median), rotating over --input-sets input sets so caches do
not flatter anyone; CUDA events on the GPU, perf_counter on the host. flashc is timed through prepared
calls (flashc.prepare_forward/prepare_backward) whose outputs are allocated beforehand.

--save-results writes to --output-dir: <stem>.csv (the docs/targets.md results schema followed by the framework's
columns), <stem>_summary.txt (means per implementation, failures), kernel_comparison[_bwd].png (time,
speed-up, TFLOP/s, GB/s per configuration) or seqlen_scaling[_bwd].png (log axes). A progress bar shows on a
terminal when tqdm is installed.
"""

from . import configs, metrics, reference  # noqa: F401

#!/usr/bin/env bash
# tests/cli/inputs.sh FLASHC CASE — the CLI's refusals of bad inputs, end to end (ctest cli_* entries):
#   fifo     q.npy, do.npy or meta.json is a FIFO: exit 2, "not a regular file", at once (opening a FIFO must
#            not wait for a writer)
#   options  `flashc ring` parses its options as every subcommand does: an underflowing --scale, a seed that is
#            no integer or too large, are refused with the same messages as `flashc check` gives (no MPI needed:
#            options are parsed before MPI starts)
#   varlen   packed batches (--varlen-q/k, --seqused-q/k): gen writes them, check (cpu against cpu-ref, forward and
#            backward, causal or not, from the data dir and from the flags) passes, run reads them; misuse (the
#            lengths with --batch or --seqlen-q/k, a seqused longer than its sequence or without --varlen-q, counts
#            that differ, --attn-mask, bench, a meta.json that does not fit the files) exits 2 with the message
set -uo pipefail
bin=$1 case=$2
failures=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_refusal WHAT MESSAGE CMD...: exit 2 within 10 s, stderr containing MESSAGE.
expect_refusal() {
  local what=$1 message=$2 rc=0 start err
  shift 2
  start=$(date +%s%N)
  err=$(timeout 10 "$@" 2>&1 >/dev/null) || rc=$?
  local ms=$((($(date +%s%N) - start) / 1000000))
  if [ "$rc" = 124 ]; then
    fail "$what: still running after 10 s (blocked?)"
  elif [ "$rc" != 2 ]; then
    fail "$what: exit $rc, expected 2 ($err)"
  elif ! grep -qF -- "$message" <<<"$err"; then
    fail "$what: the message '$err' lacks '$message'"
  else
    echo "ok    $what: exit 2 in $ms ms: $err"
  fi
}

case $case in
fifo)
  "$bin" gen --data "$dir/good" --batch 1 --seqlen-q 8 --heads 1 --head-dim 8 >/dev/null || fail "flashc gen"
  for name in q.npy do.npy meta.json; do
    rm -rf "$dir/d"
    cp -r "$dir/good" "$dir/d"
    rm "$dir/d/$name"
    mkfifo "$dir/d/$name"
    expect_refusal "run with $name a FIFO" "$dir/d/$name: not a regular file (a FIFO)" \
      "$bin" run --data "$dir/d" --backend cpu --mode both --threads 1
    expect_refusal "check with $name a FIFO" "not a regular file (a FIFO)" \
      "$bin" check --data "$dir/d" --backend cpu --mode both --threads 1
  done
  rm -rf "$dir/d"
  cp -r "$dir/good" "$dir/d"
  rm "$dir/d/k.npy"
  mkdir "$dir/d/k.npy"
  expect_refusal "run with k.npy a directory" "$dir/d/k.npy: not a regular file (a directory)" \
    "$bin" run --data "$dir/d" --backend cpu --mode fwd --threads 1
  ;;
options)
  for bad in "--scale 1e-50" "--scale 1e39" "--scale -1" "--scale nan" "--seed 1e23" \
             "--seed 99999999999999999999999" "--seed -1" "--heads 0" "--window 1" "--dtype f64"; do
    # shellcheck disable=SC2086
    ring_err=$(timeout 10 "$bin" ring $bad 2>&1 >/dev/null)
    ring_rc=$?
    # shellcheck disable=SC2086
    check_err=$(timeout 10 "$bin" check --backend cpu $bad 2>&1 >/dev/null)
    if [ "$ring_rc" != 2 ]; then
      fail "ring $bad: exit $ring_rc, expected 2 ($ring_err)"
    elif [ "${ring_err#flashc ring: }" != "${check_err#flashc check: }" ]; then
      fail "ring $bad: '$ring_err' differs from check's '$check_err'"
    else
      echo "ok    ring $bad: exit 2: $ring_err"
    fi
  done
  expect_refusal "ring --layout diagonal" "--layout: 'diagonal' is not contiguous or zigzag" \
    "$bin" ring --layout diagonal
  expect_refusal "ring --timeout-ms -5" "--timeout-ms: -5 is outside" "$bin" ring --timeout-ms -5
  expect_refusal "ring --data with --seqlen" "exclude each other" "$bin" ring --data "$dir" --seqlen 64
  expect_refusal "ring --seqlen-q (check's name)" "unknown option '--seqlen-q'" "$bin" ring --seqlen-q 64
  ;;
varlen)
  # expect_pass WHAT CMD...: exit 0 and PASS on the last line of its output.
  expect_pass() {
    local what=$1 rc=0 out
    shift
    out=$(timeout 60 "$@" 2>&1) || rc=$?
    if [ "$rc" != 0 ] || [ "$(tail -n 1 <<<"$out")" != PASS ]; then
      fail "$what: exit $rc: $out"
    else
      echo "ok    $what: PASS"
    fi
  }
  shape=(--heads 4 --heads-kv 2 --head-dim 24 --threads 1)
  "$bin" gen --data "$dir/v" --varlen-q 1,7,33 "${shape[@]::6}" >/dev/null || fail "gen --varlen-q"
  "$bin" gen --data "$dir/vk" --varlen-q 1,7,33 --varlen-k 5,1,40 "${shape[@]::6}" >/dev/null ||
    fail "gen --varlen-q --varlen-k"
  "$bin" gen --data "$dir/u" --varlen-q 1,7,33 --varlen-k 5,1,40 --seqused-q 0,4,30 --seqused-k 5,1,17 \
    "${shape[@]::6}" >/dev/null || fail "gen --seqused-q/k"
  if ! grep -q '"varlen_q": \[1, 7, 33\]' "$dir/u/meta.json" || ! grep -q '"seqused_k": \[5, 1, 17\]' "$dir/u/meta.json"
  then
    fail "meta.json lacks the packed batch: $(cat "$dir/u/meta.json")"
  fi
  for d in v vk u; do
    for causal in "" --causal; do
      # shellcheck disable=SC2086
      expect_pass "check --data $d $causal" "$bin" check --backend cpu --data "$dir/$d" --mode both --threads 1 $causal
    done
  done
  grep -q "rows past seqused: 0 elements" <<<"$("$bin" check --backend cpu --data "$dir/u" --threads 1)" ||
    fail "check of seqused data does not report the rows past seqused"
  expect_pass "check --varlen-q --seqused-q/k --causal bf16" "$bin" check --backend cpu --varlen-q 1,7,33 \
    --seqused-q 1,7,20 --seqused-k 1,3,33 --causal --dtype bf16 "${shape[@]}"
  expect_pass "check --varlen-q --window --dropout" "$bin" check --backend cpu --varlen-q 13,1,30 --varlen-k 9,2,31 \
    --window 4,2 --dropout 0.25 "${shape[@]}"
  if "$bin" run --backend cpu --data "$dir/u" --mode both --threads 1 >/dev/null; then
    for f in o lse dq dk dv; do [ -s "$dir/u/$f.npy" ] || fail "run on varlen data wrote no $f.npy"; done
  else
    fail "run on varlen data"
  fi
  expect_refusal "--varlen-q with --batch" "--varlen-q and --batch, --seqlen-q, --seqlen-k exclude each other" \
    "$bin" check --backend cpu --varlen-q 1,7 --batch 2
  expect_refusal "--varlen-q with --seqlen-k" "exclude each other" "$bin" gen --data "$dir/x" --varlen-q 1,7 --seqlen-k 9
  expect_refusal "--seqused-q past its sequence" "--seqused-q: sequence 1 uses 8 rows but has 7" \
    "$bin" check --backend cpu --varlen-q 1,7 --seqused-q 1,8
  expect_refusal "--seqused-k past its sequence" "--seqused-k: sequence 0 uses 6 rows but has 5" \
    "$bin" gen --data "$dir/x" --varlen-q 1,7 --varlen-k 5,7 --seqused-k 6,7
  expect_refusal "--seqused-q without --varlen-q" "--seqused-q needs --varlen-q" \
    "$bin" check --backend cpu --seqused-q 1,2
  expect_refusal "--varlen-k without --varlen-q" "--varlen-k needs --varlen-q" "$bin" check --backend cpu --varlen-k 3
  expect_refusal "--varlen-k count" "--varlen-k has 1 values and --varlen-q 2" \
    "$bin" check --backend cpu --varlen-q 1,7 --varlen-k 3
  expect_refusal "--varlen-q 0" "--varlen-q: 0 is outside" "$bin" check --backend cpu --varlen-q 0,4
  expect_refusal "--varlen-q with --attn-mask" "--attn-mask: a packed batch (--varlen-q) takes no mask" \
    "$bin" check --backend cpu --varlen-q 3,4 --attn-mask padding
  expect_refusal "--varlen-q with --data" "exclude each other" "$bin" check --backend cpu --data "$dir/v" --varlen-q 3
  expect_refusal "bench --varlen-q" "--varlen-q: bench times dense batches only" "$bin" bench --varlen-q 3,4
  expect_refusal "run --varlen-q" "unknown option '--varlen-q'" "$bin" run --data "$dir/v" --backend cpu --varlen-q 3
  rm -rf "$dir/x" && cp -r "$dir/v" "$dir/x"
  sed -i 's/"varlen_q": \[1, 7, 33\]/"varlen_q": [1, 7, 32]/' "$dir/x/meta.json"
  expect_refusal "meta.json's lengths not the files'" "do not hold meta.json's packed batch" \
    "$bin" check --backend cpu --data "$dir/x"
  rm -rf "$dir/x" && cp -r "$dir/u" "$dir/x"
  sed -i 's/"seqused_q": \[0, 4, 30\]/"seqused_q": [0, 4, 34]/' "$dir/x/meta.json"
  expect_refusal "meta.json's seqused_q past its sequence" "\"seqused_q\": sequence 2 uses 34 rows but has 33" \
    "$bin" run --backend cpu --data "$dir/x"
  sed -i 's/"seqused_q": \[0, 4, 34\]/"seqused_q": [0, 4.5, 30]/' "$dir/x/meta.json"
  expect_refusal "meta.json's seqused_q not integers" "\"seqused_q\": element 1 is not an integer" \
    "$bin" run --backend cpu --data "$dir/x"
  ;;
*)
  echo "inputs.sh: unknown case '$case' (fifo, options, varlen)" >&2
  exit 2
  ;;
esac
if [ "$failures" != 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi

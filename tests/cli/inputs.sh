#!/usr/bin/env bash
# tests/cli/inputs.sh FLASHC CASE — the CLI's refusals of bad inputs, end to end (ctest cli_* entries):
#   fifo     q.npy, do.npy or meta.json is a FIFO: exit 2, "not a regular file", at once (opening a FIFO must
#            not wait for a writer)
#   options  `flashc ring` parses its options as every subcommand does: an underflowing --scale, a seed that is
#            no integer or too large, are refused with the same messages as `flashc check` gives (no MPI needed:
#            options are parsed before MPI starts)
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
*)
  echo "inputs.sh: unknown case '$case' (fifo, options)" >&2
  exit 2
  ;;
esac
if [ "$failures" != 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi

#!/bin/sh
# --metrics FILE: rank 0 writes one JSON line per step (step, loss, grad_norm, lr,
# step_ms, tokens_per_s), every step whatever --log-every says, and the last line's loss
# is the printed final loss; a file that cannot be opened stops every rank (exit 2).
# Host backend, 2 ranks, --size tiny.
#   sh test_metrics.sh MPIEXEC TRAINER
set -eu
mpiexec="$1"
trainer="$2"
work=$(mktemp -d "${TMPDIR:-/tmp}/trainer-metrics-XXXXXX")
trap 'rm -rf "$work"' EXIT
run() {
  "$mpiexec" -n 2 --oversubscribe --bind-to none "$trainer" --size tiny --backend host "$@"
}
fail() {
  echo "FAILED: $*"
  cat "$work/log" 2>/dev/null || true
  echo "--- metrics:"; cat "$work/m.jsonl" 2>/dev/null || true
  exit 1
}

run --steps 6 --log-every 4 --metrics "$work/m.jsonl" >"$work/log" 2>&1 || fail "the run failed"
[ "$(wc -l <"$work/m.jsonl")" -eq 6 ] || fail "expected 6 lines, one per step"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  case "$line" in
    "{\"step\": $n, \"loss\": "*", \"grad_norm\": "*", \"lr\": "*", \"step_ms\": "*", \"tokens_per_s\": "*", \"skipped\": false}") ;;
    *) fail "line $n is not step $n's metrics: $line" ;;
  esac
done <"$work/m.jsonl"
last_loss=$(tail -n 1 "$work/m.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
grep -q "^final loss $last_loss at step 6\$" "$work/log" || fail "the last line's loss $last_loss is not the final loss"

if run --steps 2 --metrics "$work/no/such/dir/m.jsonl" >"$work/log" 2>&1; then
  fail "an unwritable --metrics file was accepted"
fi
grep -q "trainer: --metrics $work/no/such/dir/m.jsonl: cannot open it for writing" "$work/log" ||
  fail "no message naming the --metrics file"
echo "ok"

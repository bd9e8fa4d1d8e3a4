#!/bin/sh
# A resumed run ends exactly where an uninterrupted one does, across processes: the
# trainer program trains 20 steps saving every 10 (DIR/step-00010, DIR/step-00020), then a
# new mpiexec resumes from DIR/step-00010 and trains to step 20; the two "final loss"
# lines (printed with %.9g) must be identical. Host backend, 2 ranks, --size tiny; ARGS
# go to every run (e.g. --mode fsdp --params mxfp8).
#   sh test_resume.sh MPIEXEC TRAINER [ARGS...]
set -eu
mpiexec="$1"
trainer="$2"
shift 2
extra="$*"  # trainer flags have no spaces
work=$(mktemp -d "${TMPDIR:-/tmp}/trainer-resume-XXXXXX")
trap 'rm -rf "$work"' EXIT
run() {
  "$mpiexec" -n 2 --oversubscribe --bind-to none "$trainer" --size tiny --backend host "$@" $extra
}
fail() {
  echo "FAILED: $*"
  echo "--- first run:"; cat "$work/first.log" 2>/dev/null || true
  echo "--- resumed run:"; cat "$work/second.log" 2>/dev/null || true
  exit 1
}

run --steps 20 --save-dir "$work/ckpt" --save-every 10 --quiet >"$work/first.log" 2>&1 || fail "the first run failed"
for step in 00010 00020; do
  [ -f "$work/ckpt/step-$step/index.json" ] || fail "no checkpoint $work/ckpt/step-$step"
  grep -q "checkpoint of step ${step#000} to $work/ckpt/step-$step" "$work/first.log" ||
    fail "no 'saved checkpoint' line for step $step"
done

run --steps 20 --resume "$work/ckpt/step-00010" --quiet >"$work/second.log" 2>&1 || fail "the resumed run failed"
grep -q "^resumed from $work/ckpt/step-00010 at step 10 " "$work/second.log" || fail "no 'resumed from' line"
if grep -q "note: this run does not continue" "$work/second.log"; then fail "the resumed run is not identical"; fi

first=$(grep '^final loss ' "$work/first.log" || true)
second=$(grep '^final loss ' "$work/second.log" || true)
[ -n "$first" ] || fail "no final loss line"
[ "$first" = "$second" ] || fail "the final losses differ: '$first' vs '$second'"
echo "uninterrupted: $first"
echo "resumed:       $second"

#!/usr/bin/env bash
# One GPU session on the offline GPU host (an H200 or H100), as used for the committed results (see docs/reproducing.md).
# Runs, in order, within a wall-clock budget:
#   1. TLX self-checks (python -m kernels_tlx.<module> --quick --no-bench, concurrently) as a guard: a TLX config that fails
#      or hangs there is removed from the tiling file of this working copy before the sweeps (and reported);
#   2. the sweeps `experiment=<name> run_id=<id>` (resumable: rerunning with the same run_id continues);
#   3. the GPU tests (`make test-gpu`, optionally filtered with -k; TESTS_FIRST=1: beside step 1 instead).
# Usage (from the repo root on the GPU host, after `source .gpubundle/env.sh`):
#   TLX_CHECKS="norms" SWEEPS="norms_roofline:20261130_h200" SWEEP_ARGS="shape.grid.M=[262144]" \
#   TEST_K="norms" OUT=/tmp/out bash tools/device_run.sh      (results: /tmp/out/run_<exp>.tgz, /tmp/out/logs.tgz)
# Environment: OUT (output folder, required), TLX_CHECKS (space-separated kernels_tlx modules), SWEEPS
# (space-separated experiment:run_id), SWEEP_ARGS (extra Hydra overrides), SWEEP_BUDGET_S (seconds for all sweeps),
# TEST_K (pytest -k filter; "skip" skips the tests), HARDWARE (the sweeps' hardware= config: auto, the default, names
# h200 or h100 after the card; empty: none), TEST_BUDGET_S, TESTS_PARALLEL (1: upstream and TLX tests side
# by side; N > 1: one pytest process per test, N at a time, tools/gpu_tests_parallel.py), TEST_TIMEOUT_S (per test,
# with N > 1), TILING_FILES (tiling yaml per TLX check module,
# default configs/tiling/<module>_h200.yaml).
set -uo pipefail
: "${OUT:?set OUT}"
# everything but the result archives goes to $OUT/logs, packed into $OUT/logs.tgz after each step (a device call
# returns at most 8 files); GPU=<index> pins this instance to one GPU (two instances on a 2-GPU host run side by side)
RES="$OUT"; OUT="$(mktemp -d)/logs"; mkdir -p "$OUT" "$RES"   # logs outside $OUT: only the archives come back
pack() { tar czf "$RES/logs.tgz" -C "$(dirname "$OUT")" logs 2>/dev/null; }
[ -n "${GPU:-}" ] && export CUDA_VISIBLE_DEVICES="$GPU"
export PYTHONUNBUFFERED=1
# the commit measured (written by `git rev-parse --short=12 HEAD > .normfuse_git_sha` before the copy)
[ -s .normfuse_git_sha ] && export NORMFUSE_GIT_SHA="$(cat .normfuse_git_sha)"
TLX_PY=(env "PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE" python3)
nvidia-smi --query-gpu=name,power.limit,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/nvidia_smi.csv" 2>&1

run_tests() {  # make test-gpu = upstream pytest, then TLX pytest; TESTS_PARALLEL=1 runs the two side by side
  local kk=""; [ -n "${TEST_K:-}" ] && kk="-k '${TEST_K}'"   # expanded here: make would re-expand a literal \$
  if [ "${TESTS_PARALLEL:-0}" -gt 1 ]; then   # one pytest process per test, TESTS_PARALLEL at a time
    timeout -s INT "${TEST_BUDGET_S:-200}" python3 tools/gpu_tests_parallel.py --jobs "$TESTS_PARALLEL" \
      --timeout "${TEST_TIMEOUT_S:-300}" ${TEST_K:+-k "$TEST_K"} --log-dir "$OUT" > "$OUT/test_gpu.log" 2>&1
  elif [ "${TESTS_PARALLEL:-0}" = 1 ]; then
    local args=(-q --timeout 180 -p no:logging -m gpu); [ -n "${TEST_K:-}" ] && args+=(-k "$TEST_K")
    timeout -s INT "${TEST_BUDGET_S:-200}" python3 -m pytest "${args[@]}" tests --ignore=tests/tlx \
      > "$OUT/test_gpu.log" 2>&1 &
    timeout -s INT "${TEST_BUDGET_S:-200}" "${TLX_PY[@]}" -m pytest "${args[@]}" tests/tlx > "$OUT/test_gpu_tlx.log" 2>&1
    echo "test-gpu tlx rc=$?" | tee -a "$OUT/guard.log"; wait
  else
    timeout -s INT "${TEST_BUDGET_S:-200}" make -k test-gpu PYTEST_ARGS="-q --timeout 180 -p no:logging $kk" \
      > "$OUT/test_gpu.log" 2>&1
  fi
  echo "test-gpu rc=$?" | tee -a "$OUT/guard.log"; pack
}

# the TLX self-checks run concurrently (compilation is CPU-bound; correctness only, nothing is timed); with
# TESTS_FIRST=1 the GPU tests run beside them too, before the sweeps instead of after
for mod in ${TLX_CHECKS:-}; do
  ( timeout -s INT "${TLX_CHECK_BUDGET_S:-150}" "${TLX_PY[@]}" -m "kernels_tlx.$mod" --quick --no-bench \
      > "$OUT/tlx_${mod}_check.log" 2>&1; echo $? > "$OUT/tlx_${mod}_check.rc" ) &
done
[ "${TESTS_FIRST:-0}" = 1 ] && [ "${TEST_K:-}" != "skip" ] && run_tests &
wait
for mod in ${TLX_CHECKS:-}; do
  log="$OUT/tlx_${mod}_check.log"; rc=$(cat "$OUT/tlx_${mod}_check.rc" 2>/dev/null)
  tiling="${TILING_DIR:-configs/tiling}/${mod}_h200.yaml"
  # config names that failed (lines "FAIL" / the summary "N FAILURE(S): name ...") or hung ([run ] without result)
  bad=$(grep -E '^\[(run |nan |big )\] ' "$log" | grep -v -E ' ok( |$)' | awk '{print $3}' | sort -u)
  for name in $bad; do
    echo "guard: removing TLX config '$name' from $tiling (self-check rc=$rc)" | tee -a "$OUT/guard.log"
    sed -i "/{name: $name,/d; /{name: $name}/d" "$tiling"
  done
  echo "tlx self-check $mod rc=$rc" | tee -a "$OUT/guard.log"
done
pack

# HARDWARE: the hardware config the sweeps name (configs/hardware/<name>.yaml); "auto" (default) picks the config
# whose gpu_name_contains is in the name of the card this instance runs on (GPU=<index>, else card 0), so that
# meta.json records no mismatch on whichever card the device lent; none matching or "": none is passed. A hardware=
# in SWEEP_ARGS comes later on the command line and wins.
HW="${HARDWARE-auto}"
if [ "$HW" = auto ]; then
  HW=""; card=$(nvidia-smi -i "${GPU:-0}" --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  for f in configs/hardware/*.yaml; do
    want=$(sed -n 's/^gpu_name_contains: *//p' "$f")
    [ -n "$want" ] && [ -n "$card" ] && case "$card" in *"$want"*) HW=$(basename "$f" .yaml);; esac
  done
fi
start=$(date +%s)
for s in ${SWEEPS:-}; do
  exp=${s%%:*}; rid=${s#*:}
  left=$(( ${SWEEP_BUDGET_S:-300} - ($(date +%s) - start) ))
  [ "$left" -gt 20 ] || { echo "no time left for $exp" | tee -a "$OUT/guard.log"; continue; }
  timeout -s INT "$left" make run ARGS="experiment=$exp run_id=$rid point_timeout_s=${POINT_TIMEOUT_S:-120} ${HW:+hardware=$HW} ${SWEEP_ARGS:-}" \
    > "$OUT/sweep_${exp}.log" 2>&1
  echo "sweep $exp rc=$?" | tee -a "$OUT/guard.log"
  tar czf "$RES/run_${exp}.tgz" --exclude=logs "results/$exp/$rid" 2>/dev/null; pack
done

[ "${TESTS_FIRST:-0}" != 1 ] && [ "${TEST_K:-}" != "skip" ] && run_tests
tail -n 5 "$OUT"/sweep_*.log 2>/dev/null
grep -E "passed|failed|error|FAILED|TIMEOUT|ERROR" "$OUT/test_gpu.log" 2>/dev/null | tail -8
pack

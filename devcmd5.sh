#!/usr/bin/env bash
# one device call: FILL_IDLE_SMS self-checks (RMS, LN), then the paired sweeps
set -u
source .gpubundle/env.sh
export NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)
X=$OUT/x; mkdir -p $X
TPY=(env PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE:$PWD python3)
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.sm,clocks.max.sm --format=csv > $X/nvidia_smi.csv
( timeout 200 "${TPY[@]}" -m kernels_tlx.lazy_prenorm --quick --no-bench --variant rmsnorm --hang-timeout 60 \
    --config cluster_c4_defer_elem_fill70 --config cluster_c4_defer_elem_fill60 --config cluster_c8_defer_fill80 --config cluster_c8_defer_fill60 \
    > $X/selfcheck_fill.log 2>&1; echo $? > $X/selfcheck.rc ) &
( sleep 20; timeout 200 "${TPY[@]}" -m kernels_tlx.lazy_prenorm --quick --no-bench --variant layernorm --hang-timeout 60 \
    --config ln_cluster_c4_defer_elem_asm_mma_fill65 --config ln_cluster_c4_defer_elem_asm_mma_fill50 \
    > $X/selfcheck_ln_fill.log 2>&1; echo $? > $X/selfcheck_ln.rc ) &
wait
echo "selfcheck rc=$(cat $X/selfcheck.rc) ln rc=$(cat $X/selfcheck_ln.rc)"
grep -v " ok " $X/selfcheck_fill.log | tail -4; grep -v " ok " $X/selfcheck_ln_fill.log | tail -4
S=""
[ "$(cat $X/selfcheck.rc)" = 0 ] && S="lazy_prenorm_fill_rate:20261204_h200_fill_rate"
[ "$(cat $X/selfcheck_ln.rc)" = 0 ] && S="$S lazy_prenorm_ln_fill_rate:20261204_h200_ln_fill_rate"
if [ -n "$S" ]; then
  SWEEPS="$S" SWEEP_ARGS="replicates=2" SWEEP_BUDGET_S=400 \
    TEST_K=skip POINT_TIMEOUT_S=90 OUT=$X/run bash tools/device_run.sh > $X/device_run.log 2>&1
  tail -3 $X/device_run.log
fi
tar czf $OUT/all.tgz -C $OUT x

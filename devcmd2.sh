#!/usr/bin/env bash
# one device call: STATS_IN_PRODUCER self-check (odd shapes), paired sweep, Nsight Compute profile
set -u
source .gpubundle/env.sh
export NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)
X=$OUT/x; mkdir -p $X
TPY=(env PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE:$PWD python3)
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.sm,clocks.max.sm --format=csv > $X/nvidia_smi.csv
timeout 240 "${TPY[@]}" -m kernels_tlx.lazy_prenorm --quick --no-bench --variant rmsnorm --hang-timeout 60 \
    --config cluster_c2_defer_prod_asm --config cluster_c4_defer_prod_asm --config cluster_c2_t2_prod_asm \
    > $X/selfcheck_prod.log 2>&1; echo $? > $X/selfcheck.rc
echo "selfcheck rc=$(cat $X/selfcheck.rc)"; grep -v " ok " $X/selfcheck_prod.log | tail -8
if [ "$(cat $X/selfcheck.rc)" = 0 ]; then
  SWEEPS="lazy_prenorm_prod:20261204_h200_prod" SWEEP_ARGS="replicates=2" SWEEP_BUDGET_S=300 \
    TEST_K=skip POINT_TIMEOUT_S=90 OUT=$X/run bash tools/device_run.sh > $X/device_run.log 2>&1
  tail -3 $X/device_run.log
  timeout 100 "${TPY[@]}" -m tools.ncu_profile --out $X/ncu --rep-dir /tmp/reps \
    --targets lazy_c2prod_K2048 lazy_c2asm_K2048 > $X/ncu.log 2>&1; echo "ncu rc=$?"
fi
tar czf $OUT/all.tgz -C $OUT x

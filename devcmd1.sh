#!/usr/bin/env bash
# one device call: LN_SHIFT_SMEM self-check + bitwise test, paired sweep, Nsight Compute profile
set -u
source .gpubundle/env.sh
export NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)
X=$OUT/x; mkdir -p $X
TPY=(env PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE:$PWD python3)
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.sm,clocks.max.sm --format=csv > $X/nvidia_smi.csv
( timeout 200 "${TPY[@]}" -m kernels_tlx.lazy_prenorm --quick --no-bench --variant layernorm \
    --config ln_cluster_c2_defer_elem_asm_mma_smemshift --config ln_cluster_c4_defer_elem_asm_mma_smemshift \
    > $X/selfcheck_smemshift.log 2>&1; echo $? > $X/selfcheck.rc ) &
( timeout 200 "${TPY[@]}" -m pytest -q -p no:cacheprovider tests/tlx/test_lazy_prenorm_ln_mma_tlx.py -k smemshift \
    > $X/bitwise_smemshift.log 2>&1; echo $? > $X/bitwise.rc ) &
wait
echo "selfcheck rc=$(cat $X/selfcheck.rc) bitwise rc=$(cat $X/bitwise.rc)"
tail -3 $X/selfcheck_smemshift.log; tail -2 $X/bitwise_smemshift.log
if [ "$(cat $X/selfcheck.rc)" = 0 ]; then
  SWEEPS="lazy_prenorm_ln_smemshift:20261204_h200_smemshift" SWEEP_ARGS="replicates=2" SWEEP_BUDGET_S=300 \
    TEST_K=skip POINT_TIMEOUT_S=90 OUT=$X/run bash tools/device_run.sh > $X/device_run.log 2>&1
  tail -5 $X/device_run.log
  timeout 130 "${TPY[@]}" -m tools.ncu_profile --out $X/ncu --rep-dir /tmp/reps \
    --targets lazyln_c4mmass_K512 lazyln_c4mma_K512 > $X/ncu.log 2>&1; echo "ncu rc=$?"
fi
tar czf $OUT/all.tgz -C $OUT x
ls -la $OUT

#!/usr/bin/env bash
set -u
source .gpubundle/env.sh
export NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)
X=$OUT/x; mkdir -p $X
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.sm,clocks.max.sm --format=csv > $X/nvidia_smi.csv
timeout 420 env PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE:$PWD python3 -m tools.lazy_fill_probe --out $X/probe --rounds 20 > $X/probe.log 2>&1; echo "rc=$?"
tail -12 $X/probe.log
tar czf $OUT/all.tgz -C $OUT x

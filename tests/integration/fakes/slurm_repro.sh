#!/bin/sh
mode=$(cat mode.txt)
echo "job=$SLURM_JOB_ID attempt=$CUDABISECT_ATTEMPT blocking=$CUDA_LAUNCH_BLOCKING devices=$CUDA_VISIBLE_DEVICES start=$(date +%s.%N)" >> "$RUN_LOG"
case "$mode" in
  oom-once*)
    if [ "$CUDABISECT_ATTEMPT" = 1 ]; then
      python3 -c "import time; a = bytearray(700 << 20); a[::4096] = b'x' * len(a[::4096]); time.sleep(30)"
    fi ;;
esac
case "$mode" in
  *fault) echo "RuntimeError: CUDA error: an illegal memory access was encountered" >&2; exit 1 ;;
  hang) exec sleep 300 ;;
esac
sleep "${SLEEP:-0}"
echo "end=$(date +%s.%N)" >> "$RUN_LOG"
echo ok

#!/bin/sh
mode=$(cat mode.txt)
if [ -n "$PROBE_LOG" ]; then
  echo "$CUDABISECT_COMMIT ${CUDABISECT_WORKER:-none} ${CUDA_VISIBLE_DEVICES:-none} $CUDABISECT_WORKTREE" >> "$PROBE_LOG"
fi
show() { grep -v '^exit=' "$FIXTURES/$1"; }
case "$mode" in
  clean) echo "step ok"; exit 0 ;;
  fault) show native_oob_sync.log; exit 42 ;;
  torchfault) show torch_uaf_cached.log; exit 1 ;;
  oom) show torch_oom.log; exit 1 ;;
  mismatch) show torch_device_mismatch.log; exit 1 ;;
  segv) echo "about to crash"; kill -SEGV $$ ;;
  abort) kill -ABRT $$ ;;
  hang) sleep 60 & sleep 60; wait ;;
  hang-long) sleep 61 & echo $! > "$PID_DIR/bg.pid"; echo $$ > "$PID_DIR/main.pid"; sleep 61; wait ;;
  hang-worker)
    sleep 61 & echo $! > "$PID_DIR/bg.$CUDABISECT_COMMIT.pid"
    echo $$ > "$PID_DIR/main.$CUDABISECT_COMMIT.pid"; sleep 61; wait ;;
  infra-then-fault)
    if [ "$CUDABISECT_ATTEMPT" = 1 ]; then echo "RuntimeError: CUDA error: no CUDA-capable device is detected"; exit 1; fi
    show native_oob_sync.log; exit 42 ;;
  flaky)
    # The fault shows on the second run of a probe and later ones, never on the first.
    if [ "$CUDABISECT_ATTEMPT" -ge 2 ]; then show native_oob_sync.log; exit 42; fi
    echo "step ok"; exit 0 ;;
  coin)
    # Faults on about half the runs, decided by a hash of the commit and its run number: seeded, so a
    # rerun of the test sees the same runs.
    n=$(cat "$COIN_DIR/$CUDABISECT_COMMIT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COIN_DIR/$CUDABISECT_COMMIT"
    h=$(printf '%s-%s' "$CUDABISECT_COMMIT" "$n" | cksum | cut -d' ' -f1)
    if [ $((h % 2)) -eq 0 ]; then show native_oob_sync.log; exit 42; fi
    echo "step ok"; exit 0 ;;
  lie-once)
    # Runs clean the first time at each commit, then faults: a bad commit that misleads one run.
    n=$(cat "$COIN_DIR/$CUDABISECT_COMMIT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COIN_DIR/$CUDABISECT_COMMIT"
    if [ "$n" -ge 1 ]; then show native_oob_sync.log; exit 42; fi
    echo "step ok"; exit 0 ;;
  crowd)
    # Clean alone, on the first worker; on any other it finds what another worker left in a path they
    # share and faults like the target: a repro that does not bear parallel probes.
    if [ "${CUDABISECT_WORKER:-1}" != 1 ]; then show native_oob_sync.log; exit 42; fi
    echo "step ok"; exit 0 ;;
  env) env | grep -E '^(CUDA_LAUNCH_BLOCKING|CUDABISECT_[A-Z]+)=' | sort; exit 0 ;;
  tri-other|tri-target|tri-same-other|tri-same-target|tri-same-target-triton)
    case "$mode" in
      tri-other) file=pkg/ops.py; func=bias_gelu ;;
      tri-target) file=pkg/embed.py; func=hash_embed ;;
      *) file=pkg/model.py; func=forward ;;
    esac
    echo "Traceback (most recent call last):"
    echo "  File \"$CUDABISECT_WORKTREE/train.py\", line 40, in <module>"
    echo "    loss = step(batch)"
    echo "  File \"$CUDABISECT_WORKTREE/$file\", line $((20 + ${#mode})), in $func"
    echo "    out = kernel[grid](x, y)"
    case "$mode" in
      # As Triton's launcher reports a fault: no kernel named.
      *-triton) echo "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered" ;;
      *) echo "torch.AcceleratorError: CUDA error: operation not supported on global/shared address space" ;;
    esac
    exit 1 ;;
  import-err)
    echo "Traceback (most recent call last):"
    echo "  File \"$CUDABISECT_WORKTREE/train.py\", line 3, in <module>"
    echo "    import fancy_dataloader"
    echo "ModuleNotFoundError: No module named 'fancy_dataloader'"
    exit 1 ;;
  assert-err)
    echo "Traceback (most recent call last):"
    echo "  File \"$CUDABISECT_WORKTREE/train.py\", line 80, in <module>"
    echo "    assert loss < 10, loss"
    echo "AssertionError: 12.5"
    exit 1 ;;
esac
echo "unknown mode $mode"; exit 99

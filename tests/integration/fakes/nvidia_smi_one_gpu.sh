#!/bin/sh
# A stand-in for nvidia-smi on a machine with one 140 GiB GPU (index 0): 400 MiB in use before a run, and
# $FAKE_PEAK_MIB in use while one runs (what the driver reports while `-lms` samples).
case "$*" in
  *--query-gpu=index,memory.used,memory.total*)
    case "$*" in
      *-lms*) echo "0, ${FAKE_PEAK_MIB:-400}, 143771"; exec sleep 600 ;;
      *) echo "0, 400, 143771" ;;
    esac ;;
  *--query-gpu=index*) echo 0 ;;
esac
exit 0

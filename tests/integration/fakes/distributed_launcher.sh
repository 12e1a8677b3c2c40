#!/bin/sh
mode=$(cat mode.txt)
setsid sh -c 'setsid sh -c "echo \$\$ > $PID_DIR/escapee.pid; exec sleep 300" & exec sleep 300' &
RANK=0 WORLD_SIZE=2 python3 rank.py "$mode" & r0=$!
RANK=1 WORLD_SIZE=2 python3 rank.py "$mode" & r1=$!
wait $r0; s0=$?
wait $r1; s1=$?
exit $((s0 | s1))

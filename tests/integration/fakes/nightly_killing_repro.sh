#!/bin/sh
n=$(($(cat "$STATE/count.txt" 2>/dev/null || echo 0) + 1))
echo "$n" > "$STATE/count.txt"
if [ "$n" = "$(cat "$STATE/kill_at.txt" 2>/dev/null)" ]; then kill -KILL "$PPID"; exit 0; fi
exec ./repro.sh

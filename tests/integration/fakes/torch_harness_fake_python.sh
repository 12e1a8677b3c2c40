#!/bin/sh
script=$1; shift
grep -q "cudabisect's PyTorch harness" "$script/cudabisect_torch/__init__.py" || { echo "not the harness: $script"; exit 90; }
[ "$1 $2 $3 $4 $5 $6" = "--model toy.model:build --example-inputs toy.model:example_inputs --device auto" ] || { echo "bad args: $*"; exit 91; }
shift 6
echo "$script" >> harness_calls.txt
if [ "$1" = extract ]; then
  out=$(echo "$@" | sed 's/.*--out \([^ ]*\).*/\1/')
  mkdir -p "$out"
  printf 'import sys\nprint("@@cudabisect node=b2_lookup op=embedding kernel=embedding_gather begin")\nprint("RuntimeError: CUDA error: an illegal memory access was encountered")\nsys.exit(1)\n' > "$out/repro.py"
  exit 0
fi
exec "$CUDABISECT_BIN" harness --model model.toml --backend cpu "$@"

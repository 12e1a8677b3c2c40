import os, sys, time
import torch
start = time.time()
x = torch.randn(1 << 20, device="cuda")
idx = torch.randint(0, 1 << 20, (1 << 16,), device="cuda")
time.sleep(2)  # a training step's length, so the rounds show in the wall time
if open("state.txt").read().strip() == "bad":
    idx = idx + (1 << 30)
y = x[idx]
torch.cuda.synchronize()
with open(os.environ["RUN_LOG"], "a") as f:
    f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')} {torch.cuda.device_count()} {start:.3f}\n")
print("ok", float(y.sum()))

import os, sys, time
rank = int(os.environ["RANK"])
mode = sys.argv[1]
pids = os.environ["PID_DIR"]
with open(os.path.join(pids, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))


def say(line):
    print(f"[rank{rank}]: {line}", flush=True)


def all_reduce():
    while True:
        time.sleep(0.05)


if mode == "fault":
    said = os.path.join(pids, "rank0-said")
    if rank == 0:
        say("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1980, remote process exited or there was a network error")
        open(said, "w").close()
        sys.exit(1)
    while not os.path.exists(said):
        time.sleep(0.01)
    say("Traceback (most recent call last):")
    say('  File "train.py", line 40, in step')
    say("    gather(x)")
    say("RuntimeError: CUDA error: an illegal memory access was encountered")
    # What torchrun --log-dir writes: each local rank's streams in files of their own.
    files = os.path.join(os.environ["CUDABISECT_RANK_LOG_DIR"], "none_ab12", "attempt_0", "1")
    os.makedirs(files, exist_ok=True)
    with open(os.path.join(files, "stdout.log"), "w") as f:
        f.write("step 7: loss 2.31\n")
    sys.exit(1)
if mode == "hang":
    all_reduce()
print(f"rank {rank} done", flush=True)

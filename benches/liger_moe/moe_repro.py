# A training step of one MoE layer through Liger-Kernel's fused MoE (forward, backward, optimizer step) at a
# token count where TK * 2I passes 2**31: the size at which upstream saw the fused kernels' int32 offsets wrap.
import torch

from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

torch.manual_seed(0)
T, K, E, H, I = 70_000, 8, 8, 128, 2048  # TK = 560,000 rows; TK * 2I = 2.29e9 > 2**31 - 1
dev = "cuda"
router = torch.nn.Linear(H, E, bias=False, device=dev, dtype=torch.bfloat16)
gate_up = torch.nn.Parameter(torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * H**-0.5)
down = torch.nn.Parameter(torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * I**-0.5)
opt = torch.optim.AdamW([gate_up, down, *router.parameters()], lr=1e-4)

x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
scores = router(x).float().softmax(-1)
weights, experts = scores.topk(K, dim=-1)
out = LigerFusedMoEFunction.apply(x, gate_up, down, experts.to(torch.int32), weights.to(torch.bfloat16))
loss = out.float().pow(2).mean()
loss.backward()
opt.step()
torch.cuda.synchronize()
print("ok", float(loss))

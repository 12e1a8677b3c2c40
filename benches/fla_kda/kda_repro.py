# A KDA training step (forward and backward of chunk_kda) on the GPU: the shape of a small layer.
import torch
import torch.nn.functional as F

from fla.ops.kda import chunk_kda

torch.manual_seed(0)
B, T, H, K, V = 2, 2048, 4, 128, 128
dev = "cuda"
q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device=dev, requires_grad=True)
k = torch.randn(B, T, H, K, dtype=torch.bfloat16, device=dev, requires_grad=True)
v = torch.randn(B, T, H, V, dtype=torch.bfloat16, device=dev, requires_grad=True)
g = F.logsigmoid(torch.randn(B, T, H, K, dtype=torch.float32, device=dev)).requires_grad_()
beta = torch.rand(B, T, H, dtype=torch.bfloat16, device=dev).sigmoid().requires_grad_()
o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
o.float().pow(2).mean().backward()
torch.cuda.synchronize()
print("ok", float(o.float().abs().mean()))

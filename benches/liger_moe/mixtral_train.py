# A user's training step, unchanged across the library's history: a small Mixtral from transformers with
# Liger-Kernel's patches applied the way its README says (apply_liger_kernel_to_mixtral() before the model is
# built), then forward, loss, backward and an optimizer step. Where the fused MoE kernels do not exist yet the
# experts run Liger's per-expert loop and the step passes; from the commit that routes the experts through the
# fused kernels, a batch whose expert rows times 2 * intermediate passes 2**31 wraps their int32 offsets.
# MOE_TOKENS, MOE_INTERMEDIATE and DEVICE shrink it for a check without a GPU (TRITON_INTERPRET=1).
import os

import torch
from transformers import MixtralConfig
from transformers import MixtralForCausalLM

from liger_kernel.transformers import apply_liger_kernel_to_mixtral

apply_liger_kernel_to_mixtral()

dev = os.environ.get("DEVICE", "cuda")
tokens = int(os.environ.get("MOE_TOKENS", "70000"))  # 70,000 tokens x top-2 = 140,000 expert rows
intermediate = int(os.environ.get("MOE_INTERMEDIATE", "8192"))  # rows x 2 * 8192 = 2.29e9 > 2**31 - 1
seq = min(1000, tokens)
config = MixtralConfig(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=intermediate,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=seq,
)
torch.manual_seed(0)
model = MixtralForCausalLM(config).to(device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():  # Liger's experts start from torch.empty where transformers does not init them
        p.normal_(0.0, 0.02)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, config.vocab_size, (tokens // seq, seq), device=dev)
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
opt.step()
if dev == "cuda":
    torch.cuda.synchronize()
print("ok", float(loss))

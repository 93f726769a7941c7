"""README demo: a draft tree from parents, the paged MLA kernel, the reference.

Runs on a CUDA GPU with the verify_attn wheel installed:  python3 examples/demo_paged_mla.py
"""
import torch

import verify_attn
from verify_attn import masks

torch.manual_seed(0)
dev, H, page_size = "cuda", 16, 1

# One request: a 4k committed prefix and a 6-node draft tree
#   prefix -> 0 -> 1 -> 3
#               \-> 2 -> 4
#   prefix -> 5            (a second root)
parents = torch.tensor([-1, 0, 0, 1, 2, -1], dtype=torch.int32, device=dev)
qo_indptr = torch.tensor([0, 6], dtype=torch.int32, device=dev)
tree_mask = masks.from_parents(parents, qo_indptr)            # int32 bit words [6, 1]

prefix_len, q_len = 4096, 6
kv_len = torch.tensor([prefix_len + q_len], dtype=torch.int32, device=dev)
num_slots = 10_000
# SGLang-style token pool: [slots, 1, 576] (latent 512 + rope 64); value = first 512.
k_cache = torch.randn(num_slots, 1, 576, device=dev, dtype=torch.bfloat16)
kv_indices = torch.randperm(num_slots, device=dev)[: prefix_len + q_len].to(torch.int32)
kv_indptr = torch.tensor([0, prefix_len + q_len], dtype=torch.int32, device=dev)
q = torch.randn(q_len, H, 576, device=dev, dtype=torch.bfloat16)

out, lse = verify_attn.tree_attention_paged(
    q, k_cache, None, qo_indptr, kv_indptr, kv_indices, kv_len,
    page_size=page_size, tree_mask=tree_mask, sm_scale=576 ** -0.5,
    max_q_len=q_len, max_kv_len=prefix_len + q_len, return_lse=True)

ref_out, ref_lse = verify_attn.reference_attention_paged(
    q, k_cache, None, qo_indptr, kv_indptr, kv_indices, kv_len,
    page_size=page_size, tree_mask=tree_mask, sm_scale=576 ** -0.5)
err = ((out.double() - ref_out).norm() / ref_out.norm()).item()
print("out", tuple(out.shape), out.dtype, "lse", tuple(lse.shape), "(natural log)")
print("relative error vs float64 reference: %.2e" % err)
assert err < 1e-2

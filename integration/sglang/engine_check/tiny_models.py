"""Tiny random checkpoints with real weights for the Engine check.

    python tiny_models.py OUT_DIR

writes ``OUT_DIR/llama_gqa`` (Llama, 16 query / 4 KV heads of 128),
``OUT_DIR/dsv2_mla`` (DeepSeek-V2, MLA 576/512 with 16 heads, dense MLPs only:
no MoE kernel is reached) and ``OUT_DIR/llama_eagle_draft`` (a one-layer
EAGLE draft, ``LlamaForCausalLMEagle``), each a ``config.json`` and a
``model.safetensors`` in bf16. Same seed, same files.

Weights: projections N(0, 0.02); embeddings N(0, 1) and the LM head N(0, 0.2),
so the embedding dominates the residual stream and the greedy argmax has wide
margins, while attention still changes most continuations (SGLang's
``--load-format dummy`` draws U(-1e-3, 1e-3) for every tensor: near-flat logits
whose argmax is noise). The draft's ``fc`` passes the token embedding through
(``[I | 0]``) and its layer is small, so it guesses the target's "bigram" next
token and EAGLE accepts some drafts; SGLang gives the draft the target's
embedding and LM head (the draft checkpoint holds neither).
"""

import json
import os
import sys

import torch

VOCAB, HIDDEN = 2048, 1024
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2048, num_hidden_layers=2,
              num_attention_heads=16, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
              hidden_act="silu", tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
              torch_dtype="bfloat16")
CONFIGS = {
    # GQA: group 4, head dim 128 (verify_attn: 64/128/256, group <= 16).
    "llama_gqa": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=4,
                      head_dim=128),
    # MLA absorbed 576/512 (kv_lora_rank 512 + qk_rope_head_dim 64); first_k_dense_replace
    # = num_hidden_layers: every layer dense (no MoE).
    "dsv2_mla": dict(COMMON, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                     num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                     qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=2, moe_layer_freq=1,
                     n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=256,
                     n_group=1, topk_group=1, topk_method="greedy", attention_bias=False),
}
DRAFT = dict(CONFIGS["llama_gqa"], architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1)


def _reinit(model) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif name.endswith("lm_head.weight"):
                p.normal_(0.0, 0.2)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)


def write_target(out: str, name: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIGS[name], f, indent=1)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), torch_dtype=torch.float32)
    _reinit(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "config.json"), "w") as f:  # ours, not the one save_pretrained rewrote
        json.dump(CONFIGS[name], f, indent=1)
    return d


def draft_state_dict() -> dict:
    """``LlamaForCausalLMEagle`` names (SGLang prefixes ``model.``): fc and one layer
    without ``input_layernorm``; no embedding, LM head or final norm."""
    h, inter, nq, nkv, hd = HIDDEN, DRAFT["intermediate_size"], 16, DRAFT["num_key_value_heads"], DRAFT["head_dim"]

    def rnd(*shape, std=0.02):
        return torch.randn(*shape) * std

    sd = {"fc.weight": torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1), "fc.bias": torch.zeros(h)}
    p = "layers.0."
    sd.update({p + "self_attn.q_proj.weight": rnd(nq * hd, h), p + "self_attn.k_proj.weight": rnd(nkv * hd, h),
               p + "self_attn.v_proj.weight": rnd(nkv * hd, h), p + "self_attn.o_proj.weight": rnd(h, nq * hd),
               p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
               p + "mlp.down_proj.weight": rnd(h, inter), p + "post_attention_layernorm.weight": torch.ones(h)})
    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}


def write_draft(out: str) -> str:
    from safetensors.torch import save_file  # noqa: PLC0415

    d = os.path.join(out, "llama_eagle_draft")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(DRAFT, f, indent=1)
    save_file(draft_state_dict(), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d


def main(out: str) -> None:
    torch.manual_seed(0)
    for name in CONFIGS:
        print("wrote", write_target(out, name))
    print("wrote", write_draft(out))


if __name__ == "__main__":
    main(sys.argv[1])

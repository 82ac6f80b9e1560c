"""Write a tiny llama-architecture GGUF model with random weights.

Usage: tiny_gguf.py OUT.gguf

One transformer block, 64-wide, a byte-level SentencePiece vocabulary (the
256 byte tokens, a few letters and words) and a chat template: enough for
llama.cpp to load it and generate (nonsense) text at once on a CPU, which is
all a gateway check needs from an engine.
"""
import sys

import numpy as np
from gguf import GGUFWriter, TokenType

N_EMBD, N_FF, N_HEAD, N_CTX = 64, 128, 4, 512


def vocab():
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(TokenType.BYTE)
    words = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + w for w in ("the", "a", "hello", "world", "slogate", "token", "gateway")]
    for i, w in enumerate(words):
        tokens.append(w)
        scores.append(-float(i + 1))
        types.append(TokenType.NORMAL)
    return tokens, scores, types


def main(out):
    rng = np.random.default_rng(7)
    tokens, scores, types = vocab()
    n_vocab = len(tokens)
    w = GGUFWriter(out, "llama")
    w.add_name("slogate-tiny-random")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )

    def t(name, *shape, scale=0.02):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t("token_embd.weight", n_vocab, N_EMBD)
    ones("output_norm.weight", N_EMBD)
    t("output.weight", n_vocab, N_EMBD)
    ones("blk.0.attn_norm.weight", N_EMBD)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        t(f"blk.0.{name}.weight", N_EMBD, N_EMBD)
    ones("blk.0.ffn_norm.weight", N_EMBD)
    t("blk.0.ffn_gate.weight", N_FF, N_EMBD)
    t("blk.0.ffn_up.weight", N_FF, N_EMBD)
    t("blk.0.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])

"""Write a tiny llama-architecture GGUF model with random weights.

Usage: tiny_gguf.py OUT.gguf [--width N] [--layers N] [--ctx N]

By default one transformer block, 64-wide: enough for llama.cpp to load it
and generate (nonsense) text at once on a CPU, which is all a gateway check
needs from an engine. Wider and deeper models make each engine step cost
real compute (the hard-slot benchmarks size a step this way). A byte-level
SentencePiece vocabulary (the 256 byte tokens, a few letters and words, and
"abc", the word the load generator fills its prompts with, and "ab" on the way to it, so a prompt of N
tokens as the load generator counts them is about N tokens here too) and a
chat template.
"""
import argparse

import numpy as np
from gguf import GGUFWriter, TokenType

N_HEAD = 4


def vocab():
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(TokenType.BYTE)
    words = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + w for w in ("the", "a", "hello", "world", "slogate", "token", "gateway", "ab", "abc")]
    for i, w in enumerate(words):
        tokens.append(w)
        scores.append(-float(i + 1))
        types.append(TokenType.NORMAL)
    return tokens, scores, types


def main(out, n_embd, n_layers, n_ctx):
    n_ff = 2 * n_embd
    rng = np.random.default_rng(7)
    tokens, scores, types = vocab()
    n_vocab = len(tokens)
    w = GGUFWriter(out, "llama")
    w.add_name("slogate-tiny-random")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(n_embd // N_HEAD)
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

    t("token_embd.weight", n_vocab, n_embd)
    ones("output_norm.weight", n_embd)
    t("output.weight", n_vocab, n_embd)
    for b in range(n_layers):
        ones(f"blk.{b}.attn_norm.weight", n_embd)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{b}.{name}.weight", n_embd, n_embd)
        ones(f"blk.{b}.ffn_norm.weight", n_embd)
        t(f"blk.{b}.ffn_gate.weight", n_ff, n_embd)
        t(f"blk.{b}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{b}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write a llama-architecture GGUF model with random weights.")
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=64, help="embedding width (the feed-forward is twice it)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=512, help="the context length the model declares")
    a = ap.parse_args()
    main(a.out, a.width, a.layers, a.ctx)

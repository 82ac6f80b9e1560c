"""Writes crates/prompt/tests/fixtures/tokenizer/: a small byte-level BPE tokenizer
(trained here, offline), a chat template in the style of Llama 3's, and
the token ids Hugging Face transformers gives for a few chat and
completion prompts (what vLLM computes: apply_chat_template with the
generation prompt for chat, the tokenizer with its special tokens for a
completion's prompt). crates/prompt's tests check that
the gateway tokenizes the same prompts to the same ids.

    python3 -m pip install tokenizers transformers jinja2
    python3 scripts/prompt_tokens_fixtures.py
"""

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "prompt", "tests", "fixtures", "tokenizer")

TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

CORPUS = [
    "You are a helpful assistant. Answer briefly and cite the documents you were given.",
    "The quick brown fox jumps over the lazy dog while the engine prefills the prompt.",
    "Retrieval augmented generation sends the same documents with many questions.",
    "Agents resend their tool transcripts; conversations resend their history.",
    "Prefix caching skips the prefill of every leading block a replica still holds.",
    # loadgen's made-up prompts ("<tag> abc abc ..."), so that the
    # simulator's benchmarks count about one token per "abc" with this
    # tokenizer, as they count four characters a token without one.
    "group-0123 abc abc abc abc abc abc abc abc abc abc abc abc",
    "0a1b2c3d4e5f6789 abc abc abc abc abc abc abc abc 9f8e7d6c5b4a3210",
    "Question 42: why? abc abc abc abc",
] * 20

CHATS = [
    [{"role": "user", "content": "Hello there!"}],
    [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What does prefix caching skip?"},
    ],
    [
        {"role": "system", "content": "  You are a helpful assistant.  "},
        {"role": "user", "content": "Name two things agents resend."},
        {"role": "assistant", "content": "Tool transcripts and history."},
        {"role": "user", "content": "And RAG pipelines? Ünïcödé too: 日本語"},
    ],
]

PROMPTS = ["The quick brown fox", "Retrieval augmented generation sends documents."]


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=TEMPLATE
    )
    fast.save_pretrained(OUT)
    expected = {
        "chats": [
            {"messages": m, "ids": list(fast.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))}
            for m in CHATS
        ],
        "prompts": [{"prompt": p, "ids": fast(p)["input_ids"]} for p in PROMPTS],
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    # Only what the gateway reads is kept.
    for name in os.listdir(OUT):
        if name not in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "expected.json"):
            os.remove(os.path.join(OUT, name))


main()

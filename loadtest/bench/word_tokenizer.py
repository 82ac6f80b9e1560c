"""A word-level tokenizer laid out as a Hugging Face cache (`local/word`),
so the independent load generators count one token per word offline.

    word_tokenizer.py CACHE_DIR

Writes CACHE_DIR/models--local--word/{refs/main, snapshots/H/tokenizer.json,
tokenizer_config.json}; use it with HF_HUB_CACHE=CACHE_DIR and the
tokenizer name `local/word` (HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1).
"""
import json
import os
import sys

from tokenizers import Tokenizer, models, pre_tokenizers, decoders

WORDS = (
    "the model streams tokens while gateway measures every gap and request first token time latency "
    "queue slot replica class tenant budget breaker prompt answer stream event chunk usage a of to in is"
).split()


def main(cache: str) -> None:
    vocab = {"[UNK]": 0, "[PAD]": 1}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    snap = "0" * 40
    root = os.path.join(cache, "models--local--word")
    snapdir = os.path.join(root, "snapshots", snap)
    os.makedirs(snapdir, exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(snap)
    tok.save(os.path.join(snapdir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]", "model_max_length": 1000000}
    with open(os.path.join(snapdir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(snapdir, "config.json"), "w") as f:
        json.dump({"model_type": "llama"}, f)


if __name__ == "__main__":
    main(sys.argv[1])

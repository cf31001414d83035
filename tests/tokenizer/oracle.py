"""The independent checker for lockstep's tokenizers: Hugging Face's own `tokenizers` (PyPI, the Rust
library transformers uses) loads a tokenizer.json and encodes texts.

  python oracle.py encode TOKENIZER_JSON TEXTS_JSON
    TEXTS_JSON is a JSON array of strings; prints {"ids": [[...], ...], "decoded": [...]}, the
    decoded texts with special tokens kept and without clean-up of spaces.
  python oracle.py time TOKENIZER_JSON TEXTS_JSON|FORTUNES_DIR
    encodes every text once, one at a time, timed; prints {"seconds": S, "texts": N, "tokens": T}.
    A directory is read as lockstep's TextCorpusFormat::kFortunes does: every file without an
    extension, in name order; entries between lines holding only '%', inner newlines kept, empty
    ones skipped.
"""
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before the import: encode() of one text, one thread
from tokenizers import Tokenizer  # noqa: E402


def read_fortunes(directory):
    entries = []
    names = sorted(n for n in os.listdir(directory)
                   if "." not in n and not os.path.islink(os.path.join(directory, n))
                   and os.path.isfile(os.path.join(directory, n)))
    for name in names:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        entry = []
        for line in lines + ["%"]:
            if line == "%":
                text = "\n".join(entry)
                if text:
                    entries.append(text)
                entry = []
            else:
                entry.append(line)
    return entries


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("encode", "time"):
        sys.exit("usage: python oracle.py encode|time TOKENIZER_JSON TEXTS_JSON")
    mode, tokenizer_path, texts_path = sys.argv[1:]
    tokenizer = Tokenizer.from_file(tokenizer_path)
    if os.path.isdir(texts_path):
        texts = read_fortunes(texts_path)
    else:
        with open(texts_path, encoding="utf-8") as f:
            texts = json.load(f)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    if mode == "time":
        start = time.perf_counter()
        tokens = sum(len(encode(text)) for text in texts)
        print(json.dumps({"seconds": time.perf_counter() - start, "texts": len(texts), "tokens": tokens}))
        return
    ids = [encode(text) for text in texts]
    decoded = [tokenizer.decode(i, skip_special_tokens=False) if i else "" for i in ids]
    print(json.dumps({"ids": ids, "decoded": decoded}, ensure_ascii=False))


if __name__ == "__main__":
    main()

"""Build assets/long/documents.json: long documents for the long path, from the UD English EWT dev split shipped in
assets/ud-english-ewt (CC BY-SA 4.0). A document's sentences are joined by spaces; the longer examples join
consecutive documents of the split in their order, each document a paragraph.

    .venv/bin/python -m scripts.long_examples
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONLLU = ROOT / "assets" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
OUT = ROOT / "assets" / "long" / "documents.json"
# (label, characters to reach): SmolLM2's tokenizer gives about 4.3 characters a token on this text.
TARGETS = (
    ("Six web documents (1,083 SmolLM2 tokens)", 4_300),
    ("Twelve web documents (3,691 tokens)", 15_600),
    ("Twenty-two web documents (7,596 tokens)", 32_000),
)


def documents() -> list[tuple[str, str]]:
    docs: list[tuple[str, list[str]]] = []
    for line in CONLLU.read_text(encoding="utf-8").splitlines():
        if line.startswith("# newdoc id = "):
            docs.append((line.removeprefix("# newdoc id = ").strip(), []))
        elif line.startswith("# text = ") and docs:
            docs[-1][1].append(line.removeprefix("# text = ").strip())
    return [(doc_id, " ".join(sentences)) for doc_id, sentences in docs if sentences]


def main() -> None:
    docs = documents()
    examples = []
    for label, characters in TARGETS:
        parts, ids = [], []
        for doc_id, text in docs:
            if sum(len(p) + 2 for p in parts) >= characters:
                break
            parts.append(text)
            ids.append(doc_id)
        examples.append({"label": label, "documents": ids, "text": "\n\n".join(parts)})
    OUT.write_text(json.dumps(examples, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Record llama.cpp's token ids for a fixed list of tricky texts, as the reference
that prism's GGUF tokenizer is tested against (tests/tokens.rs).

For each GGUF file given, the vocabulary alone is loaded with llama-cpp-python
(`vocab_only=True`) and every text is tokenized with `add_bos=False, special=True`
(special tokens written in the text become their ids, nothing is added). The result
goes to tests/fixtures/llama_cpp_tokens.json (or --out), keyed by file name, with
each file's sha256 so a test can tell when it holds a different file.

Run (llama-cpp-python builds llama.cpp from source, a few minutes):
    python3 -m venv /root/.cache/prism/llama-venv
    /root/.cache/prism/llama-venv/bin/pip install llama-cpp-python
    /root/.cache/prism/llama-venv/bin/python scripts/llama-cpp-tokens.py \
        ~/.cache/prism/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        ~/.cache/prism/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

import argparse
import hashlib
import json
import os
import sys

import llama_cpp

# Texts that stress pre-tokenization: digit runs, punctuation, whitespace runs,
# non-ASCII, contractions, code, and chat special tokens. Keep `special` true
# only for texts that contain special tokens: the test checks that the others
# decode back to themselves.
CASES = [
    ("12345 and 3.14159, 1,000,000", False),
    ("Version 2.0.1 (build 20240101) costs $1,299.99 — or 15% off!", False),
    ("Hello, world! What?! (yes) [no] {maybe} <tag> a/b\\c @user #hash ~tilde", False),
    ("a.\n\nb\n\n\nc", False),
    ("\n\n\nstarts with newlines and ends with spaces   ", False),
    ("tabs\tand\t\tspaces    runs  \t \n  mixed", False),
    ("trailing newline\n", False),
    ("naïve café — “quotes” and ‘single’ … ellipsis", False),
    ("Ünïcödé: Straße, Ærøskøbing, façade, jalapeño", False),
    ("日本語のテキストと中文文本，한국어 텍스트。", False),
    ("emoji: 🙂👍🏽 🚀✨ family 👨‍👩‍👧", False),
    ("decomposed: cafe\u0301 vs café", False),
    ("I'm, you're, it's, WE'LL, they'VE, she'd, I'M DONE, don't", False),
    ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n", False),
    ("fn main() {\n\tlet x: Vec<u32> = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n", False),
    ("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n", True),
    ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nSum 17 and 25.<|im_end|>\n<|endoftext|>", True),
    # Qwen2.5: user-defined tokens (matched whole, kept when decoding), FIM control
    # tokens, and an unused padding token's text, which is ordinary text.
    ("<tool_call>\n{\"name\": \"sum\", \"arguments\": {\"a\": 1}}\n</tool_call>", False),
    ("<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>", True),
    ("[PAD151665] is text, and so is <|not_a_token|>", False),
    ("You will rejoice to hear that no disaster has accompanied the commencement of an "
     "enterprise which you have regarded with such evil forebodings.", False),
    ("I am by birth a Genevese, and my family is one of the most distinguished of that "
     "republic. My ancestors had been for many years counsellors and syndics; and my "
     "father had filled several public situations with honour and reputation.", False),
    ("St. Petersburgh, Dec. 11th, 17—.\n\nTO Mrs. Saville, England.", False),
]


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenize_all(path):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    cases = []
    for text, special in CASES:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        cases.append({"text": text, "special": special, "ids": list(ids)})
    return cases


def render(fixture):
    """JSON with one line per case, so diffs show which case changed."""
    dump = lambda value: json.dumps(value, ensure_ascii=False)
    lines = ["{", f' "generated_by": {dump(fixture["generated_by"])},', ' "models": {']
    names = list(fixture["models"])
    for i, name in enumerate(names):
        model = fixture["models"][name]
        lines.append(f"  {dump(name)}: {{")
        lines.append(f'   "sha256": {dump(model["sha256"])},')
        lines.append('   "cases": [')
        cases = model["cases"]
        for j, case in enumerate(cases):
            lines.append("    " + dump(case) + ("," if j + 1 < len(cases) else ""))
        lines.append("   ]")
        lines.append("  }" + ("," if i + 1 < len(names) else ""))
    lines += [" }", "}", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="+", help="GGUF files to tokenize with")
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument(
        "--out",
        default=os.path.join(here, "..", "tests", "fixtures", "llama_cpp_tokens.json"),
    )
    args = parser.parse_args()

    models = {}
    for path in args.gguf:
        print(f"tokenizing with {path}", file=sys.stderr)
        models[os.path.basename(path)] = {"sha256": sha256(path), "cases": tokenize_all(path)}

    fixture = {
        "generated_by": f"scripts/llama-cpp-tokens.py with llama-cpp-python {llama_cpp.__version__}",
        "models": models,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(render(fixture))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

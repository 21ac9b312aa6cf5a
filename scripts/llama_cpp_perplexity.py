#!/usr/bin/env python3
"""llama.cpp's side of `scripts/compare-perplexity`: the perplexity of a text
under a GGUF file, computed with llama-cpp-python exactly as llama.cpp's
`llama-perplexity` computes it (and `prism perplexity` mirrors): the text
tokenized whole with BOS, cut into windows of CONTEXT tokens every STRIDE,
each evaluated from an empty cache with its first token replaced by BOS, and
only the second half of each window scored. Prints one JSON object.

    python scripts/llama_cpp_perplexity.py MODEL.gguf FILE --context 512 --threads 2
"""
import argparse
import json
import math

import llama_cpp
import numpy as np


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("file")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--stride", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    context = args.context
    stride = args.stride or context

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=context, n_batch=context,
                          n_threads=args.threads, logits_all=True, verbose=False)
    text = open(args.file, encoding="utf-8").read()
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = llm.tokenize(b"", add_bos=True, special=False)
    first = context // 2
    total, total_sq, count, windows = 0.0, 0.0, 0, 0
    start = 0
    while start + context <= len(tokens):
        window = list(tokens[start:start + context])
        if bos:
            window[0] = bos[0]
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[first:context - 1], dtype=np.float64)
        targets = np.asarray(tokens[start + first + 1:start + context])
        peak = logits.max(axis=1)
        log_norm = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=1))
        nll = log_norm - logits[np.arange(len(targets)), targets]
        total += nll.sum()
        total_sq += (nll * nll).sum()
        count += len(nll)
        windows += 1
        start += stride
    mean = total / count
    variance = max(total_sq / count - mean * mean, 0.0)
    perplexity = math.exp(mean)
    print(json.dumps({
        "perplexity": perplexity,
        "standard_error": perplexity * math.sqrt(variance / (count - 1)),
        "windows": windows,
        "scored_tokens": count,
        "text_tokens": len(tokens),
    }))


if __name__ == "__main__":
    main()

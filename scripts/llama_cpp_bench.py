#!/usr/bin/env python3
"""llama.cpp's side of `scripts/compare-llama-cpp`.

Measures, with llama-cpp-python on a GGUF file, the figures `prism bench-engine`
reports: prefill tokens/s of a cold prompt, decode tokens/s after it, and the
seconds to re-encode a prompt whose first 90% is cached, on the very same
pseudo-random token ids (the LCG below mirrors src/bench/engine.rs).
Prints one JSON object per context length.

    python scripts/llama_cpp_bench.py MODEL.gguf --threads 2 --context 512,2048
"""
import argparse
import json
import resource
import time

import llama_cpp

FIRST_ORDINARY_ID = 1000
LAST_ORDINARY_ID = 30_000
MASK = (1 << 64) - 1


def random_prompt(seed, count, vocab_size):
    span = min(LAST_ORDINARY_ID, vocab_size) - FIRST_ORDINARY_ID
    state, ids = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK
        ids.append(FIRST_ORDINARY_ID + (state >> 33) % span)
    return ids


def keep_only(llm, n_tokens):
    """Drop every cached position from n_tokens on, as llama-cpp-python's own prefix reuse does."""
    llm._ctx.kv_cache_seq_rm(-1, n_tokens, -1)
    llm.n_tokens = n_tokens


def measure(llm, context, decode_steps, repeats):
    vocab = llm.n_vocab()
    prompt = random_prompt(42, context, vocab)
    steps = random_prompt(7, decode_steps, vocab)
    cold = decode = warm = float("inf")
    for _ in range(max(repeats, 1)):
        keep_only(llm, 0)
        start = time.perf_counter()
        llm.eval(prompt)
        cold = min(cold, time.perf_counter() - start)
        start = time.perf_counter()
        for token in steps:
            llm.eval([token])
        decode = min(decode, time.perf_counter() - start)
    shared = context * 9 // 10
    primer = prompt[:shared] + random_prompt(99, context - shared, vocab)
    for _ in range(max(repeats, 1)):
        keep_only(llm, 0)
        llm.eval(primer)
        start = time.perf_counter()
        keep_only(llm, shared)
        llm.eval(prompt[shared:])
        warm = min(warm, time.perf_counter() - start)
    return {
        "context_tokens": context,
        "prefill_tokens_per_second": context / cold,
        "decode_tokens_per_second": decode_steps / decode,
        "decode_steps": decode_steps,
        "warm_90_seconds": warm,
        "cold_seconds": cold,
        # Linux reports ru_maxrss in KiB; the interpreter's own memory is included.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--context", default="512,2048")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    contexts = [int(c) for c in args.context.split(",")]
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=max(contexts) + args.decode_steps + 16,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    for context in contexts:
        print(json.dumps(measure(llm, context, args.decode_steps, args.repeats)), flush=True)


if __name__ == "__main__":
    main()

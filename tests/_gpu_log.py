"""The GPU tests' result lines: printed, and appended to ``$TSCT_GPU_LOG`` when set (one file that
collects the results of a GPU run, e.g. on a remote machine)."""

import os


def log(line: str) -> None:
    print(line, flush=True)
    path = os.environ.get("TSCT_GPU_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")

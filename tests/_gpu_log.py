"""The GPU tests' result lines: printed, and appended to ``$TSCT_GPU_LOG`` when set (the device tool
returns that one file)."""

import os


def log(line: str) -> None:
    print(line, flush=True)
    path = os.environ.get("TSCT_GPU_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")

"""App module whose handler writes to stdout three ways: print(), the file descriptor, and a
child process that inherits it."""

from __future__ import annotations

import os
import subprocess
import sys

from drainer import Job, task


@task("chatty")
def chatty(job: Job) -> None:
    print(f"print from job {job.id}")
    os.write(1, f"fd 1 from job {job.id}\n".encode())
    subprocess.run([sys.executable, "-c", f"print('child of job {job.id}')"], check=True)

"""The processes of a soak: `cfp emulator` and `cfp worker`s, started so that they die with the
soak (the parent-death signal), their standard error kept line by line with the soak's own wall
clock in front (a worker under libfaketime stamps its lines with its skewed clock), and signalled
for real: `kill -9`, `SIGSTOP`/`SIGCONT`, `SIGTERM`.
"""
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time

PR_SET_PDEATHSIG = 1
LIBFAKETIME_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"]


class SoakError(Exception):
    """Something the soak needs did not happen (a process did not start, a control call failed)."""


def libfaketime():
    """Debian's libfaketime (package `faketime`)."""
    for directory in LIBFAKETIME_DIRS:
        path = os.path.join(directory, "faketime", "libfaketime.so.1")
        if os.path.exists(path):
            return path
    raise SoakError("libfaketime.so.1 is not installed (Debian's package faketime)")


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """A started process whose standard error goes to `log_path`, one line at a time, each line
    prefixed with the soak's wall-clock time; `on_line(line)` sees every line too."""

    def __init__(self, args, log_path, env=None, on_line=None, stdout=False):
        self.args, self.log_path = args, log_path
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,
        )
        self.pid = self.popen.pid
        self.on_line = on_line
        self.reader = threading.Thread(target=self._keep_log, daemon=True)
        self.reader.start()

    def _keep_log(self):
        with open(self.log_path, "a", encoding="utf-8", buffering=1) as log:
            for raw in self.popen.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(f"{time.time():.3f} {line}\n")
                if self.on_line is not None:
                    self.on_line(line)

    def signal(self, sig):
        """Sends `sig` unless the process is gone."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout):
        """The exit code, or None when it still runs after `timeout` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def running(self):
        return self.popen.poll() is None

    def kill(self):
        """`kill -9` and reap."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def terminate(self, timeout=15.0):
        """SIGTERM and wait; `kill -9` after `timeout`. Returns whether it exited by itself."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.kill()
            return False
        return True


def start_emulator(cfp, out_dir, args):
    """Starts `cfp emulator --port 0 <args>`; returns (process, {region name: endpoint}) once it
    printed its regions (at most 30 s)."""
    process = Process([cfp, "emulator", "--port", "0", *args], os.path.join(out_dir, "emulator.log"), stdout=True)
    lines = queue.Queue()

    def read_stdout():
        for raw in process.popen.stdout:
            lines.put(raw.decode("utf-8", "replace").strip())

    threading.Thread(target=read_stdout, daemon=True).start()
    regions, deadline = {}, time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith("region ") and "http" in line:
            regions[line[len("region "):line.index(" (")]] = line.split()[-1]
        if line.startswith("replication delay"):
            return process, regions
    process.kill()
    raise SoakError(f"cfp emulator did not print its regions within 30 s: {regions}")

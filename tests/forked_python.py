"""`python SCRIPT ARGS`, `python -m MODULE ARGS` and `python -c CODE ARGS` for the tests, without paying for the interpreter's start and
the heavy imports at every command (4-5 s each for torch, transformers, TRL, datasets, accelerate, PEFT).

A server process imports those libraries once and forks a child per command. The child becomes what a fresh
interpreter would be: its argv, working directory, environment and sys.path; stdin, stdout and stderr are files;
the script runs as `__main__`; an uncaught exception prints its traceback and exits 1, SystemExit exits as Python
does; threads are joined and atexit handlers run before it ends. The caller gets a `subprocess.CompletedProcess`,
as from `subprocess.run(..., capture_output=True, text=True)`.

Only libraries are preloaded, never our packages, so every one of our modules is imported fresh by each command.
A command whose environment differs from the server's in a variable that those imports read (HF_*, TRANSFORMERS_*,
TORCH*, ...) runs as a real subprocess instead, as do commands that are not `python SCRIPT` or `python -m MODULE`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

PRELOAD = ("torch", "transformers", "trl", "trl.trainer.dpo_trainer", "trl.trainer.sft_trainer",
           "trl.trainer.grpo_trainer", "datasets", "accelerate", "peft", "PIL.Image", "numpy", "yaml", "openai",
           "safetensors.torch", "tqdm", "matplotlib", "matplotlib.pyplot")
# Variables read when those libraries are imported: a command that sets them differently needs a fresh interpreter.
IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "DATASETS", "TOKENIZERS", "TORCH", "OMP_", "MKL", "KMP",
               "OPENBLAS", "DNNL", "ONEDNN", "ATEN", "LD_", "MALLOC", "PYTHON", "ACCELERATE", "WANDB", "TRL", "CUDA",
               "VLLM", "XDG_", "HOME", "MPL", "TQDM")


def _import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


# ---------------------------------------------------------------------------------------------------------------
# The server side (this file run as a script).

def _exit_code(code) -> int:
    """What Python's own exit makes of SystemExit's code."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict, fresh_path: list[str]) -> int:
    import runpy
    import traceback

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (path, mode) in enumerate((request["stdin"], request["stdout"], request["stderr"])):
        file = os.open(path, mode)
        os.dup2(file, fd)
        os.close(file)
    # the streams a fresh, non-interactive interpreter has: stdout block-buffered, stderr line-buffered
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    kind, target, args = request["kind"], request["target"], request["args"]
    try:
        if kind == "module":
            sys.argv = [target, *args]  # runpy puts the module's file in argv[0]
            sys.path[:] = [os.getcwd(), *fresh_path]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *args]
            sys.path[:] = ["", *fresh_path]
            main = sys.modules["__main__"] = type(sys)("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [target, *args]
            sys.path[:] = [os.path.dirname(os.path.abspath(target)), *fresh_path]
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    # the interpreter's own ending: join non-daemon threads, run atexit handlers, flush the streams
    try:
        threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    return code


def serve() -> None:
    """Read one JSON request a line on stdin, fork, answer {"pid"} at once and {"returncode"} when it ends."""
    control_in = os.fdopen(os.dup(0), "r")
    control_out = os.fdopen(os.dup(1), "w", buffering=1)
    # whatever the imports print must not reach the control pipe
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    fresh_path = json.loads(sys.argv[2])
    for name in PRELOAD:
        __import__(name)
    control_out.write("ready\n")
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            control_in.close()
            control_out.close()
            code = 1
            try:
                code = _child(request, fresh_path)
            except BaseException:  # a bug here, not in the command: onto the command's stderr
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        control_out.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        control_out.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# The caller's side.

class _Server:
    def __init__(self, env: dict):
        self.env = env
        fresh = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                               capture_output=True, text=True, check=True, env=self.env)
        self.process = subprocess.Popen([sys.executable, __file__, "serve", fresh.stdout.strip()],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env,
                                        cwd=os.path.dirname(os.path.abspath(__file__)), bufsize=1)
        assert self.process.stdout.readline() == "ready\n", "the fork server did not start"

    def alive(self) -> bool:
        return self.process.poll() is None

    def reply(self, timeout: float | None) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return {}
        line = self.process.stdout.readline()
        assert line, "the fork server ended"
        return json.loads(line)


# One server per set of import-time variables; a set is given its own server the second time it is seen (a one-off
# environment, e.g. a test's own HF_HOME, is cheaper as a plain subprocess than as a new server).
MAX_SERVERS = 3
_servers: dict[tuple, _Server] = {}
_seen: set[tuple] = set()
_lock = threading.Lock()


def _server_for(env: dict) -> _Server | None:
    key = tuple(sorted(_import_time_env(env).items()))
    server = _servers.get(key)
    if server is not None and server.alive():
        return server
    if key not in _seen and _servers:
        _seen.add(key)
        return None
    _seen.add(key)
    if len(_servers) >= MAX_SERVERS:
        _servers.pop(next(iter(_servers))).process.kill()
    _servers[key] = _Server(env)
    return _servers[key]


def _split(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """(kind, target, args) of `python SCRIPT ...` / `python -m MODULE ...` / `python -c CODE ...`; None for
    anything else."""
    if len(argv) >= 2 and argv[0] == sys.executable:
        if argv[1] in ("-m", "-c") and len(argv) >= 3:
            return {"-m": "module", "-c": "code"}[argv[1]], argv[2], argv[3:]
        if not argv[1].startswith("-"):
            return "script", argv[1], argv[2:]
    return None


def run(argv, *, cwd=None, env=None, input: str | None = None, timeout: float | None = None, check: bool = False,
        capture_output: bool = True, text: bool = True) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...) for `python ...` commands, forked from the
    preloaded server where the command allows it."""
    assert capture_output and text, "forked_python.run captures text output, as the tests use it"
    result = _run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
    if check:
        result.check_returncode()
    return result


def _run(argv, *, cwd, env, input, timeout) -> subprocess.CompletedProcess:
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    split = _split(argv)
    with _lock:
        server = split and _server_for(env)
        if not server:
            return subprocess.run(argv, cwd=cwd, env=env, input=input, timeout=timeout, capture_output=True,
                                  text=True)
        with tempfile.TemporaryDirectory(prefix="forked-python-") as folder:
            paths = {name: os.path.join(folder, name) for name in ("stdin", "stdout", "stderr")}
            with open(paths["stdin"], "w") as file:
                file.write(input or "")
            request = {"kind": split[0], "target": split[1], "args": split[2], "cwd": os.path.abspath(cwd or "."),
                       "env": env, "stdin": [paths["stdin"], os.O_RDONLY],
                       "stdout": [paths["stdout"], os.O_WRONLY | os.O_CREAT],
                       "stderr": [paths["stderr"], os.O_WRONLY | os.O_CREAT]}
            server.process.stdin.write(json.dumps(request) + "\n")
            server.process.stdin.flush()
            pid = server.reply(60)["pid"]
            done = server.reply(timeout)
            if not done:
                os.kill(pid, signal.SIGKILL)
                server.reply(None)
            with open(paths["stdout"], errors="replace") as out, open(paths["stderr"], errors="replace") as err:
                stdout, stderr = out.read(), err.read()
            if not done:
                raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
            return subprocess.CompletedProcess(argv, done["returncode"], stdout, stderr)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve()

"""`privacy-align`: the one command on PATH (installed by the package as a console script), in front of every entry
point, the way `trl sft` and `llamafactory-cli train` are:

    privacy-align train METHOD [RECIPE.yaml] [--key value ...] [--num_processes N] [--config_file ACCELERATE.yaml]
    privacy-align eval BENCHMARK STEP ...        (`python -m eval ...`; `suite`, `view` and `compare` also at the top)
    privacy-align demo | study | chat | data KIND | merge-lora ...

Each subcommand runs the module a user would run with `python -m ...` (or `python train/METHOD.py`), with the same
arguments, output and exit statuses; the old entry points keep working. `train` runs the method's script in this
process; given a launcher option (`--num_processes`, `--config_file`, ...) it goes through `accelerate launch`, as
TRL's CLI does, which runs the script in each process: through launch/run.py, the documented launcher, so a failed
run ends in the child's own line and exit status, not in accelerate's traceback printing the child's argv.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from pathlib import Path

PROG = "privacy-align"
ROOT = Path(__file__).resolve().parents[1]
# method -> training script (train/SCRIPT.py); NCA is DPO's script with loss_type nca_pair
TRAIN = {"sft": "sft", "dpo": "dpo", "nca": "dpo", "nca_p": "nca_p", "grpo": "grpo"}
LOSS_TYPE = {"dpo": "sigmoid", "nca": "nca_pair"}
# `accelerate launch` options `train` hands to the launcher (each takes a value); any of them launches through it
LAUNCHER = ("--num_processes", "--config_file", "--num_machines", "--machine_rank", "--main_process_ip",
            "--main_process_port", "--gpu_ids")
# subcommand -> (module run as `python -m MODULE`, the first arguments it is given, what it does)
MODULES = {
    "eval": ("eval", [], "evaluate: `eval {spy,general,composite,geo,spatialtrust,suite,compare,view} ...`"),
    "suite": ("eval", ["suite"], "a checkpoint on every benchmark of a suite YAML (`eval suite`)"),
    "view": ("eval", ["view"], "the per-sample viewer of suite runs (`eval view`)"),
    "compare": ("eval", ["compare"], "a leaderboard of suite runs (`eval compare`)"),
    "demo": ("train.demo", [], "the CPU demo: tiny Qwen2-VL, SFT then NCA-P, evaluated (`make demo`)"),
    "study": ("study", [], "the miniature alignment study (`make study`)"),
    "chat": ("train.chat", [], "one image, your privacy instruction, a question: the model's answer"),
    "merge-lora": ("train.merge_lora", [], "merge a LoRA adapter into its base model"),
}
DATA = {"synthetic": "data_prep.synthetic", "spy-tune": "data_prep.spy_tune", "categories": "data_prep.categories",
        "generate": "data_prep.generate", "tiny-model": "train.tiny_model"}


def shown() -> str:
    """The command as the docs write it, for lines that tell a user what to run next: the installed script's path
    from here (`.venv/bin/privacy-align` in the checkout), or its bare name when PATH finds that same script."""
    import shutil

    script = Path(sys.executable).parent / PROG
    if not script.is_file():  # not installed (run from the checkout's sources): the module form
        return f"{sys.executable} -m cli.command"
    found = shutil.which(PROG)
    if found and Path(found).resolve() == script.resolve():
        return PROG
    local = Path(".venv") / "bin" / PROG  # the checkout's environment, however it is linked
    if local.is_file() and local.resolve() == script.resolve():
        return str(local)
    relative = os.path.relpath(script, Path.cwd())
    return relative if not relative.startswith("..") else str(script)


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND ...", "", "commands:",
             f"  {'train':<11} train a method: {PROG} train {{{','.join(TRAIN)}}} [RECIPE.yaml] [--key value ...] "
             "[--num_processes N]"]
    lines += [f"  {name:<11} {what}" for name, (_, _, what) in MODULES.items()]
    lines += [f"  {'data':<11} make data: {PROG} data {{{','.join(DATA)}}} ...", "",
              f"`{PROG} COMMAND --help` says more; docs/reference/cli.md lists every option."]
    return "\n".join(lines)


def train_usage(method: str | None = None) -> str:
    name = method or "{" + ",".join(TRAIN) + "}"
    return (f"usage: {PROG} train {name} [RECIPE.yaml] [--key value ...] [--num_processes N] "
            "[--config_file ACCELERATE.yaml]\n\n"
            "The recipe (recipes/*.yaml, recipes/demo/*.yaml) sets the options, each `--key value` overrides one. "
            "In this process\nby default; a launcher option (" + ", ".join(LAUNCHER) + ") runs it through "
            "`accelerate launch`\n(one process per device: --num_processes 8, or --config_file "
            "accelerate_configs/zero2.yaml).")


def _say(line: str, status: int) -> int:
    print(line, file=sys.stderr)
    return status


def _run_module(module: str, argv: list[str], prog: str) -> int:
    """`python -m MODULE ARGV`, in this process: the module's own wrapper ends it (sys.exit with its status)."""
    sys.argv = [prog, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as stop:
        return _status(stop)
    return 0


def _status(stop: SystemExit) -> int:
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)  # sys.exit("message"), as Python prints it
    return 1


def split_launcher(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the `accelerate launch` options, the rest) of `train`'s arguments (`--opt value` or `--opt=value`)."""
    launcher, rest, i = [], [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in LAUNCHER:
            if "=" in argv[i]:
                launcher.append(argv[i])
            elif i + 1 < len(argv):
                launcher += argv[i:i + 2]
                i += 1
            else:
                raise SystemExit(_say(f"error: command line: {name}: expected a value", 2))
        else:
            rest.append(argv[i])
        i += 1
    return launcher, rest


def train(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(train_usage())
        return 0 if argv else 2
    method = argv[0].replace("-", "_")
    if method not in TRAIN:
        return _say(f"error: command line: train {argv[0]}: unknown method; one of {', '.join(TRAIN)}", 2)
    launcher, rest = split_launcher(argv[1:])
    script = ROOT / "train" / f"{TRAIN[method]}.py"
    if "-h" in rest or "--help" in rest:
        print(train_usage(method) + "\n\nThe script's options (train/" + script.name + "):\n", flush=True)
    elif method in LOSS_TYPE:
        rest = _with_loss_type(method, rest)
        if isinstance(rest, int):
            return rest
    if launcher:  # launch/run.py: accelerate's launcher, a failed run ending in the child's line and status
        return _launch()([*launcher, str(script), *rest])
    sys.argv = [str(script), *rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        return _status(stop)
    return 0


def _launch():
    """launch/run.py's main (the documented launcher; a file beside the packages, loaded from the checkout)."""
    spec = importlib.util.spec_from_file_location("launch_run", ROOT / "launch" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _with_loss_type(method: str, rest: list[str]) -> list[str] | int:
    """DPO and NCA share train/dpo.py, the recipe's loss_type deciding: the method named sets it, and a recipe or
    option naming the other one is refused (a DPO recipe is not trained as NCA by mistake)."""
    wanted = LOSS_TYPE[method]
    given = [rest[i + 1] for i, arg in enumerate(rest[:-1]) if arg == "--loss_type"]
    given += [arg.split("=", 1)[1] for arg in rest if arg.startswith("--loss_type=")]
    source = "command line"
    if not given and rest and rest[0].endswith((".yaml", ".yml")) and Path(rest[0]).is_file():
        from cli import strict_yaml
        from cli.errors import InputError

        try:
            recipe = strict_yaml.load(rest[0])
        except InputError:
            recipe = None  # the script says what is wrong with it, in its own line
        value = recipe.get("loss_type") if isinstance(recipe, dict) else None
        given = [value] if isinstance(value, str) else list(value or [])
        source = rest[0]
    if not given:
        return [*rest, "--loss_type", wanted]
    if given != [wanted]:
        other = {v: k for k, v in LOSS_TYPE.items()}.get(given[0], given[0])
        return _say(f"error: {source}: loss_type: {' '.join(map(str, given))} trains {other}, not {method} "
                    f"(`{PROG} train {other} ...`, or loss_type {wanted})", 2)
    return rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train(rest)
    if command == "data":
        if not rest or rest[0] in ("-h", "--help") or rest[0] not in DATA:
            if rest and rest[0] not in ("-h", "--help"):
                return _say(f"error: command line: data {rest[0]}: unknown; one of {', '.join(DATA)}", 2)
            print(f"usage: {PROG} data {{{','.join(DATA)}}} ...  (`{PROG} data KIND --help` says more)")
            return 0 if rest else 2
        return _run_module(DATA[rest[0]], rest[1:], f"{PROG} data {rest[0]}")
    if command not in MODULES:
        from cli.strict_yaml import did_you_mean

        return _say(f"error: command line: {command}: unknown command{did_you_mean(command, [*MODULES, 'train', 'data'])}"
                    f" (`{PROG} --help` lists them)", 2)
    module, first, _ = MODULES[command]
    return _run_module(module, [*first, *rest], f"{PROG} {command}")


if __name__ == "__main__":
    sys.exit(main())

"""What every entry script shares: the recipe parser, model and processor loading, the SPY-Tune datasets.
Saving, the model card and publishing at the end of a run are in train/card.py."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cli import numbers
from cli.entry import run_command
from cli.errors import InputError, unwritable
from cli.paths import real
from cli.strict_yaml import did_you_mean

logger = logging.getLogger(__name__)
METHOD_NAMES = {"sft": "SFT", "dpo": "DPO", "nca": "NCA", "nca_p": "NCA-P", "grpo": "GRPO"}


@dataclass
class SpyTuneArguments:
    """Where the data is and how it becomes training rows (the recipe's data section)."""

    train_data_path: str = field(metadata={"help": "SPY-Tune JSON ({\"data_list\": [...]})."})
    image_folder: str = field(metadata={"help": "Folder that the items' image_path values are relative to."})
    eval_data_path: str | None = field(default=None, metadata={"help": "Optional held-out SPY-Tune JSON for eval loss."})
    categories: str | None = field(default=None, metadata={
        "help": "Category file the data was made with (data_prep/categories.py: names, absolute categories, "
                "instruction templates); default: SPY's 67 categories. A data folder made from a category file "
                "holds it as categories.yaml."})
    label_path: str | None = field(default=None, metadata={
        "help": "label2text.json renaming some categories; default: their names in the category file."})
    add_distractors: bool = field(default=True, metadata={"help": "Five distractor instruction lines per prompt."})
    shuffle: bool = field(default=True, metadata={"help": "Shuffle the rows with the training seed."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N rows (after shuffling)."})
    min_pixels: int | None = field(default=None, metadata={"help": "Image processor lower bound (pixels)."})
    max_pixels: int | None = field(default=None, metadata={"help": "Image processor upper bound (pixels)."})
    dataset_name: str = field(default="SPY-Tune", metadata={"help": "Dataset name shown in the model card."})
    helpful: bool = field(default=False, metadata={"help": "SFT only: answer every question whatever the instruction "
                                                           "(the study's helpful backbone)."})
    general_data_path: str | None = field(default=None, metadata={
        "help": "General-task JSON ({\"data_list\": [{image_path, question, answer}]}, data_prep/synthetic.py) mixed "
                "into the training rows at general_fraction: SFT trains on its answers, DPO / NCA / NCA-P on pairs "
                "(chosen: the right answer; rejected: a refusal or a wrong answer), GRPO on its questions scored by "
                "exact match."})
    general_fraction: float | None = field(default=None, metadata={
        "help": "Share of the training rows drawn from general_data_path (0.25: a quarter). SFT without it: every "
                "row of the file (the study's backbone); the other methods need it with general_data_path."})
    resume_with_new_settings: bool = field(default=False, metadata={
        "help": "Resume from a checkpoint trained with other settings or data (refused without it; train/resume.py)."})
    base_with_other_data: bool = field(default=False, metadata={
        "help": "Train a model folder this project trained (its training_data.json) on other data than its own "
                "(refused without it; train/resume.py)."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Train into an output_dir that holds a finished run (refused without it; train/resume.py)."})
    eval_privacy_items: str | None = field(default=None, metadata={
        "help": "Held-out SPY-Bench questions.json: ICS and HMS (rule judge) on its first eval_privacy_limit samples "
                "every eval_steps (else logging_steps), logged as eval_privacy_ics / eval_privacy_hms "
                "(train/privacy_eval.py); default: off."})
    eval_privacy_images: str | None = field(default=None, metadata={
        "help": "The images eval_privacy_items names (default: its folder)."})
    eval_privacy_limit: int | None = field(default=40, metadata={
        "help": "Samples of eval_privacy_items scored at each evaluation (null: all of them)."})
    eval_privacy_max_new_tokens: int = field(default=24, metadata={
        "help": "Answer length at each privacy evaluation (eval/suites/demo.yaml's)."})


def run(main) -> None:
    """Run an entry script through the shared wrapper (cli/entry.py): bad input ends it with one line and
    exit status 2, a diverged loss with one line and 1, Ctrl-C with one line and 130."""
    run_command(main, interrupted="interrupted; the same command with --resume_from_checkpoint true resumes from the "
                            "last complete checkpoint")


def parse_recipe(*dataclass_types):
    """`script.py RECIPE.yaml [--key value ...]`: the recipe sets defaults, flags override them.

    Every problem raises InputError naming the recipe (and line) or the command line: a missing or non-UTF-8
    recipe, bad YAML, an unknown key or flag (with the closest known one), a flag abbreviation (argparse's
    prefix matching is off: `--max_step` is not `--max_steps`), a value the dataclasses refuse.
    """
    from trl import TrlParser

    from cli import log

    log.quiet_third_party()  # before the arguments' own set-up imports DeepSpeed (its CPU notice, cli/log.py)

    class Parser(TrlParser):
        def error(self, message):  # argparse prints its usage and exits: one line instead
            option = re.match(r"argument --(\w+)", message)  # a recipe value goes through the same conversion
            raise InputError(_source(option and option[1]), None, None, message)

    parser = Parser(dataclass_types, allow_abbrev=False)
    argv = sys.argv[1:]
    config, env = {}, {}
    if argv and argv[0].endswith((".yaml", ".yml")):
        config = _read_recipe(argv[0], parser._actions, _mapping_fields(dataclass_types))
        env = config.pop("env", None) or {}
        if not isinstance(env, dict):
            raise InputError(argv[0], None, "env", "expected a mapping of variable: value")
        _check_env(argv[0], env)
        parser.set_defaults_with_config(**config)
        argv = argv[1:]
    from cli import secrets

    # before argparse converts (and may echo) a value: visible to every `ps`, and saved with the run
    secrets.refuse_on_command_line(argv, recorded=True, key_options=tuple(
        option for option, action in parser._option_string_actions.items() if secrets.is_credential_field(action.dest)))
    values, unknown = parser.parse_known_args(argv)
    if unknown:
        flag = next((arg.split("=")[0] for arg in unknown if arg.startswith("-")), None)
        if flag is None:
            raise InputError("command line", None, unknown[0], "unexpected argument (the recipe comes first)")
        options = [option.lstrip("-") for option in parser._option_string_actions]
        raise InputError("command line", None, flag, "unknown option" + did_you_mean(flag.lstrip("-"), options, "--"))
    _refuse_keys(vars(values), env, sys.argv[1] if env else None)
    from train.ranges import check_values

    given = {action.dest for action in map(parser._option_string_actions.get, (a.split("=")[0] for a in argv)) if action}
    nulls = {key for key in [*config, *given] if getattr(values, key, 0) is None}  # `key: null`, `--key null`
    check_values(vars(values), dataclass_types, _fail, nulls)  # before the dataclasses' __post_init__ divides by some
    os.environ.update({key: str(value) for key, value in env.items()})  # all checked: the recipe's variables
    try:
        parsed = parser.parse_args_into_dataclasses(argv)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - the dataclasses' own checks on the user's values, whatever they raise
        # (TrainingArguments.__post_init__: ValueError, TypeError; a config path that is not a file: OSError)
        message = " ".join(str(err).split())
        if not isinstance(err, (ValueError, TypeError)):
            message = f"{type(err).__name__}: {message}"
        name = _named_option(message, vars(values), argv, config)
        raise InputError(_source(name), None, name, message) from None
    return parsed


def _check_env(recipe, env: dict) -> None:
    """The recipe's `env:` entries, before one is set: a name is a variable's name (letters, digits, _; not YAML's
    `ON` / `yes`, which it reads as true, nor empty, nor holding `=`), not a key's (a key is never read from a
    file), and a value is text or a number with no NUL (os.environ refuses one with a ValueError)."""
    from cli.secrets import IDENTIFIER, SECRET_NAME

    for name, value in env.items():
        line = env.key_lines.get(name) if hasattr(env, "key_lines") else None
        if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
            hint = " (YAML reads ON, yes, no and similar as true or false: quote the name)" \
                if isinstance(name, bool) else ""
            raise InputError(recipe, line, "env", f"{name!r} is not an environment variable's name (letters, digits "
                             f"and _, not starting with a digit){hint}")
        if SECRET_NAME.search(name):
            raise InputError(recipe, line, f"env.{name}", "a key is never read from a file; "
                             f"set {name} in the environment instead")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InputError(recipe, line, f"env.{name}", "expected text or a number (quote true / false)")
        if "\0" in str(value):
            raise InputError(recipe, line, f"env.{name}", "holds a NUL character; refused (no variable can hold one)")


def _fail(name: str, message: str):
    raise option_error(name, message)


def _refuse_keys(values: dict, env: dict, recipe) -> None:
    """No key among a run's arguments, however given (cli.secrets.refuse_recorded: a credential field, a value
    holding a known secret, a URL with credentials, query or fragment), and no key source set by the recipe's
    `env:`: a variable named as a key source (judge_api_key_env) holds a key, which is never read from a file."""
    from cli import secrets

    for name, value in values.items():
        if secrets.KEY_SOURCE.search(name) and isinstance(value, str) and value in env:
            raise InputError(recipe, env.key_lines.get(value), f"env.{value}", f"holds a key ({name} names it); "
                             f"a key is never read from a file: set {value} in the environment instead")
    secrets.refuse_recorded(values, _source)


def _named_option(message: str, options, argv: list[str], config: dict) -> str | None:
    """The option a dataclass's own error is about: of the options it names, the first the command line sets, else
    the first the recipe sets, else the first named (None when it names none)."""
    named = list(dict.fromkeys(word for word in re.findall(r"\w+", message) if word in options))
    given = {arg.split("=")[0].removeprefix("--") for arg in argv if arg.startswith("--")}
    return next((n for n in named if n in given), next((n for n in named if n in config), named[0] if named else None))


def _log_arguments(*parsed) -> None:
    """The data and model arguments that differ from their defaults, once, from the first process, when all input
    is checked (bad input stays one line; the trainer logs the training arguments)."""
    from cli import log
    from losses.checkpointing import non_default_arguments

    if int(os.environ.get("RANK", "0")) == 0:
        log.setup()
        for args in parsed:
            logger.info("%s: %s", type(args).__name__, json.dumps(non_default_arguments(args)))


def _recipe_schema(actions) -> dict:
    """Option -> the cli.strict_yaml schema of its recipe value: a flag takes true or false (never the text
    "no", nor 1), a list option a list of plain values (one value is a list of one, as on the command line:
    `loss_type: sigmoid`); anything else goes through argparse's conversion below."""
    from cli.strict_yaml import ANY, TEXT

    schema = {}
    for action in actions:
        if action.nargs == 0 or getattr(action.type, "__name__", None) == "string_to_bool":
            schema[action.dest] = bool  # the option, or its `--no_` twin
        elif action.nargs in ("+", "*"):
            schema.setdefault(action.dest, [(TEXT, int, float)])
        else:
            schema.setdefault(action.dest, ANY)
    return schema


def _mapping_fields(dataclass_types) -> set[str]:
    """The fields whose type takes a mapping (`dict | str`: activation_checkpointing_kwargs, model_init_kwargs)."""
    import dataclasses
    import typing

    found = set()
    for config in dataclass_types:
        hints = typing.get_type_hints(config)
        for f in dataclasses.fields(config):
            if any(t is dict or typing.get_origin(t) is dict for t in typing.get_args(hints[f.name]) or [hints[f.name]]):
                found.add(f.name)
    return found


def _read_recipe(path, actions, mappings: set[str] = frozenset()) -> dict:
    """The recipe's `key: value` pairs, each a known option of the type it takes (`_recipe_schema`); a value
    argparse will not convert (it converts only strings, and YAML has typed the rest) is handed over as text when
    it is not of the option's type, so `max_steps: 1.5` fails as `--max_steps 1.5` does."""
    from cli import secrets, strict_yaml

    schema = _recipe_schema(actions)
    actions = {action.dest: action for action in actions}
    config = strict_yaml.load(path)  # duplicate keys, alias bombs, FIFOs refused, with lines
    if not isinstance(config, dict):
        raise InputError(path, None, None, "expected `key: value` lines (a YAML mapping)")
    secrets.refuse_in_config(path, config, recorded=True)  # hub_token, a key in env:, a key-shaped value: refused
    for key in list(config):
        line = strict_yaml.line_of(config, key)
        if key == "env":
            continue
        if key not in actions:
            raise InputError(path, line, key, "unknown key" + did_you_mean(key, actions))
        action, value = actions[key], config[key]
        if isinstance(schema[key], list) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = config[key] = [value]  # `--loss_type sigmoid` is a list of one; never a string PEFT reads as a pattern
        if value is not None:
            strict_yaml.check(path, value, schema[key], key, line)
        if isinstance(value, list) and action.type is str:
            config[key] = [str(item) for item in value]  # as the command line gives them
        kind = getattr(action.type, "__name__", None)  # other converters (choices, enums, config classes) take text
        if value is None or action.nargs not in (None, "?") or _ACCEPTS.get(kind, _ACCEPTS["str"])(value):
            continue
        if isinstance(value, (list, dict)):
            if isinstance(value, dict) and key in mappings:  # typed `dict | str` (activation_checkpointing_kwargs)
                continue
            raise InputError(path, line, key, f"expected one value, got a {type(value).__name__}")
        config[key] = str(value)
    return config


_ACCEPTS = {  # the option type's name -> the YAML values it takes as they are
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "string_to_bool": lambda v: isinstance(v, bool),
}


def option_error(name: str, message: str) -> InputError:
    """A bad option value, naming where it came from."""
    return InputError(_source(name), None, name, message)


def _source(name: str | None = None) -> str:
    """Where an option's value came from: the command line if it sets it, else the recipe."""
    argv = sys.argv[1:]
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"} if name else set()
    if any(arg.partition("=")[0] in spellings for arg in argv):
        return "command line"
    return argv[0] if argv and argv[0].endswith((".yaml", ".yml")) else "command line"


def check_run(script_args: SpyTuneArguments, training_args, model_args) -> None:
    """Option ranges and paths, before any work: raises InputError naming the recipe or the command line."""
    def fail(name, message):
        raise option_error(name, message)

    for config in (script_args, training_args, model_args):  # the ranges: parse_recipe (train/ranges.py)
        numbers.check_finite_fields(config, fail)
    if not model_args.model_name_or_path:  # TRL types it Optional; a run needs it
        fail("model_name_or_path", "missing: name the model to train (a Hub id or a model folder)")
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        fail("max_steps", f"must be > 0 (or -1: train num_train_epochs), got {training_args.max_steps}")
    if None not in (script_args.min_pixels, script_args.max_pixels) and script_args.min_pixels > script_args.max_pixels:
        fail("max_pixels", f"smaller than min_pixels ({script_args.max_pixels} < {script_args.min_pixels})")
    if training_args.push_to_hub and not training_args.hub_model_id:
        fail("hub_model_id", "push_to_hub needs it (e.g. your-name/qwen2-vl-7b-spy-nca-p)")
    if script_args.general_fraction and not script_args.general_data_path:
        fail("general_fraction", "needs general_data_path (the general-task file its rows come from)")
    if script_args.categories is not None:
        from data_prep.categories import load_categories

        if not Path(script_args.categories).is_file():
            fail("categories", f"category file not found: {script_args.categories}")
        load_categories(script_args.categories)  # a bad file: InputError naming its line and field
    check_peft(model_args, training_args, fail)
    check_settings(training_args, model_args, fail)
    _check_paths(script_args, training_args, model_args, fail)


def check_settings(training_args, model_args, fail) -> None:
    """The settings the number table cannot judge, each checked by building what uses it, before any weight is
    read: the reporting integrations (known to transformers and installed), the learning-rate scheduler with its
    kwargs (on a one-parameter optimizer), the attention implementation (on the model's skeleton, meta device)."""
    import torch
    from transformers import get_scheduler
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    report_to = training_args.report_to
    reporting = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "wandb" in reporting or "all" in reporting:
        from cli.secrets import hook_console_capture

        hook_console_capture()  # W&B's console log records the scrubbed text (before the Trainer imports wandb)
    for name in reporting:
        if name in ("all", "none"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            fail("report_to", f"unknown integration {name!r}{did_you_mean(name, INTEGRATION_TO_CALLBACK)}; "
                              f"choose from {', '.join(sorted(INTEGRATION_TO_CALLBACK))}, all or none")
        if name not in get_available_reporting_integrations():
            fail("report_to", f"{name} is not installed in this environment; install it or choose another "
                              f"(installed: {', '.join(get_available_reporting_integrations()) or 'none'})")
    kwargs = training_args.lr_scheduler_kwargs or {}
    try:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        get_scheduler(training_args.lr_scheduler_type, optimizer, num_warmup_steps=1, num_training_steps=2,
                      scheduler_specific_kwargs=dict(kwargs))
    except (TypeError, ValueError, KeyError) as err:
        fail("lr_scheduler_kwargs" if kwargs else "lr_scheduler_type",
             f"{training_args.lr_scheduler_type} refuses them: {' '.join(str(err).split())}")
    if model_args.attn_implementation is not None:
        _check_attention(model_args, training_args, fail)


def _check_attention(model_args, training_args, fail) -> None:
    """`attn_implementation` set on the model's skeleton (meta device: nothing read or allocated), as loading
    sets it: an unknown or unavailable implementation is transformers' own one-line refusal."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    trust = training_args.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                            trust_remote_code=trust)
    except (OSError, ValueError, KeyError):
        return  # no such model: the path checks and the loader say so
    try:
        with torch.device("meta"):
            AutoModelForImageTextToText.from_config(config, trust_remote_code=trust,
                                                    attn_implementation=model_args.attn_implementation)
    except (ValueError, ImportError) as err:
        fail("attn_implementation", " ".join(str(err).split())[:400])


def _default_lora_targets(model_args, model_type: str, fail) -> None:
    """`--use_peft true` without `lora_target_modules`: the family's default targets (vlm/families.py), said
    once; a family without one is refused here, before the data and the model load (PEFT would stop later with a
    traceback)."""
    from vlm.families import default_lora_targets

    targets = default_lora_targets(model_type)
    if targets is None:
        fail("lora_target_modules", f"use_peft needs it for {model_type} (no default for this family): name the "
                                    "modules to adapt, e.g. --lora_target_modules q_proj k_proj v_proj o_proj, or "
                                    "all-linear")
    model_args.lora_target_modules = targets
    logger.info("use_peft: no lora_target_modules given; adapting the %s language model's attention and MLP "
                "projections (%s)", model_type, targets)


def _check_paths(script_args, training_args, model_args, fail) -> None:
    """A local model is a model folder; an output never overwrites an input, and its folder can be written."""
    name = model_args.model_name_or_path
    model = Path(name)
    if model.is_dir() and not (model / "config.json").is_file():
        fail("model_name_or_path", f"{model} is not a model folder (no config.json)")
    if not model.exists() and (model.is_absolute() or name.startswith(".") or name.count("/") > 1):  # not a Hub id
        fail("model_name_or_path", f"model folder not found: {model}")
    out = real(training_args.output_dir)  # a symbolic link loop: one line
    inputs = {"train_data_path": script_args.train_data_path, "eval_data_path": script_args.eval_data_path,
              "label_path": script_args.label_path, "categories": script_args.categories,
              "image_folder": script_args.image_folder,
              "model_name_or_path": model_args.model_name_or_path}
    for name, value in inputs.items():
        if value and real(value) == out:
            fail("output_dir", f"is the {name} ({value}); an output never overwrites an input")
    problem = unwritable(out, is_folder=True)
    if problem:
        fail("output_dir", f"{out} {problem}")
    from store import locks
    from train.resume import check_base_data, check_finished, check_resume

    check_base_data(script_args, model_args, fail)
    check_finished(script_args, training_args, resume_checkpoint(training_args), fail)
    check_resume(script_args, training_args, model_args, resume_checkpoint(training_args), fail)
    from store.runs import claim_folder, training_command

    # transformers writes README.md, config.json... there: a folder of the user's files is refused. The run's own
    # marker (written by train/card.attach, copied with the folder) makes it this script's folder, resumed or not;
    # never a name pattern (a user's `checkpoint-notes.txt` made a folder of the user's files look like a run's)
    claim_folder(out, training_command(), option="--output_dir", mark=False)
    # held until the process ends: one training run per folder. A folder whose parent is still missing is locked
    # once everything is checked (load_model_and_processor): nothing is created before then
    locks.acquire(out, "training output folder", create=False)


def load_model_and_processor(model_args, script_args: SpyTuneArguments, training_args):
    """Model and processor through `from_pretrained`, as for Qwen2-VL-7B-Instruct on the Hub."""
    _log_arguments(script_args, model_args)
    try:
        model, processor = _load_model_and_processor(model_args, script_args, training_args)
    except OSError as err:  # not a local folder and not on the Hub (or offline), unreadable weights
        raise option_error("model_name_or_path",
                           f"cannot load {model_args.model_name_or_path}: {str(err).splitlines()[0]}") from None
    if model_args.use_peft:
        check_lora_targets(model, model_args.lora_target_modules, "lora_target_modules")
        check_lora_targets(model, model_args.lora_modules_to_save, "lora_modules_to_save")
    from store import locks

    # recipe, data and model checked (every script loads the model last, right before its trainer makes output_dir):
    # the output folder may be created now, and is locked (a second hold of check_run's lock is free)
    locks.acquire(real(training_args.output_dir), "training output folder")
    return model, processor


def check_lora_targets(model, targets, option: str) -> None:
    """Each module name a LoRA option lists matches a module of the model, as PEFT matches it (the whole name or its
    last dotted parts): PEFT itself only asks that one of them match, so a typo would train without it, silently."""
    if not targets or isinstance(targets, str) or list(targets) == ["all-linear"]:
        return
    names = [name for name, _ in model.named_modules()]
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in names):
            leaves = sorted({name.rsplit(".", 1)[-1] for name in names if name})
            raise option_error(option, f"{target!r} matches no module of {_model_name(model)}"
                                       f"{did_you_mean(target, leaves)}")


def check_peft(model_args, training_args, fail) -> None:
    """The LoRA options applied as PEFT applies them, to the model's skeleton (meta device: no weights read or
    allocated), before anything loads: a target that matches no module, or one PEFT cannot adapt, is one line."""
    if not model_args.use_peft:
        return
    import torch
    from peft import inject_adapter_in_model
    from transformers import AutoConfig, AutoModelForImageTextToText
    from trl import get_peft_config

    trust = training_args.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                            trust_remote_code=trust)
    except (OSError, ValueError, KeyError):
        return  # no such model: said by the path checks and the loader, with their own line
    if not model_args.lora_target_modules:
        _default_lora_targets(model_args, config.model_type, fail)
    targets = model_args.lora_target_modules
    if isinstance(targets, str) and targets != "all-linear" and re.fullmatch(r"[\w.]+", targets):
        # TRL's ModelConfig turns a one-item list into its item, which PEFT reads as a regular expression of the
        # whole module path: `--lora_target_modules q_proj` would match nothing. A plain name stays a name.
        model_args.lora_target_modules = [targets]
    try:
        with torch.device("meta"):
            skeleton = AutoModelForImageTextToText.from_config(config, trust_remote_code=trust)
    except (OSError, ValueError, KeyError):
        return  # not a model this can build: loading it names the problem
    check_lora_targets(skeleton, model_args.lora_target_modules, "lora_target_modules")
    check_lora_targets(skeleton, model_args.lora_modules_to_save, "lora_modules_to_save")
    try:
        with torch.device("meta"):
            inject_adapter_in_model(get_peft_config(model_args), skeleton)
    except (ValueError, TypeError) as err:  # PEFT's own refusals (NoMatchingPeftModuleError is a ValueError)
        message = re.sub(r"Target module (\w+)\(.*\) is not supported", r"Target module \1 is not supported",
                         " ".join(str(err).split()))  # PEFT prints the whole module
        fail("lora_target_modules", message)
    from peft.tuners.tuners_utils import BaseTunerLayer

    if isinstance(skeleton.get_output_embeddings(), BaseTunerLayer):  # TRL's trainers refuse it after loading
        fail("lora_target_modules", "an adapter on lm_head would never train (TRL computes the log-probabilities "
             "from lm_head.weight directly); remove it")


def _model_name(model) -> str:
    return getattr(model.config, "_name_or_path", None) or type(model).__name__


def _load_model_and_processor(model_args, script_args: SpyTuneArguments, training_args):
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import get_quantization_config

    from vlm.families import pixel_kwargs

    trust = training_args.trust_remote_code
    pixel_bounds = pixel_kwargs(model_args.model_name_or_path, script_args.min_pixels, script_args.max_pixels,
                                revision=model_args.model_revision, trust_remote_code=trust)  # InputError: `run`
    processor = AutoProcessor.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=trust, **pixel_bounds
    )
    quantization_config = get_quantization_config(model_args)
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    model = AutoModelForImageTextToText.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=dtype,
        attn_implementation=model_args.attn_implementation,
        trust_remote_code=trust,
        quantization_config=quantization_config,
        # QLoRA: each process keeps its quantized copy on its own device
        device_map={"": PartialState().local_process_index} if quantization_config is not None else None,
    )
    return model, processor


def load_datasets(method: str, script_args: SpyTuneArguments, training_args):
    """(train, eval or None) datasets of one method; bad input raises InputError naming file, record, field, and so
    does a batch the training data cannot fill (train/ranges.py check_batches), before the model loads;
    `general_fraction` of the training rows come from the general-task file."""
    from data_prep.spy_tune import build_dataset
    from train.ranges import check_batches

    share = script_args.general_fraction
    if script_args.general_data_path and not share and not (share is None and method == "sft"):
        _fail("general_data_path", "needs general_fraction > 0 (the share of the training rows it gives)")

    def build(path, shuffle, num_samples, **extra):
        return build_dataset(method, path, script_args.image_folder, script_args.add_distractors,
                             script_args.label_path, shuffle, training_args.seed, num_samples,
                             categories=script_args.categories, **extra)

    train = build(script_args.train_data_path, script_args.shuffle, script_args.num_train_samples,
                  helpful=script_args.helpful, general_path=script_args.general_data_path,
                  general_fraction=script_args.general_fraction or None)
    check_batches(method, len(train), training_args, _fail)
    evaluation = build(script_args.eval_data_path, False, None) if script_args.eval_data_path else None
    return train, evaluation


def resume_checkpoint(training_args):
    """`--resume_from_checkpoint PATH`, or `true` for the newest checkpoint in output_dir."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "none", ""):
        return None
    return True if str(value).lower() in ("true", "last") else value

"""Every number a user gives, checked where it is parsed: a command-line option, a suite value, a recipe field.

A number is refused unless it is finite (`nan`, `inf`, `1e999` never pass) and inside its option's range. One
table, `RULES`, gives each option's range by name, so `timeout` means the same range on every command line, in
a suite's backend and judge options and in the chat client that finally uses it:

    parser.add_argument("--timeout", type=option("timeout"))      # argparse: one line naming --timeout
    check_mapping("suite.yaml", options, "backend_options")        # a config mapping: InputError naming the key
    check_value(value, RULES["timeout"], "suite.yaml", "timeout")  # one value

Names not in the table take `whole()` or `real()` rules directly (`int_at_least(n)`, `positive_float`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from cli.errors import InputError


@dataclass(frozen=True)
class Rule:
    """A range of numbers: [low, high] with either end open or absent; `whole` asks for an integer."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False

    def describe(self) -> str:
        if self.whole and self.high is None and self.low is not None and not self.low_open:
            return f"at least {self.low}"
        if self.high is None and self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None and self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        if self.low is None:
            return "finite"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def problem(self, value) -> str | None:
        """Why `value` (already a number) is out of range, or None."""
        if not finite(value):
            return f"must be a finite number, got {shown(value)}"
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)) \
                or self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return f"must be {self.describe()}, got {shown(value)}"
        return None

    def parse(self, text: str):
        """The number `text` says, or ValueError with the reason."""
        if self.whole:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"expected a whole number, got {text!r}") from None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None


def shown(value) -> str:
    """A number as an error shows it: an integer of more than 30 digits by its size (str() of one past Python's
    digit limit raises ValueError, whatever spelling it was read from)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    return str(value)


def finite(value) -> bool:
    """Whether a number is finite as a float: nan, inf and an integer past a float's range (a JSON 10**400, which
    math.isfinite cannot even convert) are not."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def whole(at_least: int | None = None, at_most: int | None = None) -> Rule:
    return Rule(at_least, at_most, whole=True)


def real(low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False) -> Rule:
    return Rule(low, high, low_open, high_open)


POSITIVE = real(0, low_open=True)
NON_NEGATIVE = real(0)
FRACTION = real(0, 1)

# Option name (with `_`, as argparse stores it) -> its range, wherever the option is given.
RULES: dict[str, Rule] = {
    # requests to endpoints (vlm/chat_client.py and every command that makes one)
    "timeout": POSITIVE, "backoff": NON_NEGATIVE, "max_backoff": NON_NEGATIVE, "temperature": real(0, 2),
    "concurrency": whole(1), "max_retries": whole(0), "retries": whole(0), "max_tokens": whole(1),
    "max_connection_failures": whole(1),
    "max_new_tokens": whole(1, 2**31 - 1), "min_delay_seconds": NON_NEGATIVE,
    # sampling (GRPO's generation_kwargs, the eval CLIs): what a sampler accepts
    "top_p": real(0, 1, low_open=True), "top_k": whole(-1), "min_p": FRACTION, "repetition_penalty": POSITIVE,
    # how much and in what order
    "limit": whole(1), "seed": whole(0), "batch_size": whole(1), "eval_batch_size": whole(1),
    "eval_limit": whole(1), "review": whole(0), "variants": whole(1), "near_dup": real(0, 1, low_open=True),
    "test_fraction": real(0, 1, high_open=True), "train_per_label": whole(1), "test_per_label": whole(1),
    "general_train": whole(1), "general_test": whole(1), "n_images": whole(1), "synthetic_images": whole(1),
    "sft_steps": whole(1), "nca_p_steps": whole(1), "steps": whole(1),
    "backbone_steps": whole(1),
    # models and images
    # pixels: at most 2^28 (16,384 x 16,384; Qwen2-VL's default max is 12,845,056): past it the processor's resize
    # overflows (a RuntimeError) or asks for more memory than any machine has
    "min_pixels": whole(1, 2**28), "max_pixels": whole(1, 2**28), "tensor_parallel_size": whole(1),
    "data_parallel_size": whole(1), "max_model_len": whole(1), "gpu_memory_utilization": real(0, 1, low_open=True),
    "image_size": whole(1), "width": whole(32), "height": whole(32), "hidden": whole(1), "layers": whole(1),
    "vision_depth": whole(1), "vision_embed": whole(1),
    # launchers
    "gpus_per_node": whole(1), "port": whole(1, 65535), "nodes": whole(1),
    # GRPO's dynamic sampling and guidance: train/ranges.py checks a recipe's at parse time, losses/grpo_trainer.py a
    # config built in code
    "dynamic_sampling_max_extra_rounds": whole(1), "dynamic_sampling_min_spread": NON_NEGATIVE,
    "dynamic_sampling_anchor_share": FRACTION, "guidance_gamma": POSITIVE, "guidance_mu": NON_NEGATIVE,
}


def rule_for(name: str) -> Rule | None:
    return RULES.get(name.lstrip("-").replace("-", "_"))


def _argparse_type(rule: Rule, name: str):
    def parse(text: str):
        try:
            value = rule.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        problem = rule.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def option(name: str):
    """The argparse type of the option `name` (its rule in RULES)."""
    rule = rule_for(name)
    if rule is None:
        raise KeyError(f"no range for {name!r} in cli.numbers.RULES")
    return _argparse_type(rule, "whole number" if rule.whole else "number")


def int_at_least(minimum: int):
    """An argparse type: a whole number >= minimum."""
    return _argparse_type(whole(minimum), "whole number")


positive_float = _argparse_type(POSITIVE, "positive number")  # an argparse type: a finite number > 0


def check_value(value, rule: Rule, source, field: str, where=None):
    """A number read from a file (YAML, JSON): refused unless it is one (not a bool, not text) and in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a whole number" if rule.whole else "a number"
        raise InputError(source, where, field, f"expected {kind}, got {value!r}")
    if rule.whole and not isinstance(value, int):
        raise InputError(source, where, field, f"expected a whole number, got {value!r}")
    problem = rule.problem(value)
    if problem:
        raise InputError(source, where, field, problem)
    return value


def check_mapping(source, mapping: dict, prefix: str = "", rules: dict[str, Rule] = RULES) -> None:
    """Every key of a config mapping that names a numeric option holds a number in that option's range
    (None means unset); refusals name the key as `prefix.key`."""
    for key, value in mapping.items():
        rule = rules.get(str(key))
        if rule is not None and value is not None:
            check_value(value, rule, source, f"{prefix}.{key}" if prefix else str(key))


def check_finite_fields(config, fail) -> None:
    """Every float field of a dataclass config (a recipe's) is finite: `fail(name, message)` for the first that
    is not (`learning_rate: .inf`, `--num_train_epochs inf`)."""
    import dataclasses

    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if isinstance(value, float) and not math.isfinite(value):
            fail(f.name, f"must be a finite number, got {value}")

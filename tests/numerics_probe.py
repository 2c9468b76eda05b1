"""Which kernel's result moves when a library's CPU dispatch changes (docs/study.md, "Reproducibility across machines").

    python tests/numerics_probe.py record OUT.json train/dpo.py recipes/study/dpo.yaml --model_name_or_path M \\
        --train_data_path D/train_data.json --image_folder D --output_dir RUN --max_steps 1 --save_strategy no
    DNNL_MAX_CPU_ISA=AVX2 python tests/numerics_probe.py record OTHER.json ...   (the same, another dispatch)
    python tests/numerics_probe.py compare OUT.json OTHER.json

`record` runs the training script as accelerate would (one process) and logs every aten op of the first training
step, forward and backward, with a hash of each floating-point input and output. `compare` walks two logs side by
side and names the ops whose inputs are bitwise equal and whose outputs are not: the kernels that round differently.
"""

from __future__ import annotations

import collections
import hashlib
import json
import runpy
import sys


def record(out: str, script: str, *script_args: str) -> None:
    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    ops = []

    def digest(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            data = value.detach().contiguous()
            return hashlib.blake2b(data.numpy().tobytes(), digest_size=8).hexdigest() + str(tuple(data.shape))
        return None

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = [d for d in map(digest, tree_flatten((args, kwargs))[0]) if d]
            result = func(*args, **kwargs)
            ops.append({"op": str(func), "in": inputs, "out": [d for d in map(digest, tree_flatten(result)[0]) if d]})
            return result

    original, calls = transformers.Trainer.training_step, []

    def first_step_logged(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            return original(self, *args, **kwargs)
        with Log():
            return original(self, *args, **kwargs)

    transformers.Trainer.training_step = first_step_logged
    sys.argv = [script, *script_args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        with open(out, "w") as f:
            json.dump(ops, f)


def compare(a_path: str, b_path: str) -> None:
    with open(a_path) as fa, open(b_path) as fb:
        a, b = json.load(fa), json.load(fb)
    if [x["op"] for x in a] != [y["op"] for y in b]:
        sys.exit("the two logs ran different ops")
    moved = collections.Counter()
    first = None
    for i, (x, y) in enumerate(zip(a, b)):
        if x["in"] == y["in"] and x["out"] != y["out"]:
            moved[x["op"]] += 1
            first = first or (i, x["op"], x["in"])
    differing = sum(x["out"] != y["out"] for x, y in zip(a, b))
    print(f"{len(a)} ops, {differing} with other outputs; equal inputs, other outputs: {dict(moved) or 'none'}")
    if first:
        print(f"first: op {first[0]} {first[1]} on {', '.join(first[2])}")


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or ["help"]
    if command == "record" and len(rest) >= 2:
        record(*rest)
    elif command == "compare" and len(rest) == 2:
        compare(*rest)
    else:
        sys.exit(__doc__)

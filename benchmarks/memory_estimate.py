"""Memory per GPU for the README's "Scaling out" setups, from DeepSpeed's and accelerate's own estimators (model
states only: weights, gradients, optimizer states; activations come on top and depend on batch and image size).

    python benchmarks/memory_estimate.py [--out benchmarks/results]

Qwen2-VL-7B and -72B are built from their published configurations on the meta device (no memory, no download);
their parameter counts and largest layer feed `estimate_zero2_model_states_mem_needs` /
`estimate_zero3_model_states_mem_needs` (DeepSpeed, no offload, its default 1.5 buffer factor for CPU memory) and
accelerate's `calculate_maximum_sizes` (bf16 weights; /4 for 4-bit as `accelerate estimate-memory` does).
NCA-P / DPO / NCA with a live reference add the reference's weights: 2 bytes per parameter on every GPU under
ZeRO-2 (TRL runs it as a stage-0 engine), 2 / N under ZeRO-3 (sharded like the policy), none when precomputed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nca_p_throughput import MODEL_SPECS, build_model, build_processor  # noqa: E402

GIB = 2**30


def model_stats(name: str, processor) -> dict:
    import torch
    from accelerate.utils import calculate_maximum_sizes

    model = build_model(MODEL_SPECS[name], processor, "meta", torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    bf16_bytes, _ = calculate_maximum_sizes(model)
    return {"params": total, "largest_layer_params": largest, "bf16_weights_bytes": bf16_bytes}


def setups(stats: dict) -> list[dict]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    p, largest, weights = stats["params"], stats["largest_layer_params"], stats["bf16_weights_bytes"]
    rows = [
        {"setup": "1 GPU, LoRA (bf16 base)", "estimator": "accelerate calculate_maximum_sizes",
         "gpu": weights, "reference": 0},
        {"setup": "1 GPU, QLoRA (4-bit base)", "estimator": "accelerate calculate_maximum_sizes / 4",
         "gpu": weights / 4, "reference": 0},
    ]
    for nodes in (1, 2, 4):
        _, gpu = estimate_zero2_model_states_mem_needs(p, 8, nodes, cpu_offload=False)
        rows.append({"setup": f"{nodes} x 8 GPUs, ZeRO-2", "estimator": "deepspeed estimate_zero2_model_states_mem_needs",
                     "gpu": gpu, "reference": 2 * p})
        _, gpu, _ = estimate_zero3_model_states_mem_needs(p, largest, 8, nodes, cpu_offload=False,
                                                          cpu_offload_params=False, zero_init=True)
        rows.append({"setup": f"{nodes} x 8 GPUs, ZeRO-3", "estimator": "deepspeed estimate_zero3_model_states_mem_needs",
                     "gpu": gpu, "reference": 2 * p / (8 * nodes)})
    return rows


def main(argv=None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for memory_estimate.{json,md}")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        processor = build_processor(Path(tmp), 56 * 56, 224 * 224)
    report, lines = {}, ["| model | setup | model states per GPU (GiB) | + live reference (GiB) | estimator |",
                         "|---|---|---|---|---|"]
    for name in ("7b", "72b"):
        stats = model_stats(name, processor)
        rows = setups(stats)
        report[name] = {**stats, "setups": rows}
        for r in rows:
            lines.append(f"| Qwen2-VL-{name.upper()} ({stats['params'] / 1e9:.2f}B) | {r['setup']} | "
                         f"{r['gpu'] / GIB:.1f} | {r['reference'] / GIB:.1f} | {r['estimator']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "memory_estimate.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "memory_estimate.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

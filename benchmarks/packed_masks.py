"""Build time and memory of a packed batch's attention masks (losses/packing.py), side by side in one run: the
dense boolean (1, 1, T, T) tree mask that sdpa takes and flex_attention's BlockMask, for packed rows of T tokens up
to 16k, on the device given (CPU here; `--device cuda` on a GPU).

A row holds whole NCA-P examples shaped like SPY at 1 MP: a 1,370-token prefix (system text, 1,280 image tokens,
the question), two instruction branches of 20 tokens, four answers of 40 (1,570 tokens an example); the last
example is cut to fill T exactly. Each mask is built `--reps` times; the median build time is reported, with the
mask's stored bytes and the rise of the process's peak RSS (CPU) or of the CUDA allocator's peak during one build
(what the build needs beyond what it keeps, plus what it keeps).

    python benchmarks/packed_masks.py [--tokens 1024,2048,4096,8192,16384] [--reps 3] [--device cpu]
                                      [--json benchmarks/results/packed_masks_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import _libc, _status_kb, release_freed_memory, reset_rss_peak  # noqa: E402

from losses.packing import tree_attention_mask, tree_block_mask  # noqa: E402

PREFIX, BRANCH, ANSWER = 1370, 20, 40


def nca_p_tree(tokens: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(segments, ancestors) of a packed row of `tokens` tokens of NCA-P examples (prefix, 2 branches, 4 leaves)."""
    lengths, parents = [], []
    while sum(lengths) < tokens:
        root = len(parents)
        lengths.append(PREFIX), parents.append(-1)
        for _ in range(2):
            branch = len(parents)
            lengths.append(BRANCH), parents.append(root)
            for _ in range(2):
                lengths.append(ANSWER), parents.append(branch)
    lengths[-1] -= sum(lengths) - tokens
    while lengths[-1] <= 0:  # the cut removed whole segments
        excess = -lengths.pop() if lengths[-1] < 0 else lengths.pop()
        parents.pop()
        lengths[-1] -= excess
    segments = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    ancestors = torch.eye(len(parents), dtype=torch.bool)
    for s, parent in enumerate(parents):
        if parent >= 0:
            ancestors[s] |= ancestors[parent]
    return segments.to(device), ancestors.to(device)


def stored_bytes(mask) -> int:
    if isinstance(mask, torch.Tensor):
        return mask.numel() * mask.element_size()
    return sum(t.numel() * t.element_size() for t in vars(mask).values() if isinstance(t, torch.Tensor))


def peak_rise(build, device: str, libc) -> tuple[object, int]:
    """Build once and return the mask with how far the peak memory rose above its level before the build."""
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        mask = build()
        torch.cuda.synchronize()
        return mask, torch.cuda.max_memory_allocated() - start
    release_freed_memory(libc)
    reset_rss_peak()
    start = _status_kb("VmHWM")
    mask = build()
    return mask, (_status_kb("VmHWM") - start) * 1024


def measure(tokens: int, device: str, reps: int, libc) -> dict:
    segments, ancestors = nca_p_tree(tokens, device)
    result = {"tokens": tokens, "segments": int(ancestors.size(0))}
    for name, build in (("dense", tree_attention_mask), ("block", tree_block_mask)):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            mask = build(segments, ancestors)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            del mask
        mask, rise = peak_rise(lambda: build(segments, ancestors), device, libc)
        result[name] = {"build_s": statistics.median(times), "stored_mb": stored_bytes(mask) / 2**20,
                        "peak_rise_mb": rise / 2**20}
        del mask
    result["block_vs_dense_build_time"] = result["block"]["build_s"] / result["dense"]["build_s"]
    return result


def markdown(results: list[dict], device: str) -> str:
    lines = [f"| T (tokens) | segments | dense: build s | dense: stored MB | dense: peak rise MB | block: build s "
             f"| block: stored MB | block: peak rise MB |  ({device})", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        d, b = r["dense"], r["block"]
        lines.append(f"| {r['tokens']:,} | {r['segments']} | {d['build_s']:.3f} | {d['stored_mb']:.1f} | "
                     f"{d['peak_rise_mb']:.0f} | {b['build_s']:.3f} | {b['stored_mb']:.2f} | {b['peak_rise_mb']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    libc = _libc()
    results = [measure(int(t), args.device, args.reps, libc) for t in args.tokens.split(",")]
    print(markdown(results, args.device))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": args.device, "torch": torch.__version__, "results": results},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

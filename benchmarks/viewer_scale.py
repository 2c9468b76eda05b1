"""The sample viewer at the released SPY-Bench size, and the README's screenshot of the two-run view.

    python benchmarks/viewer_scale.py [--items-per-label 100] [--demo outputs/demo] [--screenshot docs/images/viewer_two_runs.png]

1. Draws a synthetic SPY-Bench of 67 x N items (data_prep/synthetic.py; N = 100 gives 6,700 items, one image each),
   expands it in both settings (about 65,000 samples: the released 32,700 x 2), judges every sample at random, and
   writes it as a suite folder (spy/<setting>/judged.jsonl and results.json, as `eval suite` does).
2. Times `eval view` on it: the first build (every thumbnail made), a second one into the same folder (thumbnails
   reused), and a two-run view into a new folder (a second run with 30% of the verdicts flipped).
3. Opens each in headless Chromium from file:// and times the first page (from navigation to the first sample card
   painted, by Chromium's element timing; also when it was in the DOM, and when Playwright saw it), the whole data
   loaded, and one filter change over all rows.
4. With the demo's outputs (`make demo`), writes the screenshot of its two-run view: the untrained base model
   against SFT + NCA-P, filtered to the samples NCA-P got right and the base got wrong.

Prints the measurements; the targets (issue 27) are a build under 60 s and a first page under 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store.runs import write_json, write_jsonl  # noqa: E402

ANSWERS = {"respond": "The {} can be seen in the picture.", "reject": "I'm sorry, I can't share the {}."}


def synthetic_suite(folder: Path, items_per_label: int, flip: float = 0.0, seed: int = 0, data=None) -> Path:
    """A suite-shaped folder of judged SPY-Bench runs over a synthetic bench (drawn into `data` when None)."""
    from data_prep.spy_bench import build_samples
    from data_prep.synthetic import build

    data = data or build(folder.parent / "synthetic-bench", train_per_label=1, test_per_label=items_per_label)
    rng = random.Random(seed)
    for setting, distractors in (("without_distractors", False), ("with_distractors", True)):
        samples = build_samples(data / "questions.json", images_dir=None, distractors=distractors)
        judged = []
        for s in samples:
            verdict = random.Random(f"{s['id']}{setting}").choice(sorted(ANSWERS))
            if rng.random() < flip:
                verdict = {"respond": "reject", "reject": "respond"}[verdict]
            judged.append({**s, "response": ANSWERS[verdict].format(s["question"].split()[-1].rstrip("?")),
                           "eval_resp": verdict, "judge": "rule"})
        write_jsonl(folder / "spy" / setting / "judged.jsonl", judged)
    write_json(folder / "results.json", {"headline": [], "sections": {"spy": {"without_distractors": {},
                                                                              "with_distractors": {}}},
                                         # outside the folder: eval view is given the images (images=data)
                                         "inputs": {"spy": {"images": str(data.resolve()), "categories": None}}})
    return data


def timed(label: str, fn):
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    print(f"{label:<58} {seconds:8.2f} s", flush=True)
    return value, seconds


def browse(context, index: Path, label: str) -> dict:
    page = context.new_page()
    start = time.perf_counter()
    page.goto(index.resolve().as_uri())
    page.wait_for_selector(".card")
    first = time.perf_counter() - start
    page.wait_for_selector("#status[data-done='1']", timeout=120_000)
    loaded = time.perf_counter() - start
    drawn = page.evaluate("VIEWER.state.firstPageMs") / 1000  # the page's own clock: navigation -> first page in the DOM
    # Chromium's element timing: when the first card was painted (Playwright's own check of the DOM can lag behind
    # while the page parses the later chunks)
    painted = page.evaluate("""() => new Promise(resolve => new PerformanceObserver(list => resolve(Math.min(
        ...list.getEntries().map(e => e.renderTime || e.loadTime)))).observe({type: "element", buffered: true}))""") / 1000
    label_value = page.evaluate("VIEWER.state.rows[0].bench + ':' + VIEWER.state.rows[0].category")
    total = page.inner_text("#total")
    start = time.perf_counter()
    page.select_option("select[data-facet='category']", label_value)
    page.wait_for_function("total => document.querySelector('#count').dataset.n !== total", arg=total)
    filtered = time.perf_counter() - start
    n = int(page.get_attribute("#count", "data-n"))
    page.close()
    print(f"{label:<46} first page: painted {painted:5.2f} s, in the DOM {drawn:5.2f} s, seen by Playwright "
          f"{first:5.2f} s | all data {loaded:5.2f} s | one filter {filtered:5.2f} s ({n} samples)", flush=True)
    return {"first_page_s": painted, "all_loaded_s": loaded, "filter_s": filtered}


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def demo_screenshot(demo: Path, path: Path, context) -> None:
    from eval.view import build_view

    base, aligned = demo / "suite" / "base", demo / "suite" / "nca_p"
    if not (base / "results.json").is_file() or not (aligned / "results.json").is_file():
        print(f"no demo outputs in {demo} (run `make demo`): no screenshot")
        return
    with tempfile.TemporaryDirectory() as tmp:
        index = build_view([base, aligned], Path(tmp) / "view", names=["base (untrained)", "SFT + NCA-P"],
                           images=demo / "synthetic-spy-tune",
                           spatialtrust_data=demo / "spatialtrust-synthetic" / "data.jsonl", progress=False)
        page = context.new_page()
        page.goto(index.resolve().as_uri())
        page.wait_for_selector("#status[data-done='1']")
        page.select_option("select[data-facet='section']", "with_distractors")
        page.select_option("select[data-facet='changed']", "improved")
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path))
        print(f"wrote {path} (the demo's two-run view: {page.get_attribute('#count', 'data-n')} samples the "
              "aligned model got right and the base got wrong, with distractors)")
        page.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items-per-label", type=int, default=100, help="67 x N items (100: ~65,000 samples)")
    parser.add_argument("--demo", type=Path, default=ROOT / "outputs" / "demo")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "images" / "viewer_two_runs.png")
    args = parser.parse_args()
    from eval.view import build_view
    from eval.view.browser import chromium

    with tempfile.TemporaryDirectory(prefix="viewer-scale-") as tmp:
        tmp = Path(tmp)
        data, _ = timed("synthetic SPY-Bench, both settings, judged (not the viewer)",
                        lambda: synthetic_suite(tmp / "run_a", args.items_per_label))
        synthetic_suite(tmp / "run_b", args.items_per_label, flip=0.3, seed=1, data=data)
        n = sum(1 for s in ("without_distractors", "with_distractors")
                for _ in open(tmp / "run_a" / "spy" / s / "judged.jsonl"))
        images = len(json.loads((data / "questions.json").read_text())["benchmark_list"])
        print(f"{n} samples, {images} images")
        _, first = timed("eval view, one run, first build (thumbnails made)",
                         lambda: build_view([tmp / "run_a"], tmp / "view1", images=data, progress=False))
        one_size = size_mib(tmp / "view1")
        _, again = timed("eval view, one run, again (thumbnails reused)",
                         lambda: build_view([tmp / "run_a"], tmp / "view1", images=data, progress=False))
        _, two = timed("eval view, two runs side by side, new folder (thumbnails made)",
                       lambda: build_view([tmp / "run_a", tmp / "run_b"], tmp / "view2", images=data,
                                                  progress=False))
        print(f"site size with its images: one run {one_size:.0f} MiB, two runs {size_mib(tmp / 'view2'):.0f} MiB")
        with chromium(timeout_ms=120_000) as context:
            context.new_page().goto("about:blank")  # the browser's own start-up is not the viewer's
            one_run = browse(context, tmp / "view1" / "index.html", f"Chromium, one run ({n} samples)")
            two_runs = browse(context, tmp / "view2" / "index.html", f"Chromium, two runs ({n} samples x 2)")
            demo_screenshot(args.demo, args.screenshot, context)
    worst_build = max(first, two)
    worst_page = max(one_run["first_page_s"], two_runs["first_page_s"])
    print(f"\nload average of the machine (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"build {worst_build:.1f} s (target < 60 s: {'met' if worst_build < 60 else 'NOT met'}); first page "
          f"{worst_page:.2f} s (target < 5 s: {'met' if worst_page < 5 else 'NOT met'}); rebuild {again:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

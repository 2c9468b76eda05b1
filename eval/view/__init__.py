"""`python -m eval view`: a per-sample results viewer, a static site that opens from file:// (no server, no network).

    python -m eval view outputs/demo/suite/base outputs/demo/suite/nca_p --names base NCA-P --out outputs/demo/view
    python -m eval view judged.jsonl --images DIR --out view        # one judged SPY-Bench run file

Each RUN is a suite folder (`python -m eval suite --out`) or a run file: judged SPY-Bench (`spy judge`),
GeoPrivacy (`geo generate` mcq / `geo judge` free-form) or SpatialTrust predictions (with --spatialtrust-data).
Open DIR/index.html in a browser: every sample with its image, prompt, answers and verdicts, filters with counts,
the headline metrics of what is filtered, and with two or more runs of the same items, the samples whose outcome
changed. A sample's link is index.html#id=<key>. The suite writes one into its --out (view/) and `eval compare`
one for the runs it compares.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError
from store.runs import check_outputs


def given_inputs(images=None, spatialtrust_data=None, geo_labels=None, geo_images=None, inputs=None) -> dict:
    """The inputs named on the command line (they win over what a suite folder or a run header records), over
    `inputs` (the same layout, e.g. the suite's own, records.suite_inputs)."""
    given = {section: dict(keys) for section, keys in (inputs or {}).items()}
    for (section, key), value in {("spy", "images"): images, ("geo", "images"): geo_images,
                                  ("geo", "labels"): geo_labels, ("spatialtrust", "data"): spatialtrust_data}.items():
        if value is not None:
            given.setdefault(section, {})[key] = value
    return given


def build_view(runs: list, out, names: list[str] | None = None, images=None, spatialtrust_data=None,
               geo_labels=None, title: str | None = None, progress: bool = True, geo_images=None,
               inputs: dict | None = None) -> Path:
    """Read every run (validating all of them first), then write the viewer under `out`; returns index.html.
    `images`, `spatialtrust_data`, `geo_labels`, `geo_images` and `inputs` (per section, as records.suite_inputs
    gives them) name inputs; they win over the roots a suite folder or run file records."""
    from eval.view.site import write_site

    names = names or [Path(r).name if Path(r).name != "results.json" else Path(r).parent.name for r in runs]
    if len(names) != len(runs) or len(set(names)) != len(names):
        raise InputError("command line", None, "--names", "give one distinct name per run")
    out = Path(out)
    for flag, value, folder in (("--images", images, True), ("--geo-images", geo_images, True),
                                ("--spatialtrust-data", spatialtrust_data, False), ("--geo-labels", geo_labels, False)):
        if value is not None and not (Path(value).is_dir() if folder else Path(value).is_file()):
            raise InputError("command line", None, flag, f"{value}: " + ("no such folder" if folder else "no such file"))
    check_outputs([*runs, images, spatialtrust_data, geo_labels, geo_images], [], folders=[out])
    for run in runs:
        if Path(out).resolve() == Path(run).resolve() or Path(run).resolve().is_relative_to(out.resolve()):
            raise InputError(run, None, None, f"is inside --out {out}; choose another --out")
    rows = load_rows(runs, given_inputs(images, spatialtrust_data, geo_labels, geo_images, inputs))
    return write_site(rows, names, out, title=title or " vs ".join(names), progress=progress)


def load_rows(runs: list, given: dict | None = None) -> list[dict]:
    """The rows of the runs, one per sample key, with each run's outcome (records.merge_runs); `given` as
    records.load_run takes it."""
    from eval.view.records import load_run, merge_runs

    rows = merge_runs([load_run(run, given) for run in runs])
    if not rows:
        raise InputError(runs[0], None, None, "no samples to show")
    return rows


def sample_table(rows: list[dict], run: int = 0, limit: int = 100):
    """A wandb.Table of the first `limit` samples of run `run` (image, prompt, answer, verdict, expected, score),
    from the viewer's rows (records.merge_runs), as lmms-eval logs its samples."""
    import wandb

    columns = ["key", "benchmark", "setting", "image", "category", "question", "answer", "verdict", "expected",
               "score", "state"]
    table = wandb.Table(columns=columns)
    for row in rows[:limit]:
        outcome = row["runs"][run] or {}
        detail = row.get("detail", {})
        question = detail.get("prompt") or detail.get("question")
        if row["bench"] == "spy":
            question = "\n".join(line["text"] for line in detail.get("instructions", [])) + "\n\n" + (question or "")
        table.add_data(row["key"], row["bench"], row["section"],
                       wandb.Image(str(row["image"])) if row.get("image") else None, row["category"], question,
                       outcome.get("answer"), outcome.get("verdict"), row.get("expected"), outcome.get("score"),
                       outcome.get("state"))
    return table


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m eval view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="suite folders or run files; the first is the baseline")
    parser.add_argument("--out", required=True, help="folder for index.html, its data and image thumbnails")
    parser.add_argument("--names", nargs="+", help="one name per run (default: folder or file names)")
    parser.add_argument("--images", help="folder the run files' image paths start in (SPY-Bench, GeoPrivacy run "
                                         "files); for a suite folder, its SPY-Bench images (default: the folder "
                                         "it records, when that lies inside it)")
    parser.add_argument("--geo-images", help="a suite folder's GeoPrivacy images (default: the folder it records, "
                                             "when that lies inside it)")
    parser.add_argument("--spatialtrust-data", help="the SpatialTrust data file of SpatialTrust predictions")
    parser.add_argument("--geo-labels", help="GeoPrivacy gold labels (default: the released annotation CSV)")
    parser.add_argument("--title", help="page title (default: the run names)")
    args = parser.parse_args(argv)
    index = build_view(args.runs, args.out, args.names, args.images, args.spatialtrust_data, args.geo_labels,
                       args.title, geo_images=args.geo_images)
    print(f"wrote {index}: open it in a browser (file://{index.resolve()})")
    return 0

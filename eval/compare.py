"""`python -m eval compare`: a leaderboard of several suite runs (their results.json), with deltas against the
first, warning when the runs were scored over different sample counts or with other settings.

    python -m eval compare outputs/suite/base outputs/suite/nca_p [--names base NCA-P] --out leaderboard

writes leaderboard/compare.md, compare.json and compare.png (one bar group per headline metric), and the runs'
per-sample viewer leaderboard/view/index.html (`python -m eval view`: answers side by side, the samples whose outcome
changed), linked from compare.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError, read_json
from store.runs import check_outputs, claim_files, write_json, write_text


def load(folder) -> dict:
    path = Path(folder) / "results.json" if Path(folder).is_dir() else Path(folder)
    results = read_json(path)
    if not isinstance(results, dict) or not isinstance(results.get("headline"), list):
        raise InputError(path, None, "headline", "missing (expected the results.json of `python -m eval suite`)")
    for n, row in enumerate(results["headline"], 1):
        for key in ("benchmark", "setting", "metric", "value", "n"):
            if key not in row:
                raise InputError(path, None, f"headline[{n}].{key}", "missing")
    return results


def without_nulls(value):
    """A setting with its null keys dropped, at every level: `"limit": null` and no `limit` are the same setting."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def differences(runs: dict[str, dict]) -> list[str]:
    """One warning line per headline metric whose sample counts differ, and per setting that differs."""
    warnings = []
    first_name, first = next(iter(runs.items()))
    counts: dict[tuple, dict] = {}
    for name, results in runs.items():
        for row in results["headline"]:
            counts.setdefault((row["benchmark"], row["setting"]), {})[name] = row["n"]
    for (benchmark, setting), by_run in counts.items():
        if len(set(by_run.values())) > 1 or len(by_run) < len(runs):
            listed = ", ".join(f"{name} {by_run.get(name, 'absent')}" for name in runs)
            warnings.append(f"{benchmark} {setting}: different sample counts ({listed}); not the same samples")
    base = without_nulls({k: v for k, v in first.get("settings", {}).items() if k != "model"})
    for name, results in list(runs.items())[1:]:
        other = without_nulls({k: v for k, v in results.get("settings", {}).items() if k != "model"})
        for key in sorted(set(base) | set(other)):
            if base.get(key) != other.get(key):
                warnings.append(f"{name}: setting {key!r} differs from {first_name}'s "
                                f"({json.dumps(other.get(key))} vs {json.dumps(base.get(key))})")
    return warnings


def missing_roots(folders: list, given: dict) -> None:
    """Refuse, in one line naming the options to give, suites whose viewer would lose images or SpatialTrust: the
    data a suite records lie outside its folder (the demo's suites: `../../synthetic-spy-tune`), and a results.json
    names files inside its folder only (eval/view/records.py, recorded_root)."""
    from eval.view.records import roots_outside

    for folder in folders:
        if not Path(folder).is_dir():  # a results.json given alone: its folder
            folder = Path(folder).parent
        wanted = roots_outside(folder, given)
        if wanted:
            raise InputError(Path(folder) / "results.json", None, "inputs", "the data it was run on lie outside the "
                             "suite folder, which a results.json may not name for the viewer; name them: "
                             + " ".join(f"{flag} {path}" for flag, path in wanted.items())
                             + " (or --no-view: the leaderboard without the sample viewer)")


def compare(folders: list, out, names: list[str] | None = None, view: bool = True, images=None,
            spatialtrust_data=None, geo_images=None, inputs: dict | None = None) -> str:
    """The leaderboard of the suite folders; `images`, `spatialtrust_data`, `geo_images` and `inputs` (as
    eval.view.build_view takes them) say where the viewer finds the samples' images and data."""
    from eval.report import bar_chart, markdown_table

    names = names or [Path(f).name for f in folders]
    if len(names) != len(folders) or len(set(names)) != len(names):
        raise InputError("command line", None, "--names", "give one distinct name per results folder")
    out = Path(out)
    check_outputs([], [out / "compare.md", out / "compare.json", out / "compare.png"],
                  folders=[out, *([out / "view"] if view else [])])
    claim_files(out, ["compare.md", "compare.json", "compare.png"])  # a user's compare.md: refused, not overwritten
    runs = {name: load(folder) for name, folder in zip(names, folders)}
    without = [name for name, results in runs.items() if not isinstance(results.get("sections"), dict)]
    if view and without:  # a results.json made elsewhere: scores without the samples behind them
        print(f"no sample viewer: {', '.join(without)} holds no per-sample sections", file=sys.stderr)
        view = False
    if view:
        from eval.view import build_view, given_inputs

        missing_roots(folders, given_inputs(images, spatialtrust_data, geo_images=geo_images, inputs=inputs))
        build_view(folders, out / "view", names=names, title=f"{' vs '.join(names)} (baseline {names[0]})",
                   progress=False, images=images, spatialtrust_data=spatialtrust_data, geo_images=geo_images,
                   inputs=inputs)
    keys = []
    for results in runs.values():
        for row in results["headline"]:
            key = (row["benchmark"], row["setting"], row["metric"])
            if key not in keys:
                keys.append(key)
    values = {name: {(r["benchmark"], r["setting"], r["metric"]): r["value"] for r in results["headline"]}
              for name, results in runs.items()}
    first = names[0]
    rows = []
    for key in keys:
        row = {"benchmark": key[0], "setting": key[1], "metric": key[2]}
        for name in names:
            row[name] = values[name].get(key)
            if name != first:
                a, b = values[first].get(key), values[name].get(key)
                row[f"Δ {name}"] = None if a is None or b is None else round(b - a, 2)
        rows.append(row)
    columns = ["benchmark", "setting", "metric", *names, *(f"Δ {n}" for n in names[1:])]
    warnings = differences(runs)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    table = markdown_table(rows, columns)
    claim_files(out, ["compare.md", "compare.json", "compare.png"], mark=True)
    bar_chart(out / "compare.png", [f"{k[0]} {k[2]}\n{k[1]}" for k in keys],
              {name: [values[name].get(k) for k in keys] for name in names}, "leaderboard", "score (%)")
    write_text(out / "compare.md", f"# Leaderboard (deltas against {first})\n\n{table}"
                                   + ("\n## Warnings\n\n" + "".join(f"- {w}\n" for w in warnings) if warnings else "")
                                   + "\n![leaderboard](compare.png)\n"
                                   + ("\nEvery sample, the runs' answers side by side and the samples whose outcome "
                                      "changed: [the sample viewer](view/index.html) (open it in a browser).\n"
                                      if view else ""))
    write_json(out / "compare.json", {"runs": names, "rows": rows, "warnings": warnings})
    return table


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m eval compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="suite output folders (or their results.json); the first is the baseline")
    parser.add_argument("--names", nargs="+", help="one row name per folder (default: folder names)")
    parser.add_argument("--out", required=True, help="folder for compare.md, compare.json, compare.png, view/")
    parser.add_argument("--no-view", action="store_true", help="do not write the per-sample viewer (OUT/view)")
    parser.add_argument("--images", help="the viewer's SPY-Bench images (default: the folder each suite records, "
                                         "when that lies inside it)")
    parser.add_argument("--geo-images", help="the viewer's GeoPrivacy images (default: the folder each suite "
                                             "records, when that lies inside it)")
    parser.add_argument("--spatialtrust-data", help="the viewer's SpatialTrust data file (default: the file each "
                                                    "suite records, when that lies inside it)")
    args = parser.parse_args(argv)
    print(compare(args.results, args.out, args.names, view=not args.no_view, images=args.images,
                  spatialtrust_data=args.spatialtrust_data, geo_images=args.geo_images), end="")
    return 0

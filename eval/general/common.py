"""What the three general benchmarks share: loading a Hub id or a local copy, and the resumable generation step.

A benchmark module (mmmu, ocrbench, mme) gives `load(source, limit) -> datasets.Dataset`,
`items(ds, source) -> list[dict]` (one JSON-ready record per sample, without images: this is what the run file
keeps next to the response) and `request(item, row) -> dict` (the Generator request, `row` holding the decoded
image columns). `generate` runs any Generator over them through the same resumable run file as SPY-Bench.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cli.errors import InputError
from store.runs import RunFile, iter_chunks

logger = logging.getLogger(__name__)


def load_source(source: str, splits: tuple[str, ...], hub_loader):
    """A local copy (`save_to_disk` directory, or parquet file(s)) when `source` exists on disk, else `hub_loader(source)`."""
    path = Path(source)
    if path.exists():
        return load_local(path, splits)
    try:
        return hub_loader(source)
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds (offline, no such repo, auth)
        raise InputError(source, None, None, f"cannot load from the Hugging Face Hub ({type(err).__name__}: {err})")


def load_local(path: Path, splits: tuple[str, ...]):
    """A `save_to_disk` Dataset / DatasetDict (the given splits, concatenated) or every parquet file under `path`."""
    import datasets

    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            names = [s for s in splits if s in ds]
            if not names:
                raise InputError(path, None, None, f"has splits {sorted(ds)}, none of {list(splits)}")
            ds = datasets.concatenate_datasets([ds[s] for s in names])
        return ds
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path] if path.suffix == ".parquet" else []
    if not files:
        raise InputError(path, None, None, "neither a save_to_disk directory nor parquet file(s)")
    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")


def load_test_split(source: str | None, hub_id: str, splits: tuple[str, ...], required, limit: int | None):
    """A single-split benchmark (OCRBench, MME): its Hub `test` split, or a local copy, checked and cut to `limit`."""
    import datasets

    source = source or hub_id
    ds = load_source(source, splits, lambda hub: datasets.load_dataset(hub, split="test"))
    check_columns(ds, required, source)
    return head(ds, limit)


def check_columns(ds, required, source) -> None:
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise InputError(source, None, missing[0], f"missing column (has {ds.column_names})")


def head(ds, limit: int | None):
    return ds if limit is None or limit >= len(ds) else ds.select(range(limit))


def check_unique(items: list[dict], source) -> None:
    seen = set()
    for index, item in enumerate(items):
        if item["id"] in seen:
            raise InputError(source, f"row {index}", "id", f"duplicate id {item['id']!r}")
        seen.add(item["id"])


def rgb(image):
    """Every image as RGB, as VLMEvalKit feeds them (MMMU has palette and RGBA PNGs; JPEG encoders need RGB)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def generate(bench, ds, items: list[dict], generator, out_path, chunk_size: int = 128) -> list[dict]:
    """Generate every not-yet-done item into the run file `out_path`; return the final records in item order.

    Images are decoded a chunk at a time (MME alone is over 2000 photos), and only for pending items, so a
    resumed run neither re-generates nor re-decodes finished samples.
    """
    from tqdm import tqdm

    from eval.backends import generate_run

    run = RunFile(out_path)
    wanted = {item["id"] for item in items}
    foreign = [i for i in (r["id"] for r in run.records()) if i not in wanted]
    if foreign:
        logger.warning(f"{out_path} holds {len(foreign)} ids not in this dataset (e.g. {foreign[0]!r}); they are kept")
    todo = [index for index, item in enumerate(items) if not run.is_done(item["id"])]
    image_columns = [c for c in ds.column_names if c in bench.IMAGE_COLUMNS]
    meta = {item["id"]: item for item in items}
    with tqdm(total=len(items), initial=len(items) - len(todo), desc=f"{bench.NAME} generate", unit="sample") as bar:
        for chunk in iter_chunks(todo, chunk_size):
            rows = ds.select(chunk).select_columns(image_columns)
            requests = [bench.request(items[index], row) for index, row in zip(chunk, rows)]
            generate_run(generator, requests, out_path, meta={r["id"]: meta[r["id"]] for r in requests}, progress=False)
            bar.update(len(chunk))
    return finalize(out_path, items)


def finalize(out_path, items: list[dict]) -> list[dict]:
    return RunFile(out_path).finalize([item["id"] for item in items])


def read_run(path, required: tuple[str, ...]) -> list[dict]:
    """The records of a finished run file; `response` may be null where generation failed for good."""
    from store.runs import read_jsonl

    return read_jsonl(path, required=("id", "response", *required))


def count_failed(records: list[dict]) -> int:
    return sum(1 for r in records if r.get("error") or r.get("response") is None)

"""data_prep.synthetic's `whole_pool` (the demo's training items list their category's whole scenario pool): the items
are otherwise the ones drawn without it, so data built without it (the study's) is unchanged."""

from data_prep import synthetic
from data_prep.categories import as_categories
from data_prep.spy_tune import sft_rows


def test_whole_pool_lists_the_pool_and_changes_nothing_else(tmp_path):
    cats = as_categories(None)
    one = synthetic.make_items("train", 1, 0, tmp_path / "one", image_size=16, categories=cats)
    pool = synthetic.make_items("train", 1, 0, tmp_path / "pool", image_size=16, categories=cats, whole_pool=True)
    pools = synthetic.scenario_pools(0, cats)
    assert len(one) == len(pool) == len(pools)
    for a, b in zip(one, pool):
        kinds = ("non_privacy_scenarios", "privacy_scenarios")
        assert {k: v for k, v in a.items() if k not in kinds} == {k: v for k, v in b.items() if k not in kinds}
        conflict, privacy = pools[a["label"]]
        assert [s["scenario"] for s in b["non_privacy_scenarios"]] == conflict
        assert [s["scenario"] for s in b["privacy_scenarios"]] == privacy
        for kind in kinds:  # the one drawn is in the pool
            assert len(a[kind]) <= 1 and all(s in b[kind] for s in a[kind])
        assert b["chosen_scenarios"] == a["privacy_scenarios"]  # the non-private instruction's privacy context: one
    for name in sorted(p.name for p in (tmp_path / "one" / "images" / "train").iterdir()):
        assert (tmp_path / "one" / "images" / "train" / name).read_bytes() == \
            (tmp_path / "pool" / "images" / "train" / name).read_bytes()
    # a category with two scenarios of each kind: 2 + 2 + 2 + 1 SFT cases instead of 2 + 1 + 1 + 1
    item = next(b for b in pool if len(b["non_privacy_scenarios"]) == 2 and len(b["privacy_scenarios"]) == 2)
    assert len(sft_rows(item, cats.label2text(), False, cats)) == 7


def test_items_without_whole_pool_are_the_ones_drawn_before_it(tmp_path):
    """The items drawn before `whole_pool` existed (sha256 of this call's JSON, computed on the generator of commit
    4b200a6): the study's data does not move."""
    import hashlib
    import json

    items = synthetic.make_items("train", 1, 0, tmp_path, image_size=16, absolute_per_label=3)
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
    assert digest == "3a7c76e3bad5056b198a90a4d38e92c0a325f852b909019f015a224f4d07e845"

"""The miniature alignment study (docs/study.md): SFT, DPO, NCA, NCA-P, GRPO and guided GRPO compared from one helpful
backbone, quick (`python -m study`) or tuned per method and budget (`python -m study --protocol tuned`;
`python -m study.tuned` for its tables, page, cross-machine check and time estimate).

The study sits above train: it may import cli, store, vlm, data_prep, losses, eval and train, and no room below it imports it
(tests/test_dependencies.py's MAY_IMPORT). Inside it, each file's opening comment says what it holds and may import;
methods, pins, text and selection are its ground floor, results and runs above them, protocol above those, the page
(verdict, tables, plots, publish) and estimate above protocol, and the two command lines (__main__, tuned) on top.
"""

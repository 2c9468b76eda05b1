"""The miniature alignment study (docs/study.md): SFT, DPO, NCA, NCA-P and GRPO compared from one helpful backbone,
quick (`python -m study`) or tuned per method and budget (`python -m study --protocol tuned`; `python -m study.tuned`
for its tables, page, cross-machine check and time estimate).

The study sits above train: it may import cli, store, vlm, data_prep, losses, eval and train, and nothing imports it
(tests/test_dependencies.py's MAY_IMPORT). Inside it, each file's opening comment says what it holds and may import;
pins, text, selection and results are its ground floor, runs above them, protocol above those, the page (verdict,
tables, plots, publish) and estimate above protocol, and the two command lines (__main__, tuned) on top.
"""

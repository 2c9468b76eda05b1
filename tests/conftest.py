"""Session fixtures shared by every test: the tiny offline models (Qwen2-VL, and one per supported family) and a
small synthetic SPY dataset."""

import os

# Never reach the network from a test, whoever runs pytest.
for key, value in {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(key, value)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-weight Qwen2-VL saved with save_pretrained (about 1 MB, 3 s to build)."""
    from train.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory, tiny_model_dir):
    """family -> its tiny random model directory, each built once per session (2-5 s each)."""
    from train.tiny_model import build_tiny_model

    built = {"qwen2_vl": tiny_model_dir}

    def get(family: str):
        if family not in built:
            built[family] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family=family)
        return built[family]

    return get


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory):
    """Synthetic SPY-Tune + SPY-Bench in the released formats: one train and one test item per category."""
    from data_prep.synthetic import build

    return build(tmp_path_factory.mktemp("synthetic-spy"), train_per_label=1, test_per_label=1)

"""Session fixtures shared by every test: the tiny offline models (Qwen2-VL, and one per supported family) and a
small synthetic SPY dataset."""

import os

# Never reach the network from a test, whoever runs pytest.
for key, value in {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
    # one OpenMP thread per test process: `make test` runs a worker per core (pytest-xdist), and two threads in each
    # would spin against the other worker's; it must be set before torch is imported
    "OMP_NUM_THREADS": "1",
}.items():
    os.environ.setdefault(key, value)
# This checkout first on the path of every command a test starts, as the tests that name it set it: one environment
# for tests/forked_python.py's preloaded interpreter instead of one with and one without it.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))

import pytest  # noqa: E402

# Modules whose module-scoped fixtures are expensive (vLLM engines and `vllm serve`, a trained checkpoint, Chromium, a
# built docs site): all their tests run on one worker, so each fixture is built once.
ONE_WORKER = {"test_vllm", "test_grpo", "test_grpo_vllm", "test_hardening_runtime", "test_viewer", "test_viewer_hardening",
              "test_docs_site", "test_docs"}
# Modules that share a session fixture: one worker for all of them (`demo_outputs`: one `make demo` per session).
SHARED = {"test_demo": "demo", "test_docs_run": "demo", "test_privacy_eval": "demo"}


def worker_group(nodeid: str) -> str | None:
    """The group whose tests share one pytest-xdist worker, from a test's id (None: any worker)."""
    module = os.path.splitext(os.path.basename(nodeid.split("::", 1)[0]))[0]
    return SHARED.get(module, module if module in ONE_WORKER else None)


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` (one process) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling with the groups above. `--dist loadgroup` reads them from an `xdist_group` mark that
    xdist 3.8 writes into `item._nodeid`, which pytest 9.2 no longer reads (the node id is `item._id`): every group
    was split over the workers and its fixtures built on each (`make demo` twice per run)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return worker_group(nodeid) or nodeid

    return GroupScheduling(config, log)


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


@pytest.fixture(scope="session")
def demo_outputs(tmp_path_factory):
    """`make demo`, as written, once per session in a folder that looks like a fresh clone (tests/docs_run.py):
    its outputs/demo, for tests/test_demo.py and the docs' blocks (tests/test_docs_run.py), which copy it."""
    import docs_run

    clone = docs_run.folder(tmp_path_factory.mktemp("demo") / "clone", None)
    result = docs_run.make(clone, "demo")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return clone / "outputs" / "demo"

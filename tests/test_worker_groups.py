"""tests/conftest.py's worker groups take effect: a grouped module's tests all run on one pytest-xdist worker (under
pytest 9.2 xdist's own `--dist loadgroup` marks were silently ignored, and `make demo` ran on both workers)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_grouped_module_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "suite.ONE_WORKER.add('test_grouped')\n"
        "pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler\n")
    body = "import os\n" + "".join(
        f"def test_{n}():\n    open('workers.txt', 'a').write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        for n in range(6))
    (tmp_path / "test_grouped.py").write_text(body)
    (tmp_path / "test_free.py").write_text("def test_x():\n    pass\n\ndef test_y():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                             "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers

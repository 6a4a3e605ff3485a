import os

import pytest
import torch
from hypothesis import settings

# CI runs the same examples every time (a property failure is then reproducible from the log); locally,
# hypothesis explores new examples on each run. INTERP_HYPOTHESIS_EXAMPLES raises the example count.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Two cores, shared: keep tests deterministic and small.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

UD_EWT_DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "ud-english-ewt",
                          "en_ewt-ud-dev.conllu")


@pytest.fixture(scope="session")
def ud_ewt_dev() -> str:
    """Path to the UD English EWT dev treebank; skips when it is not beside the project."""
    path = os.path.abspath(UD_EWT_DEV)
    if not os.path.isfile(path):
        pytest.skip(f"UD English EWT dev treebank not found at {path}")
    return path


@pytest.fixture
def one_thread():
    """One intra-op thread for tests made of many tiny ops (on two shared cores, two threads make them slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _private_results_cache(tmp_path_factory):
    """The dashboard's results cache goes to a temporary folder for the whole test session (never the user's
    ~/.cache/interp/dashboard), also for the Streamlit servers the browser tests start."""
    from interp.app.results_cache import CACHE_ENV

    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("dashboard-cache"))
    yield
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old

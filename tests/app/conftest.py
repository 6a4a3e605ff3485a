"""The dashboard's results cache goes to a temporary folder for the whole test session (never the user's
~/.cache/interp/dashboard), also for the Streamlit servers the browser tests start."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_results_cache(tmp_path_factory):
    from interp.app.results_cache import CACHE_ENV

    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("dashboard-cache"))
    yield
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old

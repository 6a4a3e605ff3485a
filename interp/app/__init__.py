"""The Streamlit dashboard, shipped inside the package so that a wheel install can run ``interp dashboard``.

``interp.app.dashboard`` is a Streamlit script (it draws the page when imported): start it with
``interp dashboard`` or ``streamlit run`` on :data:`DASHBOARD`. Importing this package imports nothing else.
"""

from pathlib import Path

#: The dashboard script's path, for ``streamlit run`` and for Streamlit's testing tools.
DASHBOARD = Path(__file__).resolve().parent / "dashboard.py"

#: Environment variable naming the one folder whose files the dashboard may read by path (none by default);
#: ``interp dashboard --files FOLDER`` sets it.
FILES_ENV = "INTERP_DASHBOARD_FILES"

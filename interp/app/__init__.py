"""The Streamlit dashboard, shipped inside the package so that a wheel install can run ``interp dashboard``.

``interp.app.dashboard`` is the Streamlit script (it draws the app when run): start it with ``interp dashboard`` or
``streamlit run`` on :data:`DASHBOARD`. The pages are the modules of :mod:`interp.app.views`, and the concerns they
share (serving files, the model picker, inputs, the disk cache, background jobs) have a module each; those import
without drawing anything. Importing this package imports nothing else.
"""

from pathlib import Path

#: The dashboard script's path, for ``streamlit run`` and for Streamlit's testing tools.
DASHBOARD = Path(__file__).resolve().parent / "dashboard.py"

#: Environment variable naming the one folder whose files the dashboard may read by path (none by default);
#: ``interp dashboard --files FOLDER`` sets it.
FILES_ENV = "INTERP_DASHBOARD_FILES"

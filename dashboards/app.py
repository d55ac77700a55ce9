"""flowtrial dashboard: the Streamlit entry point (``flowtrial dashboard --db PATH``).

Run directly with ``streamlit run dashboards/app.py -- --db study.db`` (flowtrial installed,
e.g. ``pip install -e '.[dashboard]'``); the database may also
come from ``FLOWTRIAL_DASHBOARD_DB`` (what ``flowtrial dashboard`` uses: a URL in argv would
show a PostgreSQL password in the process list). Pages live in ``dashboards/pages``; a session
sees them only past :func:`gate` (Host allow-list, password off loopback).
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from flowtrial.dashboards import access

PAGES = Path(__file__).resolve().parent / "pages"


def gate() -> None:
    """Stop here unless this session may see the study (:mod:`flowtrial.dashboards.access`)."""
    password, hosts = access.settings_from_env()
    if not access.host_allowed(dict(st.context.headers or {}), hosts):
        st.error("This dashboard is not served under this host name. Open it by this "
                 "machine's name or address, or start it with --allow-host NAME.")
        st.stop()
    if not password or st.session_state.get("flowtrial_authenticated"):
        return
    ip = st.context.ip_address  # None when Streamlit cannot tell: one shared budget then
    address = ip if isinstance(ip, str) and ip else "unknown"
    throttle = access.login_throttle()  # per client address, across sessions
    with st.form("flowtrial_login"):
        given = st.text_input("Dashboard password", type="password")
        if st.form_submit_button("Open the dashboard"):
            wait = throttle.wait_s(address)
            if wait > 0:
                st.error(f"Too many wrong passwords from this address: try again in "
                         f"{wait:.0f} s.")
                st.stop()
            if access.password_ok(given, password):
                st.session_state["flowtrial_authenticated"] = True
                st.rerun()
            throttle.failed(address)
            time.sleep(1.0)  # slows guessing down
            st.error("Wrong password.")
    st.stop()


def main() -> None:
    st.set_page_config(page_title="flowtrial", page_icon="⏱", layout="wide")
    gate()
    # Something on screen at once: the first run of a fresh server imports pandas, SQLAlchemy
    # and Altair for seconds, and the page stayed blank meanwhile.
    loading = st.empty()
    loading.caption("Loading the study…")
    from flowtrial.dashboards import data
    from flowtrial.dashboards.ui import db_from_args
    from flowtrial.study.errors import FlowtrialError

    db = db_from_args()
    if not db:
        loading.empty()
        st.error("No study database: start with `flowtrial dashboard --db PATH`.")
        st.stop()
    try:
        url = data.database(str(db)).url
    except FlowtrialError as exc:
        loading.empty()
        st.error(str(exc))
        st.stop()
    st.session_state["flowtrial_db_url"] = url
    nav = st.navigation({
        "Trial": [
            st.Page(PAGES / "overview.py", title="Study overview", icon="📋", default=True),
            st.Page(PAGES / "timeline.py", title="Flow timeline", icon="🕒"),
            st.Page(PAGES / "arms.py", title="Arms", icon="⚖️"),
            st.Page(PAGES / "threshold.py", title="Flow threshold", icon="📈"),
        ],
        "Team": [st.Page(PAGES / "team.py", title="Team view", icon="👥")],
    })
    # The analysis-layer work of large studies (compute.py) starts when a page needs it,
    # after that page's SQL parts: a background thread shares the GIL with page rendering.
    loading.empty()
    nav.run()


# Streamlit runs this script as ``__main__``; the personal fit's spawned worker
# (compute.py) re-runs the main script as ``__mp_main__`` and must only import it.
if __name__ == "__main__":
    main()

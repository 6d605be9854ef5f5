"""nbgrader's configuration inside each user's server on the hub (jupyterhub_config.py points
JUPYTER_CONFIG_PATH here): the course's own nbgrader_config.py (course id, exchange, timeouts)."""

import os

c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
load_subconfig(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "nbgrader_config.py"))  # noqa: F821

# On a test hub every server runs as one system user; the hub passes each student's hub name.
if os.environ.get("ATTENTION_STUDENT_ID"):
    c.CourseDirectory.student_id = os.environ["ATTENTION_STUDENT_ID"]

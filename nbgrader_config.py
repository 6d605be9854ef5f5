"""nbgrader's configuration for the course. nbgrader reads it from the folder its commands run in:
run them from the course's folder (as `make release-assignment`, `make collect` and `make grade` do).

One assignment per notebook, named after it (00_gpu_basics). Its source is written from notebooks/
by scripts/student_copies.py, which makes the nbgrader metadata from the course's own markers: each
exercise an autograded answer cell, each check cell a read-only test cell, full points only for
the verdict ok.
"""

import os

c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "attention-course"
# source/, release/, submitted/, autograded/, feedback/ and the gradebook; not committed.
c.CourseDirectory.root = os.environ.get("ATTENTION_COURSE_DIR", os.path.join(here, "grading"))
# Where release, fetch, submit and collect meet: a folder every user of the machine or hub can
# write (see classroom/README.md). nbgrader's own default, unless ATTENTION_EXCHANGE names another.
c.Exchange.root = os.environ.get("ATTENTION_EXCHANGE", "/srv/nbgrader/exchange")
# A notebook's slowest cells (a check that race-checks every case, the kernel report's first
# compile) take tens of seconds on the simulator; nbgrader's default allows 30 s per cell.
c.Execute.timeout = 600

"""The grader's own code (scripts/, beside grade.py: instructor tooling, not the library students
install and import): what of a submission runs (allowlist), the graded notebook rebuilt from the
course's cells (rebuild), the sandbox it runs in (sandbox) and what runs inside it (runner)."""

"""nbval compares every output of a fresh run with the committed one where the notebooks were committed:
on the simulator. On a GPU the notebooks run at full size and print other figures, so there only the
check cells' verdicts (the cells tagged nbval-check-output) are compared."""

import attention_lib


def pytest_configure(config):
    if not attention_lib.ON_SIMULATOR and getattr(config.option, "nbval", False):
        config.option.nbval_lax = True

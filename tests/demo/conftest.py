from tests.faults.support import receiver, stack  # noqa: F401  (fixtures)
